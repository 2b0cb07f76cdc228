//! Drain on the first SIGTERM or SIGINT; a second signal exits at once.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Cancels `token` on the first signal and exits the process on the second.
pub fn spawn_signal_handler(token: CancellationToken) -> std::io::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => info!(signal = "SIGTERM", "draining"),
            _ = int.recv() => info!(signal = "SIGINT", "draining"),
        }
        token.cancel();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        warn!("second signal: exiting without draining");
        std::process::exit(130);
    });
    Ok(())
}
