//! Test-only helpers shared by the workspace's integration-test harnesses. Dev-dependency
//! only.
//!
//! - [`within`]: run a test body under a time limit; `within_async` (feature `async`): the
//!   same for a future;
//! - [`free_port`]: a loopback TCP port nobody listens on;
//! - [`docs`]: the tables of `docs/` that repeat the code (flags, metrics), for the tests that
//!   check them against it (`docs::flags_of` with feature `docs`);
//! - `fuzz` (feature `fuzz`): bounded property runs over hostile input (fixed case counts, a
//!   time limit, no failure files) and the generators the decoders' fuzz tests share;
//! - `mock_api` (feature `kube`): a mocked Kubernetes API server for kube-side unit tests;
//! - `h2_raw` (feature `h2`): a raw HTTP/2 client for unary gRPC calls over a unix socket;
//! - [`stats`]: the benchmarks' medians and percentiles;
//! - [`shipped`]: the check that a shipped binary carries no test double;
//! - [`process`]: a command run to its end under a time limit;
//! - `shared_runtime` (feature `async`): one current-thread tokio runtime per test
//!   binary, for property runs that drive async code case after case.
#![warn(missing_docs)]
// Only tests link this crate: a panic is how its helpers fail the calling test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

pub mod docs;
#[cfg(feature = "fuzz")]
pub mod fuzz;
#[cfg(feature = "h2")]
pub mod h2_raw;
#[cfg(feature = "kube")]
#[allow(missing_docs)]
pub mod mock_api;
pub mod process;
pub mod shipped;
pub mod stats;

/// One current-thread tokio runtime (timers and I/O on) for the whole test binary: property
/// runs block on it case after case instead of building a runtime each time.
#[cfg(feature = "async")]
pub fn shared_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

/// Runs `f` on a thread and fails the test if it takes longer than `limit`. A panic in `f`
/// is propagated as is.
pub fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let worker = thread::spawn(move || {
        let out = f();
        let _ = tx.send(());
        out
    });
    match rx.recv_timeout(limit) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => match worker.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("test timed out after {limit:?}"),
    }
}

/// Awaits `f`, failing the test if it takes longer than `limit`.
#[cfg(feature = "async")]
pub async fn within_async<T>(limit: Duration, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, f)
        .await
        .unwrap_or_else(|_| panic!("test timed out after {limit:?}"))
}

/// A loopback TCP port that was free a moment ago (the kernel's pick for port 0), for a
/// server a test starts next.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_returns_the_value() {
        assert_eq!(within(Duration::from_secs(5), || 7), 7);
    }

    #[test]
    #[should_panic(expected = "body failed")]
    fn within_propagates_a_panic() {
        within(Duration::from_secs(5), || panic!("body failed"));
    }

    #[test]
    fn free_port_can_be_bound() {
        let port = free_port();
        assert_ne!(port, 0);
        std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind the free port");
    }

    #[test]
    #[should_panic(expected = "timed out")]
    fn within_fails_on_timeout() {
        within(Duration::from_millis(10), || {
            thread::sleep(Duration::from_secs(1));
        });
    }
}
