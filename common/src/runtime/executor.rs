//! The tokio executor a binary's main thread blocks on: one recipe for the three binaries, so
//! they agree on the features they enable and on how idle threads leave.

use std::{io, time::Duration};

/// How many threads run tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// Everything on the thread that calls `block_on` (a one-shot command).
    Current,
    /// A worker pool of this size (a long-running server; the binaries are light on CPU).
    Workers(usize),
    /// A worker pool of one thread per CPU (tokio's default).
    PerCpu,
}

/// How long an idle blocking-pool thread stays: blocking calls (waits for a stream to open,
/// file reads) come in bursts, and a thread that leaves soon after keeps the thread count of a
/// quiet process near its floor.
pub const BLOCKING_KEEP_ALIVE: Duration = Duration::from_secs(1);

/// Builds the executor: I/O and timers enabled, `threads` workers, blocking threads that leave
/// after [`BLOCKING_KEEP_ALIVE`] idle.
pub fn executor(threads: Threads) -> io::Result<tokio::runtime::Runtime> {
    let mut builder = match threads {
        Threads::Current => tokio::runtime::Builder::new_current_thread(),
        Threads::Workers(_) | Threads::PerCpu => tokio::runtime::Builder::new_multi_thread(),
    };
    if let Threads::Workers(n) = threads {
        builder.worker_threads(n.max(1));
    }
    builder
        .enable_all()
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_shape_runs_timers_and_io() {
        for threads in [
            Threads::Current,
            Threads::Workers(2),
            Threads::Workers(0),
            Threads::PerCpu,
        ] {
            let rt = executor(threads).unwrap();
            let got = rt.block_on(async {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                listener.local_addr().unwrap().port()
            });
            assert_ne!(got, 0, "{threads:?}");
        }
    }

    #[test]
    fn workers_sets_the_pool_size() {
        let rt = executor(Threads::Workers(3)).unwrap();
        assert_eq!(rt.metrics().num_workers(), 3);
        let rt = executor(Threads::Current).unwrap();
        assert_eq!(rt.metrics().num_workers(), 1);
    }
}
