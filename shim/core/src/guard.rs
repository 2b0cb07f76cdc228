//! The per-thread re-entrancy guard.
//!
//! While a hook runs the shim's own logic (the decision loads the RDMA libraries with
//! `dlopen`, whose device scan opens files and sockets; stats writing calls `close()`), nested
//! calls of hooked functions on the same thread go straight to the originals. The flag is a
//! `const`-initialised `Cell<bool>` without `Drop`, so touching it never allocates and never
//! registers a TLS destructor (redhook#15); the library is loaded at start-up (LD_PRELOAD), so
//! its TLS lives in the static TLS block and `__tls_get_addr` does not allocate either.

use std::cell::Cell;

thread_local! {
    static IN_SHIM: Cell<bool> = const { Cell::new(false) };
}

/// Held while the shim's logic runs on this thread.
#[derive(Debug)]
pub struct Guard(());

impl Guard {
    /// Enters the shim; `None` if this thread is already inside it (call the original).
    #[inline]
    pub fn enter() -> Option<Guard> {
        match IN_SHIM.try_with(|c| c.replace(true)) {
            Ok(false) => Some(Guard(())),
            // Already inside, or TLS unavailable (thread teardown): pass through.
            Ok(true) | Err(_) => None,
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = IN_SHIM.try_with(|c| c.set(false));
    }
}
