//! The once-per-process decision: may this process upgrade connections at all?
//!
//! Made lazily, on the first `socket(AF_INET|AF_INET6, SOCK_STREAM, ..)`, never in the
//! constructor: every shell and `ls` in an opted-in container loads the shim, and a process that
//! never makes a TCP socket must pay nothing (no dlopen, no file read, no stats file).
//!
//! Order (first match wins; the reason is what every connection of the process is counted
//! with):
//! 1. `STREAMSHIM_DISABLE=1` -> `DISABLED`;
//! 2. `STREAMSHIM_MODE` neither empty, `proxy` nor `direct` -> one stderr line and
//!    `UNSUPPORTED`; `direct` (not in this version) -> one stderr line, then proxy mode;
//! 3. `STREAMSHIM_POLICY` unreadable or invalid -> one stderr line
//!    `streamshim: <error>; passing through` and `POLICY` (the reason points the operator at
//!    the policy, which is what must be fixed; `DISABLED` stays reserved for the kill switch);
//! 4. the program (basename of /proc/self/exe or argv[0]) not allowed by the policy -> `POLICY`;
//! 5. an empty or absent `/sys/class/infiniband` (with the default libraries) -> `NO_DEVICE`,
//!    without loading anything;
//! 6. librdmacm and libibverbs (`STREAMSHIM_PROVIDER`, default the system's) not loadable ->
//!    `NO_PROVIDER`;
//! 7. librdmacm sees no device -> `NO_DEVICE`; only iWARP devices -> `IWARP` (their rdma_cm
//!    ports are the kernel's TCP ports); registered memory not fork-safe (no copy-on-fork in the
//!    kernel and `ibv_fork_init` failed) -> `FORK_UNSAFE`;
//! 8. the pinned-memory budget below one connection's pinned memory -> `MEMLOCK` (the budget:
//!    RLIMIT_MEMLOCK without CAP_IPC_LOCK, and in any case a quarter of the memory the process
//!    may use, [`PinLimits`]; later connections past the budget fall back one by one, also
//!    `MEMLOCK`);
//! 9. otherwise the process is *capable*: connections are decided one by one (policy per peer,
//!    a client's connect to a virtual IP of the cluster, `STREAMSHIM_SERVICE_CIDRS` ->
//!    `SERVICE_IP`, and the negotiation with the peer).
//!
//! The result lives in one atomic byte ([`STATE`]): after the decision a hook costs one
//! atomic load. Races: the thread that moves the state from UNDECIDED to DECIDING decides (with
//! the re-entrancy guard held, because the libraries' dlopen and probe call `socket()`); another
//! thread's `socket()` never waits (its socket is tracked), while its `connect()`, `listen()` or
//! `accept()` waits for the decision ([`settled`], bounded).
//! A fork child of a capable or deciding process passes through (`UNSUPPORTED`, see
//! [`after_fork_child`]); one of an undecided process decides for itself.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use rdma_streams_transport::Unusable;
use rdma_streams_transport::engine::{MEMORY_SHARE, PinLimits};

use crate::fdtable::{self, SHIM_OWNED};
use crate::log::{self, Level, log_at};
use crate::policy::{Policy, current_program_names};
use crate::reason::Reason;
use crate::services::{self, ServiceCidrs};
use crate::settings::{DISABLE_ENV, MODE_ENV, Mode, Settings};
use crate::stats::{Stats, StatsSink};
use crate::{ring, upgrade};

const UNDECIDED: u8 = 0;
const DECIDING: u8 = 1;
const CAPABLE: u8 = 2;
/// Pass-through states are `PASS_BASE + reason code`.
const PASS_BASE: u8 = 16;

static STATE: AtomicU8 = AtomicU8::new(UNDECIDED);

/// The policy of a capable process (read once at the decision).
static POLICY: OnceLock<Policy> = OnceLock::new();
/// Where the stats go (`STREAMSHIM_STATS`), read at the decision.
static SINK: OnceLock<Option<StatsSink>> = OnceLock::new();
/// Set once this process wrote its stats file (cleared in a fork child).
static STATS_WRITTEN: AtomicBool = AtomicBool::new(false);

/// What the process decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// No INET stream socket yet.
    Undecided,
    /// Another thread is deciding right now.
    Deciding,
    /// Every connection stays TCP with this reason.
    PassThrough(Reason),
    /// Connections are decided one by one.
    Capable,
}

/// The current state: one atomic load.
#[inline]
pub fn current() -> State {
    match STATE.load(Ordering::Acquire) {
        UNDECIDED => State::Undecided,
        DECIDING => State::Deciding,
        CAPABLE => State::Capable,
        s => match Reason::from_code(u16::from(s.wrapping_sub(PASS_BASE))) {
            Some(r) => State::PassThrough(r),
            None => State::PassThrough(Reason::Disabled),
        },
    }
}

/// Longest a connect, listen or accept waits for another thread's decision.
const SETTLE_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The state once no other thread is deciding: another thread's decision (loading the RDMA
/// libraries and scanning devices: milliseconds on real machines, seconds under emulation) is
/// waited for, at most [`SETTLE_LIMIT`], so that a program whose threads all connect at start
/// upgrades them all. Never waits for this thread's own decision: a signal handler that
/// interrupts it finds the re-entrancy guard held and goes straight to libc. Past the limit
/// the caller passes through uncounted, as before a decision.
pub fn settled() -> State {
    let mut state = current();
    if state != State::Deciding {
        return state;
    }
    let deadline = std::time::Instant::now() + SETTLE_LIMIT;
    while state == State::Deciding && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
        state = current();
    }
    state
}

/// The capable process's policy.
pub fn policy() -> Option<&'static Policy> {
    POLICY.get()
}

/// Makes the decision if nobody has yet (the caller holds the re-entrancy guard). Returns at
/// once when it is made or being made by another thread.
pub fn ensure(register: &dyn Fn()) {
    // A plain load first: after the decision no read-modify-write on the hot path.
    if STATE.load(Ordering::Acquire) != UNDECIDED {
        return;
    }
    if STATE
        .compare_exchange(UNDECIDED, DECIDING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    // Every STREAMSHIM_* variable, read once.
    let settings = Settings::from_env();
    log::set_level(settings.log);
    let _ = SINK.set(settings.stats.clone());
    // atexit (stats file) and the fork child handler (counter reset).
    register();
    let state = evaluate(&settings);
    let code = match state {
        State::Capable => CAPABLE,
        State::PassThrough(r) => PASS_BASE.saturating_add(u8::try_from(r.code()).unwrap_or(0)),
        State::Undecided | State::Deciding => CAPABLE,
    };
    STATE.store(code, Ordering::Release);
}

fn evaluate(settings: &Settings) -> State {
    if settings.disable {
        log_at!(Level::Info, "disabled by {DISABLE_ENV}: passing through");
        return State::PassThrough(Reason::Disabled);
    }
    match &settings.mode {
        Mode::Proxy => {}
        Mode::Direct => log::plain_line(format_args!(
            "streamshim: {MODE_ENV}=direct is not available in this version; using proxy"
        )),
        Mode::Other(other) => {
            log::plain_line(format_args!(
                "streamshim: {MODE_ENV}={other:?} is not a mode (proxy, direct); passing through"
            ));
            return State::PassThrough(Reason::Unsupported);
        }
    }
    let policy = match settings.policy.load() {
        Ok(p) => p,
        Err(e) => {
            // Printed whatever STREAMSHIM_LOG says: exactly one line per process.
            log::plain_line(format_args!("streamshim: {e}; passing through"));
            return State::PassThrough(Reason::Policy);
        }
    };
    let names = current_program_names();
    if !policy.program_allowed_any(&names) {
        log_at!(
            Level::Info,
            "program {names:?} not allowed by the policy: passing through (POLICY)"
        );
        return State::PassThrough(Reason::Policy);
    }
    if settings.default_provider() && sysfs_has_no_rdma_device() {
        // The default libraries could only say the same, after ~1 ms of dlopen (librdmacm,
        // libibverbs, libnl) and a device scan: every short-lived process would pay it.
        log_at!(
            Level::Info,
            "no RDMA device in /sys/class/infiniband: passing through (NO_DEVICE)"
        );
        return State::PassThrough(Reason::NoDevice);
    }
    let usable = match rdma_streams_transport::probe(&settings.provider) {
        Ok(u) => u,
        Err(e) => {
            let reason = match e {
                Unusable::NoLibrary(_) => Reason::NoProvider,
                Unusable::IwarpOnly(_) => Reason::Iwarp,
                Unusable::NotForkSafe => Reason::ForkUnsafe,
                _ => Reason::NoDevice,
            };
            log_at!(Level::Info, "RDMA: {e}: passing through ({reason})");
            return State::PassThrough(reason);
        }
    };
    // The libraries' fds are theirs: an app's double close of a reused number must not close
    // them.
    for fd in &usable.fds {
        fdtable::set(*fd, SHIM_OWNED);
    }
    let ring_bytes = settings.ring_bytes.clone().unwrap_or_else(|e| {
        // Printed whatever STREAMSHIM_LOG says: exactly one line per process.
        log::plain_line(format_args!(
            "streamshim: {e}; using {} KiB",
            ring::DEFAULT_RING_KIB
        ));
        ring::DEFAULT_RING_KIB * 1024
    });
    let switch = |value: &Result<bool, String>, what: &str| {
        value.clone().unwrap_or_else(|e| {
            log::plain_line(format_args!("streamshim: {e}; direct {what} stay on"));
            true
        })
    };
    upgrade::set_direct_read(switch(&settings.direct_read, "reads"));
    upgrade::set_direct_write(switch(&settings.direct_write, "writes"));
    upgrade::set_spare(settings.spare.clone().unwrap_or_else(|e| {
        log::plain_line(format_args!("streamshim: {e}; spare connections stay on"));
        true
    }));
    upgrade::set_reuse(settings.reuse.clone().unwrap_or_else(|e| {
        log::plain_line(format_args!("streamshim: {e}; reused connections stay on"));
        true
    }));
    services::set(settings.service_cidrs.clone().unwrap_or_else(|e| {
        log::plain_line(format_args!(
            "streamshim: {e}; connects to Services are negotiated"
        ));
        ServiceCidrs::default()
    }));
    let per_connection = upgrade::engine_config(None, ring_bytes).pinned_per_connection();
    let limits = PinLimits::of_this_process();
    let budget = limits.budget();
    if budget < per_connection {
        if limits.memlock_binds() {
            log_at!(
                Level::Info,
                "RLIMIT_MEMLOCK leaves {budget} bytes, one connection pins {per_connection}, no CAP_IPC_LOCK: passing through (MEMLOCK)"
            );
        } else {
            log_at!(
                Level::Info,
                "1/{MEMORY_SHARE} of the memory this process may use leaves {budget} bytes to pin, one connection pins {per_connection}: passing through (MEMLOCK)"
            );
        }
        return State::PassThrough(Reason::Memlock);
    }
    log_at!(
        Level::Info,
        "capable: RDMA devices {:?} through {}; connections decided one by one",
        usable.devices,
        usable.lib.name()
    );
    let _ = POLICY.set(policy);
    upgrade::set_negotiate_timeout(settings.negotiate_timeout);
    upgrade::configure(usable.lib, Some(budget), ring_bytes);
    State::Capable
}

/// True when sysfs says the node (or this network namespace, in exclusive RDMA mode) has no
/// RDMA device. Unknown (no sysfs): false, and the libraries' device scan decides. Asked only
/// with the default libraries: the shim bundle's (`STREAMSHIM_PROVIDER`) scan decides alone.
fn sysfs_has_no_rdma_device() -> bool {
    match std::fs::read_dir("/sys/class/infiniband") {
        Ok(mut entries) => entries.next().is_none(),
        // sysfs is there but the RDMA class is not: no RDMA core, no device.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::path::Path::new("/sys/class/net").is_dir()
        }
        Err(_) => false,
    }
}

/// Writes the stats file once (at exit; the destructor is a fallback). Only a process that
/// made its decision writes one.
pub fn write_stats_once() {
    if matches!(current(), State::Undecided) {
        return;
    }
    let Some(Some(sink)) = SINK.get() else { return };
    if STATS_WRITTEN.swap(true, Ordering::AcqRel) {
        return;
    }
    if let Some(peak) = upgrade::pinned_peak() {
        Stats::global().note_pinned_peak(peak);
    }
    if let Some((parked, reused, unanswered)) = upgrade::reuse_counts() {
        Stats::global().note_reused_links(reused);
        log_at!(
            Level::Debug,
            "queue pairs: {parked} parked, {reused} reused, {unanswered} REUSE unanswered"
        );
    }
    match sink.write(Stats::global()) {
        Ok(path) => log_at!(Level::Debug, "stats written to {}", path.display()),
        Err(e) => log_at!(
            Level::Info,
            "cannot write stats to {}: {e}",
            sink.path().display()
        ),
    }
}

/// In a fork child: fresh counters and a stats file of its own. A child of a capable process
/// (or of one that was deciding, maybe inside the libraries' `dlopen` or probe) passes through,
/// counted `UNSUPPORTED`: the RDMA stack its parent initialized cannot be used or rebuilt in a
/// fork child (librdmacm and libibverbs have no re-initialisation; the libraries' own locks may
/// be held by parent threads that do not exist here). Its inherited upgraded connections keep
/// working: they are socketpair ends whose engine runs in the parent. `exec` starts afresh.
pub fn after_fork_child() {
    Stats::global().reset();
    STATS_WRITTEN.store(false, Ordering::Release);
    let forked = PASS_BASE.saturating_add(u8::try_from(Reason::Unsupported.code()).unwrap_or(0));
    let _ = STATE.fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
        matches!(s, CAPABLE | DECIDING).then_some(forked)
    });
}
