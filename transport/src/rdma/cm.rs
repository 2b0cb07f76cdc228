//! The connection manager: event channel, ids, events, with private data.
//!
//! Thin wrappers, one per call. Ownership: an [`EventChannel`] is destroyed on drop; a
//! [`CmId`] is a plain handle whose owner calls [`CmId::destroy`] exactly once (after acking
//! every event of it: `rdma_destroy_id` waits for that); a [`CmEvent`] is acked on drop.

use std::io;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::ptr;

use libc::c_int;
use rdma_sys::{
    ibv_context, rdma_cm_event, rdma_cm_event_type, rdma_cm_id, rdma_conn_param,
    rdma_event_channel, rdma_port_space,
};

use super::Lib;
use super::verbs::{Context, Cq, Pd, Qp, rc_qp_attr};
use crate::sockaddr::RawSockAddr;

/// `RDMA_OPTION_ID` (rdma_cma.h).
const RDMA_OPTION_ID: c_int = 0;
/// `RDMA_OPTION_ID_AFONLY`: int, like `IPV6_V6ONLY`.
const RDMA_OPTION_ID_AFONLY: c_int = 2;
/// `RDMA_OPTION_ID_ACK_TIMEOUT`: u8, the QP's local ACK timeout exponent.
const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
/// Most private data a connect request carries on RC (IB CM REQ minus rdma_cm's header).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// Most private data an accept carries (REP minus the header).
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;
/// Most private data a reject carries.
pub const MAX_REJECT_PRIVATE_DATA: usize = 148;

fn cvt(ret: c_int) -> io::Result<()> {
    if ret == 0 {
        Ok(())
    } else if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        // A few verbs return a positive errno instead of -1/errno.
        Err(io::Error::from_raw_os_error(ret))
    }
}

/// An `rdma_event_channel`: every id of the engine reports on one; its fd is pollable.
pub struct EventChannel {
    lib: &'static Lib,
    ptr: *mut rdma_event_channel,
}

impl EventChannel {
    /// `rdma_create_event_channel`, with its fd switched to non-blocking.
    pub fn new(lib: &'static Lib) -> io::Result<EventChannel> {
        // SAFETY: no arguments; a null return sets errno.
        let ptr = unsafe { (lib.fns.create_event_channel)() };
        if ptr.is_null() {
            return Err(io::Error::last_os_error());
        }
        let channel = EventChannel { lib, ptr };
        crate::fd::set_nonblocking(channel.fd())?;
        Ok(channel)
    }

    /// The channel's fd (owned by the channel).
    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: `ptr` is a live channel; its `fd` stays open until the channel is destroyed,
        // which outlives the borrow.
        unsafe { BorrowedFd::borrow_raw((*self.ptr).fd) }
    }

    /// The next event, or None when there is none (the fd is non-blocking).
    pub fn next_event(&self) -> io::Result<Option<CmEvent>> {
        let mut event: *mut rdma_cm_event = ptr::null_mut();
        // SAFETY: `ptr` is a live channel; `event` is a valid out pointer.
        let rc = unsafe { (self.lib.fns.get_cm_event)(self.ptr, &mut event) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(CmEvent {
            lib: self.lib,
            ptr: event,
        }))
    }

    /// A new id reporting on this channel, with `token` as its context.
    pub fn create_id(&self, token: u64, ps: PortSpace) -> io::Result<CmId> {
        let mut id: *mut rdma_cm_id = ptr::null_mut();
        // SAFETY: `ptr` is a live channel; `id` a valid out pointer; the context is an opaque
        // number librdmacm only hands back.
        let rc = unsafe {
            (self.lib.fns.create_id)(self.ptr, &mut id, token as usize as *mut _, ps.raw())
        };
        cvt(rc)?;
        Ok(CmId {
            lib: self.lib,
            ptr: id,
        })
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: `ptr` is live and every id on it was destroyed before (the engine destroys
        // its ids first); the channel is not used after this.
        unsafe { (self.lib.fns.destroy_event_channel)(self.ptr) };
    }
}

/// The rdma_cm port space of an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortSpace {
    /// `RDMA_PS_IB`: RC connections addressed by IP, apart from rsocket's and most RDMA
    /// programs' `RDMA_PS_TCP`.
    Ib,
    /// `RDMA_PS_TCP`.
    Tcp,
}

impl PortSpace {
    fn raw(self) -> rdma_port_space::Type {
        match self {
            PortSpace::Ib => rdma_port_space::RDMA_PS_IB,
            PortSpace::Tcp => rdma_port_space::RDMA_PS_TCP,
        }
    }
}

/// An `rdma_cm_id`. A plain handle (`Copy`): its owner calls [`CmId::destroy`] once.
#[derive(Clone, Copy)]
pub struct CmId {
    lib: &'static Lib,
    ptr: *mut rdma_cm_id,
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CmId({:p})", self.ptr)
    }
}

/// What a connect or accept carries besides the QP.
#[derive(Debug, Clone, Copy)]
pub struct ConnSettings<'a> {
    /// Private data (at most [`MAX_CONNECT_PRIVATE_DATA`] / [`MAX_ACCEPT_PRIVATE_DATA`]).
    pub private_data: &'a [u8],
    /// Transport retries (`retry_count`, at most 7).
    pub retry_count: u8,
    /// Receiver-not-ready retries (7: forever).
    pub rnr_retry_count: u8,
}

impl CmId {
    /// The token given at creation (an incoming id has its listener's until
    /// [`CmId::set_token`]).
    pub fn token(&self) -> u64 {
        // SAFETY: `ptr` is a live id; `context` is a plain pointer-sized field.
        unsafe { (*self.ptr).context as usize as u64 }
    }

    /// Replaces the id's context with `token`.
    pub fn set_token(&self, token: u64) {
        // SAFETY: `ptr` is a live id; `context` belongs to the user (librdmacm copies it into
        // events of this id only).
        unsafe { (*self.ptr).context = token as usize as *mut _ };
    }

    /// The device the id is bound to (none before address resolution).
    pub fn verbs(&self) -> Option<Context> {
        // SAFETY: `ptr` is a live id.
        Context::new(unsafe { (*self.ptr).verbs })
    }

    /// The QP made by [`CmId::create_qp`].
    pub fn qp(&self) -> Option<Qp> {
        // SAFETY: `ptr` is a live id.
        Qp::new(unsafe { (*self.ptr).qp })
    }

    /// The local address of the id (an incoming id: the address the peer connected to).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: `ptr` is a live id; `route.addr.src_addr_union` is a sockaddr_storage-sized
        // union of plain bytes.
        let storage = unsafe { ptr::addr_of!((*self.ptr).route.addr.src_addr_union) };
        sockaddr_at(storage.cast())
    }

    /// The peer address of the id.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as in `local_addr`.
        let storage = unsafe { ptr::addr_of!((*self.ptr).route.addr.dst_addr_union) };
        sockaddr_at(storage.cast())
    }

    /// `rdma_bind_addr`.
    pub fn bind(&self, addr: SocketAddr) -> io::Result<()> {
        let mut raw = RawSockAddr::from_addr(addr);
        // SAFETY: `raw` holds a whole sockaddr of its family; librdmacm copies it.
        cvt(unsafe { (self.lib.fns.bind_addr)(self.ptr, raw.as_mut_ptr()) })
    }

    /// `rdma_listen`.
    pub fn listen(&self, backlog: i32) -> io::Result<()> {
        // SAFETY: `ptr` is a live, bound id.
        cvt(unsafe { (self.lib.fns.listen)(self.ptr, backlog) })
    }

    /// `rdma_resolve_addr` from `src` (None: any) to `dst`; completes with an event.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout_ms: i32,
    ) -> io::Result<()> {
        let mut raw_src = src.map(RawSockAddr::from_addr);
        let mut raw_dst = RawSockAddr::from_addr(dst);
        let src_ptr = raw_src
            .as_mut()
            .map_or(ptr::null_mut(), RawSockAddr::as_mut_ptr);
        // SAFETY: both addresses are whole sockaddrs (or null for any source), copied by the
        // call.
        cvt(unsafe {
            (self.lib.fns.resolve_addr)(self.ptr, src_ptr, raw_dst.as_mut_ptr(), timeout_ms)
        })
    }

    /// `rdma_resolve_route`; completes with an event.
    pub fn resolve_route(&self, timeout_ms: i32) -> io::Result<()> {
        // SAFETY: `ptr` is a live id with a resolved address.
        cvt(unsafe { (self.lib.fns.resolve_route)(self.ptr, timeout_ms) })
    }

    /// `rdma_create_qp`: an RC QP in `pd` with `cq` for sends and receives.
    pub fn create_qp(&self, pd: &Pd, cq: &Cq, send_wr: u32, recv_wr: u32) -> io::Result<Qp> {
        let mut attr = rc_qp_attr(cq, send_wr, recv_wr, 0);
        // SAFETY: the PD and the CQ in `attr` are live objects of the id's device; `attr` is a
        // valid init attribute, updated with the actual caps.
        cvt(unsafe { (self.lib.fns.create_qp)(self.ptr, pd.raw(), &mut attr) })?;
        self.qp()
            .ok_or_else(|| io::Error::other("rdma_create_qp made no QP"))
    }

    /// `rdma_destroy_qp` (no-op without a QP).
    pub fn destroy_qp(&self) {
        if self.qp().is_none() {
            return;
        }
        // SAFETY: `ptr` is a live id with a QP; nothing posts to it afterwards.
        unsafe { (self.lib.fns.destroy_qp)(self.ptr) };
    }

    fn conn_param(settings: &ConnSettings<'_>) -> rdma_conn_param {
        rdma_conn_param {
            private_data: settings.private_data.as_ptr().cast(),
            private_data_len: u8::try_from(settings.private_data.len()).unwrap_or(u8::MAX),
            // No RDMA READ or atomics are used.
            responder_resources: 0,
            initiator_depth: 0,
            flow_control: 1,
            retry_count: settings.retry_count.min(7),
            rnr_retry_count: settings.rnr_retry_count.min(7),
            srq: 0,
            qp_num: 0,
        }
    }

    /// `rdma_connect`; completes with ESTABLISHED, REJECTED, UNREACHABLE or CONNECT_ERROR.
    pub fn connect(&self, settings: &ConnSettings<'_>) -> io::Result<()> {
        let mut param = CmId::conn_param(settings);
        // SAFETY: `param` and the private data it points to are live for the call, which
        // copies them.
        cvt(unsafe { (self.lib.fns.connect)(self.ptr, &mut param) })
    }

    /// `rdma_accept` of an incoming id with a QP (moves the QP to RTS).
    pub fn accept(&self, settings: &ConnSettings<'_>) -> io::Result<()> {
        let mut param = CmId::conn_param(settings);
        // SAFETY: as in `connect`.
        cvt(unsafe { (self.lib.fns.accept)(self.ptr, &mut param) })
    }

    /// `rdma_reject` of an incoming id, with private data.
    pub fn reject(&self, private_data: &[u8]) -> io::Result<()> {
        let len = u8::try_from(private_data.len()).unwrap_or(u8::MAX);
        // SAFETY: the data is readable for `len` bytes for the call, which copies it.
        cvt(unsafe { (self.lib.fns.reject)(self.ptr, private_data.as_ptr().cast(), len) })
    }

    /// `rdma_disconnect` (moves the QP to the error state: outstanding work is flushed).
    pub fn disconnect(&self) -> io::Result<()> {
        // SAFETY: `ptr` is a live id.
        cvt(unsafe { (self.lib.fns.disconnect)(self.ptr) })
    }

    /// `RDMA_OPTION_ID_AFONLY` (before bind).
    pub fn set_af_only(&self, on: bool) -> io::Result<()> {
        let mut v: c_int = c_int::from(on);
        // SAFETY: `v` is a live int of the size passed.
        cvt(unsafe {
            (self.lib.fns.set_option)(
                self.ptr,
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_AFONLY,
                (&raw mut v).cast(),
                size_of::<c_int>(),
            )
        })
    }

    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: the QP's local ACK timeout, 4.096 us * 2^`exponent`.
    pub fn set_ack_timeout(&self, exponent: u8) -> io::Result<()> {
        let mut v: u8 = exponent;
        // SAFETY: `v` is a live u8 of the size passed.
        cvt(unsafe {
            (self.lib.fns.set_option)(
                self.ptr,
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_ACK_TIMEOUT,
                (&raw mut v).cast(),
                1,
            )
        })
    }

    /// `rdma_destroy_id`. Every event of the id must have been acked (it waits for that).
    pub fn destroy(self) {
        // SAFETY: the owner calls this once, after its last use of the id and after acking its
        // events; a failure leaves nothing we could release.
        let _ = unsafe { (self.lib.fns.destroy_id)(self.ptr) };
    }

    /// A number that identifies the id while it lives (for logs and maps).
    pub fn addr(&self) -> usize {
        self.ptr as usize
    }
}

/// The address in a `sockaddr_storage` at `p` (AF_INET/AF_INET6 only).
fn sockaddr_at(p: *const u8) -> Option<SocketAddr> {
    let mut raw = RawSockAddr::empty();
    let len = raw.capacity();
    // SAFETY: `p` points to a live sockaddr_storage (128 bytes, the capacity of `raw`).
    unsafe { ptr::copy_nonoverlapping(p, raw.as_mut_ptr().cast::<u8>(), len as usize) };
    raw.set_len(len);
    raw.to_addr().ok()
}

/// The kinds of CM events the engine handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    AddrResolved,
    AddrError,
    RouteResolved,
    RouteError,
    ConnectRequest,
    ConnectError,
    Unreachable,
    Rejected,
    Established,
    Disconnected,
    DeviceRemoval,
    AddrChange,
    TimewaitExit,
    Other(u32),
}

impl EventKind {
    fn from_raw(t: rdma_cm_event_type::Type) -> EventKind {
        use rdma_cm_event_type as t;
        match t {
            t::RDMA_CM_EVENT_ADDR_RESOLVED => EventKind::AddrResolved,
            t::RDMA_CM_EVENT_ADDR_ERROR => EventKind::AddrError,
            t::RDMA_CM_EVENT_ROUTE_RESOLVED => EventKind::RouteResolved,
            t::RDMA_CM_EVENT_ROUTE_ERROR => EventKind::RouteError,
            t::RDMA_CM_EVENT_CONNECT_REQUEST => EventKind::ConnectRequest,
            t::RDMA_CM_EVENT_CONNECT_ERROR => EventKind::ConnectError,
            t::RDMA_CM_EVENT_UNREACHABLE => EventKind::Unreachable,
            t::RDMA_CM_EVENT_REJECTED => EventKind::Rejected,
            t::RDMA_CM_EVENT_ESTABLISHED => EventKind::Established,
            t::RDMA_CM_EVENT_DISCONNECTED => EventKind::Disconnected,
            t::RDMA_CM_EVENT_DEVICE_REMOVAL => EventKind::DeviceRemoval,
            t::RDMA_CM_EVENT_ADDR_CHANGE => EventKind::AddrChange,
            t::RDMA_CM_EVENT_TIMEWAIT_EXIT => EventKind::TimewaitExit,
            other => EventKind::Other(other),
        }
    }
}

/// One CM event, acked when dropped.
pub struct CmEvent {
    lib: &'static Lib,
    ptr: *mut rdma_cm_event,
}

impl CmEvent {
    fn raw(&self) -> &rdma_cm_event {
        // SAFETY: `ptr` is a live event until it is acked in drop.
        unsafe { &*self.ptr }
    }

    /// What happened.
    pub fn kind(&self) -> EventKind {
        EventKind::from_raw(self.raw().event)
    }

    /// The raw event number (for logs).
    pub fn raw_kind(&self) -> u32 {
        self.raw().event
    }

    /// The event's status (an errno or a CM reject reason).
    pub fn status(&self) -> i32 {
        self.raw().status
    }

    /// The id the event is about (for CONNECT_REQUEST: the new id).
    pub fn id(&self) -> CmId {
        CmId {
            lib: self.lib,
            ptr: self.raw().id,
        }
    }

    /// The listening id of a CONNECT_REQUEST.
    pub fn listen_id(&self) -> Option<CmId> {
        let p = self.raw().listen_id;
        (!p.is_null()).then_some(CmId {
            lib: self.lib,
            ptr: p,
        })
    }

    /// The private data of a connection event (CONNECT_REQUEST, ESTABLISHED, REJECTED),
    /// copied out. IB CMs pad it to the message's full size with zeros.
    pub fn private_data(&self) -> Vec<u8> {
        // SAFETY: for connection events `param.conn` is the active member; its pointer is null
        // or valid for `private_data_len` bytes until the event is acked.
        let conn = unsafe { &self.raw().param.conn };
        if conn.private_data.is_null() || conn.private_data_len == 0 {
            return Vec::new();
        }
        // SAFETY: see above.
        unsafe {
            std::slice::from_raw_parts(
                conn.private_data.cast::<u8>(),
                usize::from(conn.private_data_len),
            )
        }
        .to_vec()
    }
}

impl Drop for CmEvent {
    fn drop(&mut self) {
        // SAFETY: `ptr` is an event from rdma_get_cm_event, acked exactly once, here.
        let _ = unsafe { (self.lib.fns.ack_cm_event)(self.ptr) };
    }
}

/// The RDMA devices librdmacm sees (`rdma_get_devices`): their contexts stay open for the
/// life of the process, owned by librdmacm.
pub fn devices(lib: &'static Lib) -> Vec<Context> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out pointer; the list is freed below, the contexts are not
    // (librdmacm keeps them).
    let list = unsafe { (lib.fns.get_devices)(&mut n) };
    if list.is_null() {
        return Vec::new();
    }
    let count = usize::try_from(n).unwrap_or(0);
    // SAFETY: `list` holds `n` context pointers (NULL-terminated).
    let out = unsafe { std::slice::from_raw_parts(list, count) }
        .iter()
        .filter_map(|c: &*mut ibv_context| Context::new(*c))
        .collect();
    // SAFETY: the list came from rdma_get_devices and is freed once.
    unsafe { (lib.fns.free_devices)(list) };
    out
}
