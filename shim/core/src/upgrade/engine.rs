//! The process's one [`Engine`], started at the first upgrade attempt (a capable `listen()` or
//! `connect()`), never in the constructor or at the decision: a process that never connects
//! starts no thread.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rdma_streams_transport::rdma::Lib;
use rdma_streams_transport::{Engine, EngineConfig};

use super::FORKED;
use crate::fdtable::{self, SHIM_OWNED};
use crate::guard::Guard;
use crate::log::{Level, log_at};

/// What the decision found: the libraries and the pinned-memory budget.
struct Setup {
    lib: &'static Lib,
    memlock_limit: Option<u64>,
    ring_bytes: usize,
}

static SETUP: OnceLock<Setup> = OnceLock::new();
static ENGINE: OnceLock<Option<Engine>> = OnceLock::new();

/// The longest an exiting process waits for its streams to deliver what the app wrote ...
const EXIT_FLUSH: Duration = Duration::from_secs(60);
/// ... and for any byte to move (a peer that stopped reading, or is gone, costs this much).
const EXIT_STALL: Duration = Duration::from_secs(5);

/// `STREAMSHIM_REUSE` (set at the decision, before the engine starts).
static REUSE: AtomicBool = AtomicBool::new(true);

/// Turns reused connections on or off for the engine this process starts (the decision, from
/// `STREAMSHIM_REUSE`).
pub fn set_reuse(on: bool) {
    REUSE.store(on, Ordering::Release);
}

/// Called by the decision of a capable process.
pub fn configure(lib: &'static Lib, memlock_limit: Option<u64>, ring_bytes: usize) {
    let _ = SETUP.set(Setup {
        lib,
        memlock_limit,
        ring_bytes,
    });
}

/// The shim's engine configuration (also used for the decision's memlock check): rings of
/// `ring_bytes` (`STREAMSHIM_RING_KIB`).
pub fn config(memlock_limit: Option<u64>, ring_bytes: usize) -> EngineConfig {
    EngineConfig {
        memlock_limit,
        ring_bytes,
        // The libraries' and the engine's fds are the shim's: an app's double close of a
        // reused number must not close them behind the engine's back.
        fd_observer: Some(Arc::new(|fd: RawFd| fdtable::set(fd, SHIM_OWNED))),
        // Everything the engine thread calls (libc, librdmacm) goes straight to the originals.
        on_thread_start: Some(Arc::new(|| std::mem::forget(Guard::enter()))),
        thread_name: String::from("streamshim-io"),
        reuse_links: REUSE.load(Ordering::Acquire),
        ..EngineConfig::default()
    }
}

/// The engine, started on first use; None when it cannot start (the connection stays TCP,
/// `RDMA_ERROR`) or in a fork child.
pub fn engine() -> Option<&'static Engine> {
    if FORKED.load(Ordering::Acquire) {
        return None;
    }
    let setup = SETUP.get()?;
    ENGINE
        .get_or_init(|| {
            // The engine's thread and the fork children's take none of the app's signals.
            crate::sys::with_signals_blocked(|| {
                match Engine::start(setup.lib, config(setup.memlock_limit, setup.ring_bytes)) {
                    Ok(e) => {
                        // Children this process forks upgrade through it (pre-fork servers).
                        super::delegate::start();
                        Some(e)
                    }
                    Err(e) => {
                        log_at!(Level::Info, "cannot start the RDMA engine: {e}");
                        None
                    }
                }
            })
        })
        .as_ref()
}

/// At exit: every stream delivers what the app already wrote and sends FIN, as the kernel would
/// for a TCP socket after the process is gone: as long as bytes move, at most [`EXIT_FLUSH`]
/// in all, and at most [`EXIT_STALL`] without progress.
pub fn flush_at_exit() {
    // The atexit handler and the destructor fallback may both call (the second one catches
    // what an earlier-registered atexit handler wrote); after a flush that stalled, no second
    // wait.
    static STALLED: AtomicBool = AtomicBool::new(false);
    if FORKED.load(Ordering::Acquire) || STALLED.load(Ordering::Acquire) {
        return;
    }
    let Some(Some(engine)) = ENGINE.get() else {
        return;
    };
    if !engine.flush(EXIT_STALL, Instant::now() + EXIT_FLUSH) {
        STALLED.store(true, Ordering::Release);
        log_at!(
            Level::Info,
            "exit: some upgraded connections could not deliver everything (no progress for \
             {EXIT_STALL:?}, or {EXIT_FLUSH:?} in all)"
        );
    }
}
