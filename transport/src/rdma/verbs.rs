//! Verbs: protection domain, completion channel and queues, memory regions, posting and
//! polling work on an RC queue pair.
//!
//! Thin wrappers. [`Device`] holds what every connection on one RDMA device shares (one
//! completion channel); [`Pd`], [`Cq`], [`Mr`] and [`Region`] are per connection and released
//! on drop (the QP itself is the CM id's, [`super::CmId::destroy_qp`]). A protection domain per
//! connection keeps a remote key to its own queue pair: the device checks that a remote
//! write's memory region and the queue pair it arrives on share a PD.

use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr;

use libc::c_void;
use rdma_sys::{
    ibv_access_flags, ibv_comp_channel, ibv_context, ibv_cq, ibv_mr, ibv_pd, ibv_qp, ibv_qp_cap,
    ibv_qp_init_attr, ibv_qp_type, ibv_recv_wr, ibv_send_flags, ibv_send_wr, ibv_sge,
    ibv_transport_type, ibv_wc, ibv_wr_opcode, imm_data_invalidated_rkey_union_t, rdma_t, wr_t,
};

use super::Lib;

/// A device context librdmacm opened (it stays open for the life of the process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Context(std::ptr::NonNull<ibv_context>);

impl Context {
    /// Wraps a context pointer librdmacm gave (an id's `verbs`, `rdma_get_devices`).
    pub(super) fn new(ptr: *mut ibv_context) -> Option<Context> {
        std::ptr::NonNull::new(ptr).map(Context)
    }

    fn ptr(self) -> *mut ibv_context {
        self.0.as_ptr()
    }

    /// True for an iWARP device (whose rdma_cm port space is the kernel's TCP port space).
    pub fn is_iwarp(self) -> bool {
        // SAFETY: a live context's `device` points to its live ibv_device.
        let device = unsafe { (*self.ptr()).device };
        if device.is_null() {
            return false;
        }
        // SAFETY: as above.
        unsafe { (*device).transport_type == ibv_transport_type::IBV_TRANSPORT_IWARP }
    }

    /// The device's name (for logs).
    pub fn name(self) -> String {
        // SAFETY: a live context's device has a NUL-terminated `name` array.
        unsafe {
            let device = (*self.ptr()).device;
            if device.is_null() {
                return String::from("?");
            }
            std::ffi::CStr::from_ptr((*device).name.as_ptr())
                .to_string_lossy()
                .into_owned()
        }
    }

    /// The fds the context keeps open (command and async event fds).
    pub fn fds(self) -> [RawFd; 2] {
        // SAFETY: a live context; plain int fields.
        unsafe { [(*self.ptr()).cmd_fd, (*self.ptr()).async_fd] }
    }
}

/// The completion channel shared by every connection on one device.
pub struct Device {
    lib: &'static Lib,
    ctx: Context,
    channel: *mut ibv_comp_channel,
}

impl Device {
    /// A completion channel (non-blocking fd) for `ctx`.
    pub fn open(lib: &'static Lib, ctx: Context) -> io::Result<Device> {
        // SAFETY: `ctx` is a live context (librdmacm's, open for the life of the process).
        let channel = unsafe { (lib.fns.create_comp_channel)(ctx.ptr()) };
        if channel.is_null() {
            return Err(io::Error::last_os_error());
        }
        let dev = Device { lib, ctx, channel };
        crate::fd::set_nonblocking(dev.channel_fd())?;
        Ok(dev)
    }

    /// The device's context (the key of the engine's device map).
    pub fn context(&self) -> Context {
        self.ctx
    }

    /// A protection domain of its own (one per connection).
    pub fn alloc_pd(&self) -> io::Result<Pd> {
        // SAFETY: `ctx` is a live context (librdmacm's, open for the life of the process).
        let pd = unsafe { (self.lib.fns.alloc_pd)(self.ctx.ptr()) };
        if pd.is_null() {
            return Err(io::Error::last_os_error());
        }
        Ok(Pd { lib: self.lib, pd })
    }

    /// The completion channel's fd.
    pub fn channel_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel is live until drop; its fd stays open as long.
        unsafe { BorrowedFd::borrow_raw((*self.channel).fd) }
    }

    /// A new CQ of `entries` on this device's channel, with `token` as its context.
    pub fn create_cq(&self, entries: i32, token: u64) -> io::Result<Cq> {
        // SAFETY: `ctx` and `channel` are live; the context is an opaque number.
        let cq = unsafe {
            (self.lib.fns.create_cq)(
                self.ctx.ptr(),
                entries,
                token as usize as *mut c_void,
                self.channel,
                0,
            )
        };
        if cq.is_null() {
            return Err(io::Error::last_os_error());
        }
        Ok(Cq {
            lib: self.lib,
            ptr: cq,
            unacked: 0,
            armed: false,
        })
    }

    /// The next completion event: the token of the CQ it is for (its unacked count goes up by
    /// one: see [`Cq::note_event`]), or None when none is waiting.
    pub fn next_cq_event(&self) -> io::Result<Option<u64>> {
        let mut cq: *mut ibv_cq = ptr::null_mut();
        let mut ctx: *mut c_void = ptr::null_mut();
        // SAFETY: `channel` is live; both out pointers are valid.
        let rc = unsafe { (self.lib.fns.get_cq_event)(self.channel, &mut cq, &mut ctx) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(ctx as usize as u64))
    }
}

/// A protection domain: the memory regions and the queue pair of one connection.
pub struct Pd {
    lib: &'static Lib,
    pd: *mut ibv_pd,
}

// SAFETY: a PD handle is a pointer to the provider's object; it is only used by the engine
// thread (registration, QP creation) and freed once, on drop.
unsafe impl Send for Pd {}

/// What the peer may do to a registered range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Only this side's device writes it (receives, the send ring the device reads).
    Local,
    /// The peer's RDMA writes land in it (the receive ring, and nothing else).
    RemoteWrite,
}

impl Pd {
    pub(super) fn raw(&self) -> *mut ibv_pd {
        self.pd
    }

    /// Registers `len` bytes of `region` from `off` with `access`.
    pub fn register(
        &self,
        region: &Region,
        off: usize,
        len: usize,
        access: Access,
    ) -> io::Result<Mr> {
        let start = region.check(off, len)?;
        let flags = match access {
            Access::Local => ibv_access_flags::IBV_ACCESS_LOCAL_WRITE,
            // A remotely writable region must be locally writable too (verbs' rule).
            Access::RemoteWrite => {
                ibv_access_flags::IBV_ACCESS_LOCAL_WRITE | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            }
        }
        .0;
        // SAFETY: `start..start+len` is inside the region's live mapping (checked), which
        // outlives the MR (every owner drops the MR first); `pd` is live.
        let mr = unsafe {
            (self.lib.fns.reg_mr)(
                self.pd,
                start.cast(),
                len,
                i32::try_from(flags).unwrap_or(1),
            )
        };
        if mr.is_null() {
            return Err(io::Error::last_os_error());
        }
        Ok(Mr {
            lib: self.lib,
            ptr: mr,
        })
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: every MR and the QP on this PD are gone (their owners drop them first: see
        // `Rdma` and `Buffers` in the engine).
        unsafe { (self.lib.fns.dealloc_pd)(self.pd) };
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: every CQ on the channel is gone (the engine drops devices last).
        unsafe { (self.lib.fns.destroy_comp_channel)(self.channel) };
    }
}

/// A completion queue.
pub struct Cq {
    lib: &'static Lib,
    ptr: *mut ibv_cq,
    unacked: u32,
    /// Armed, and no event taken since: the next completion signals the channel.
    armed: bool,
}

/// One work completion, copied out of the CQ.
#[derive(Debug, Clone, Copy, Default)]
pub struct Wc {
    /// The work request's id.
    pub wr_id: u64,
    /// `IBV_WC_SUCCESS` (0) or an error status.
    pub status: u32,
    /// `ibv_wc_opcode`.
    pub opcode: u32,
    /// Bytes received (receive completions).
    pub byte_len: u32,
    /// Immediate data, host order (when `has_imm`).
    pub imm: u32,
    /// The completion carries immediate data.
    pub has_imm: bool,
}

impl Cq {
    /// An event was taken since the last arm (or it was never armed): the next completion
    /// signals nothing until [`Cq::arm`].
    pub fn arm_needed(&self) -> bool {
        !self.armed
    }

    /// Arms the CQ to signal the channel at the next completion; nothing to do while it is
    /// armed (no event was taken since the last arm: the next completion still signals). rxe
    /// arms in the kernel, so an arm at every look cost the engine a system call per wake-up.
    pub fn arm(&mut self) -> io::Result<()> {
        if self.armed {
            return Ok(());
        }
        // SAFETY: `ptr` is a live CQ.
        let rc = unsafe { rdma_sys::ibv_req_notify_cq(self.ptr, 0) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        self.armed = true;
        Ok(())
    }

    /// Counts one completion event taken for this CQ ([`Device::next_cq_event`]); acked in
    /// batches, and all before destroy.
    pub fn note_event(&mut self) {
        // The event disarmed the CQ.
        self.armed = false;
        self.unacked += 1;
        if self.unacked >= 64 {
            self.ack();
        }
    }

    fn ack(&mut self) {
        if self.unacked > 0 {
            // SAFETY: `ptr` is live and `unacked` events were taken for it.
            unsafe { (self.lib.fns.ack_cq_events)(self.ptr, self.unacked) };
            self.unacked = 0;
        }
    }

    /// Polls up to `out.len()` completions; returns how many were written.
    pub fn poll(&self, out: &mut [Wc]) -> io::Result<usize> {
        const BATCH: usize = 32;
        // SAFETY: ibv_wc is plain data; all-zero is a valid value.
        let mut raw: [ibv_wc; BATCH] = unsafe { std::mem::zeroed() };
        let want = out.len().min(BATCH);
        // SAFETY: `raw` has room for `want` entries; `ptr` is a live CQ.
        let n = unsafe { rdma_sys::ibv_poll_cq(self.ptr, want as i32, raw.as_mut_ptr()) };
        if n < 0 {
            return Err(io::Error::other("ibv_poll_cq failed"));
        }
        let n = usize::try_from(n).unwrap_or(0);
        for (dst, src) in out.iter_mut().zip(raw.iter().take(n)) {
            let has_imm = src.wc_flags & rdma_sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
            *dst = Wc {
                wr_id: src.wr_id,
                status: src.status,
                opcode: src.opcode,
                byte_len: src.byte_len,
                imm: if has_imm {
                    // SAFETY: the union is plain data (a u32 either way); read as the
                    // immediate only when the flag says it is one.
                    u32::from_be(unsafe { src.imm_data_invalidated_rkey_union.imm_data })
                } else {
                    0
                },
                has_imm,
            };
        }
        Ok(n)
    }

    fn raw(&self) -> *mut ibv_cq {
        self.ptr
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        self.ack();
        // SAFETY: the QP using it was destroyed before (the owner's field order ensures it);
        // every event taken for it is acked above.
        unsafe { (self.lib.fns.destroy_cq)(self.ptr) };
    }
}

/// QP init attributes for an RC QP on `cq` (send and receive).
pub(super) fn rc_qp_attr(cq: &Cq, send_wr: u32, recv_wr: u32, inline: u32) -> ibv_qp_init_attr {
    // SAFETY: ibv_qp_init_attr is plain data; all-zero is a valid starting value.
    let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    attr.send_cq = cq.raw();
    attr.recv_cq = cq.raw();
    attr.qp_type = ibv_qp_type::IBV_QPT_RC;
    attr.sq_sig_all = 0;
    attr.cap = ibv_qp_cap {
        max_send_wr: send_wr,
        max_recv_wr: recv_wr,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: inline,
    };
    attr
}

/// A memory registration.
pub struct Mr {
    lib: &'static Lib,
    ptr: *mut ibv_mr,
}

impl Mr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: `ptr` is a live MR.
        unsafe { (*self.ptr).lkey }
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: `ptr` is a live MR.
        unsafe { (*self.ptr).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: `ptr` is live; no work request using it is outstanding (the QP is destroyed
        // first).
        unsafe { (self.lib.fns.dereg_mr)(self.ptr) };
    }
}

/// Page-aligned anonymous memory for one connection's buffers (its own mapping, so
/// `ibv_fork_init`'s `MADV_DONTFORK` never touches the program's heap).
///
/// The RDMA device reads and writes it behind our back, so no Rust reference to its bytes is
/// ever made: every access is a copy or a syscall by raw pointer, bounds-checked here.
pub struct Region {
    ptr: *mut c_void,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by the value, and every access is a bounds-checked
// copy or syscall by raw pointer, never a Rust reference to its bytes; which bytes a thread may
// touch is the stream's business (the engine thread and, for direct reads
// ([`crate::engine::Reader`]), an app thread under the receive state's lock).
unsafe impl Send for Region {}
// SAFETY: as for Send: shared access is only ever copies by raw pointer.
unsafe impl Sync for Region {}

impl Region {
    /// Maps `len` bytes (rounded up to pages), zeroed.
    pub fn new(len: usize) -> io::Result<Region> {
        let page = 4096;
        let len = len.div_ceil(page) * page;
        // SAFETY: an anonymous private mapping; no file, no fixed address.
        let ptr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Region { ptr, len })
    }

    /// Mapped bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty mapping (never: `new` maps at least a page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of byte `off` as the device sees it.
    pub fn addr(&self, off: usize) -> u64 {
        self.ptr as u64 + off as u64
    }

    fn check(&self, off: usize, len: usize) -> io::Result<*mut u8> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.ptr.cast::<u8>().wrapping_add(off)),
            _ => Err(io::Error::from_raw_os_error(libc::EFAULT)),
        }
    }

    /// Copies `src` to `off`.
    pub fn store(&self, off: usize, src: &[u8]) -> io::Result<()> {
        let dst = self.check(off, src.len())?;
        // SAFETY: `dst..dst+len` is inside the mapping (checked); `src` is a distinct Rust
        // slice.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// Writes zeros over `len` bytes from `off` (a kept region's receive ring, before another
    /// peer writes there: it holds none of the last peer's bytes).
    pub fn zero(&self, off: usize, len: usize) -> io::Result<()> {
        let dst = self.check(off, len)?;
        // SAFETY: `dst..dst+len` is inside the mapping (checked); no device writes it now (the
        // caller's QP is gone and the next one does not exist yet).
        unsafe { ptr::write_bytes(dst, 0, len) };
        Ok(())
    }

    /// Gives the pages of `len` bytes from `off` (page-aligned) back to the kernel: they read
    /// as zeros and take no memory until touched again. Only for a range no registration
    /// covers any more (a busy ring after its stream moved back to its start ring).
    pub fn discard(&self, off: usize, len: usize) -> io::Result<()> {
        let start = self.check(off, len)?;
        if !off.is_multiple_of(4096) || !len.is_multiple_of(4096) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: a page-aligned range inside our own anonymous mapping (checked); no device
        // and no registration uses it (the caller's), and Rust holds no reference into it
        // (every access copies by raw pointer).
        let rc = unsafe { libc::madvise(start.cast(), len, libc::MADV_DONTNEED) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Copies `dst.len()` bytes from `off`.
    pub fn load(&self, off: usize, dst: &mut [u8]) -> io::Result<()> {
        let src = self.check(off, dst.len())?;
        // SAFETY: `src..src+len` is inside the mapping (checked).
        unsafe { ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// `read(fd)` into `off..off+len`; the byte count (0: EOF).
    pub fn read_from(&self, fd: RawFd, off: usize, len: usize) -> io::Result<usize> {
        let dst = self.check(off, len)?;
        // SAFETY: the range is inside the mapping (checked); the kernel writes at most `len`
        // bytes there.
        let n = unsafe { libc::read(fd, dst.cast(), len) };
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    }

    /// `send(fd, MSG_NOSIGNAL)` of `off..off+len` (a closed peer gives EPIPE, not SIGPIPE).
    pub fn send_to(&self, fd: RawFd, off: usize, len: usize) -> io::Result<usize> {
        let src = self.check(off, len)?;
        // SAFETY: the range is inside the mapping (checked); the kernel reads at most `len`
        // bytes.
        let n = unsafe { libc::send(fd, src.cast(), len, libc::MSG_NOSIGNAL) };
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    }

    /// `send(fd, MSG_OOB | MSG_NOSIGNAL)` of the byte at `off`: TCP's urgent byte, which an
    /// `AF_UNIX` stream socket carries with TCP's semantics (`CONFIG_AF_UNIX_OOB`).
    pub fn send_urgent_to(&self, fd: RawFd, off: usize) -> io::Result<usize> {
        let src = self.check(off, 1)?;
        // SAFETY: the byte is inside the mapping (checked); the kernel reads at most 1 byte.
        let n = unsafe { libc::send(fd, src.cast(), 1, libc::MSG_OOB | libc::MSG_NOSIGNAL) };
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    }
}

/// What the reading end of the stream socket `fd` (our end of a socketpair) has not read yet:
/// `SIOCOUTQ`, which for `AF_UNIX` counts the unread buffers' size (more than their bytes), so
/// only "zero: everything written was read" is exact. Here, beside [`Region::send_to`], because
/// this module is the crate's one place for raw calls.
pub fn unread_by_peer(fd: RawFd) -> io::Result<usize> {
    let mut queued: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int through the pointer, which points at `queued`.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut queued) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(queued).unwrap_or(0))
}

/// Linux's `SIOCATMARK` (`asm-generic/sockios.h`; the libc crate has it for Apple only).
pub const SIOCATMARK: libc::c_ulong = 0x8905;

/// Whether the next byte to read from stream socket `fd` is its urgent byte (`SIOCATMARK`).
/// Here, beside [`unread_by_peer`], as a raw call.
pub fn at_mark(fd: RawFd) -> io::Result<bool> {
    let mut answer: libc::c_int = 0;
    // SAFETY: SIOCATMARK writes one int through the pointer, which points at `answer`.
    let rc = unsafe { libc::ioctl(fd, SIOCATMARK, &mut answer) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(answer != 0)
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours and its MR is gone (the owner drops the MR first).
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// Posting work on a connected RC QP.
#[derive(Clone, Copy)]
pub struct Qp {
    ptr: *mut ibv_qp,
}

// SAFETY: a QP handle is a pointer to the provider's QP; libibverbs' post calls are
// thread-safe (each provider serialises its queues), the stream posts sends under one lock
// (`engine::tx`), and the QP is destroyed only by the engine thread after it stopped every
// other poster under that lock.
unsafe impl Send for Qp {}
// SAFETY: as for Send.
unsafe impl Sync for Qp {}

/// One local buffer for a work request.
#[derive(Debug, Clone, Copy)]
pub struct Local {
    /// Address (from [`Region::addr`]).
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// The MR's lkey.
    pub lkey: u32,
}

impl Qp {
    /// The CM id's QP.
    pub(super) fn new(ptr: *mut ibv_qp) -> Option<Qp> {
        (!ptr.is_null()).then_some(Qp { ptr })
    }

    fn post(&self, wr: &mut ibv_send_wr) -> io::Result<()> {
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: `ptr` is a live QP; `wr` and its sge are valid for the call (the provider
        // copies them into the send queue).
        let rc = unsafe { rdma_sys::ibv_post_send(self.ptr, wr, &mut bad) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }

    fn send_wr(
        wr_id: u64,
        sge: &mut ibv_sge,
        opcode: u32,
        imm: Option<u32>,
        signaled: bool,
    ) -> ibv_send_wr {
        // SAFETY: ibv_send_wr is plain data; all-zero is a valid starting value.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.next = ptr::null_mut();
        wr.num_sge = i32::from(sge.length > 0);
        wr.sg_list = if sge.length > 0 { sge } else { ptr::null_mut() };
        wr.opcode = opcode;
        if signaled {
            wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if let Some(imm) = imm {
            wr.imm_data_invalidated_rkey_union = imm_data_invalidated_rkey_union_t {
                imm_data: imm.to_be(),
            };
        }
        wr
    }

    /// RDMA WRITE WITH IMMEDIATE of `local` to `remote_addr` (`rkey`); a completion only when
    /// `signaled` (or on an error), as for every send-side request here.
    #[allow(clippy::too_many_arguments)]
    pub fn write_imm(
        &self,
        wr_id: u64,
        local: Local,
        remote_addr: u64,
        rkey: u32,
        imm: u32,
        signaled: bool,
    ) -> io::Result<()> {
        let mut sge = ibv_sge {
            addr: local.addr,
            length: local.len,
            lkey: local.lkey,
        };
        let mut wr = Qp::send_wr(
            wr_id,
            &mut sge,
            ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
            Some(imm),
            signaled,
        );
        wr.wr = wr_t {
            rdma: rdma_t { remote_addr, rkey },
        };
        self.post(&mut wr)
    }

    /// A zero-length RDMA WRITE (no completion at the peer), signaled: a liveness probe.
    pub fn write_probe(&self, wr_id: u64, remote_addr: u64, rkey: u32) -> io::Result<()> {
        let mut sge = ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        };
        let mut wr = Qp::send_wr(
            wr_id,
            &mut sge,
            ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            None,
            true,
        );
        wr.wr = wr_t {
            rdma: rdma_t { remote_addr, rkey },
        };
        self.post(&mut wr)
    }

    /// SEND of `local`; a completion only when `signaled` (or on an error).
    pub fn send(&self, wr_id: u64, local: Local, signaled: bool) -> io::Result<()> {
        let mut sge = ibv_sge {
            addr: local.addr,
            length: local.len,
            lkey: local.lkey,
        };
        let mut wr = Qp::send_wr(wr_id, &mut sge, ibv_wr_opcode::IBV_WR_SEND, None, signaled);
        self.post(&mut wr)
    }

    /// A receive into `local`.
    pub fn recv(&self, wr_id: u64, local: Local) -> io::Result<()> {
        let mut sge = ibv_sge {
            addr: local.addr,
            length: local.len,
            lkey: local.lkey,
        };
        let mut wr = ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: `ptr` is a live QP; `wr` and `sge` are valid for the call.
        let rc = unsafe { rdma_sys::ibv_post_recv(self.ptr, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }
}

/// `ibv_fork_init` when the kernel does not make registered memory copy-on-fork safe by
/// itself. Ok(true): fork-safe (by the kernel or by `ibv_fork_init`); Ok(false): not safe.
pub fn ensure_fork_safe(lib: &'static Lib) -> bool {
    if let Some(is_init) = lib.fns.is_fork_initialized {
        // SAFETY: no arguments.
        let status = unsafe { is_init() };
        if status == rdma_sys::IBV_FORK_UNNEEDED || status == rdma_sys::IBV_FORK_ENABLED {
            return true;
        }
    }
    // SAFETY: no arguments; called before this process registers any memory.
    unsafe { (lib.fns.fork_init)() == 0 }
}
