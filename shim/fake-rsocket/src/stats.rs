//! Per-process counters: what went through r-fds, so tests can prove which path carried bytes.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::config::config;

static CONNECTS: AtomicU64 = AtomicU64::new(0);
static ACCEPTS: AtomicU64 = AtomicU64::new(0);
static BYTES_SENT: AtomicU64 = AtomicU64::new(0);
static BYTES_RECEIVED: AtomicU64 = AtomicU64::new(0);

/// The counters at one moment; the JSON form is
/// `{"connects":..,"accepts":..,"bytes_sent":..,"bytes_received":..}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Connections made by `rconnect` (counted when they complete).
    pub connects: u64,
    /// Connections returned by `raccept`.
    pub accepts: u64,
    /// Bytes sent through r-fds.
    pub bytes_sent: u64,
    /// Bytes received through r-fds (peeks excluded).
    pub bytes_received: u64,
}

pub(crate) fn count_connect() {
    CONNECTS.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn count_accept() {
    ACCEPTS.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn count_sent(n: usize) {
    BYTES_SENT.fetch_add(n as u64, Ordering::Relaxed);
}

pub(crate) fn count_received(n: usize) {
    BYTES_RECEIVED.fetch_add(n as u64, Ordering::Relaxed);
}

pub(crate) fn snapshot() -> Snapshot {
    Snapshot {
        connects: CONNECTS.load(Ordering::Relaxed),
        accepts: ACCEPTS.load(Ordering::Relaxed),
        bytes_sent: BYTES_SENT.load(Ordering::Relaxed),
        bytes_received: BYTES_RECEIVED.load(Ordering::Relaxed),
    }
}

/// The counters as a JSON object.
pub(crate) fn json() -> String {
    // Serializing four integers cannot fail; an empty object would still be valid JSON.
    serde_json::to_string(&snapshot()).unwrap_or_else(|_| String::from("{}"))
}

/// Serializes writers so a later snapshot never loses the race to an earlier one.
static WRITE_LOCK: Mutex<()> = Mutex::new(());

/// Writes `<dir>/<pid>.json` atomically (temporary file, then rename).
fn persist(dir: &Path) -> io::Result<PathBuf> {
    let _guard = WRITE_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    let pid = std::process::id();
    let target = dir.join(format!("{pid}.json"));
    let temp = dir.join(format!(".{pid}.json.tmp"));
    // The program under test may close a number twice (iperf3 does, at the end of a test)
    // while another thread writes this file: write through a high, rarely reused number, and
    // close it without the debug-build abort of a std close that fails with EBADF.
    let mut file = crate::ffi::high_fd(fs::File::create(&temp)?);
    let written = file
        .write_all(json().as_bytes())
        .and_then(|()| file.write_all(b"\n"))
        .and_then(|()| file.sync_data());
    crate::ffi::close_quietly(file);
    written?;
    fs::rename(&temp, &target)?;
    Ok(target)
}

/// Writes the stats file if `FAKE_RSOCKET_STATS_DIR` is set. Failures are silent: the fake
/// must not disturb the program under test, and a missing file fails the test that wants it.
pub(crate) fn persist_if_configured() {
    if let Some(dir) = &config().stats_dir {
        let _ = persist(dir);
    }
}

/// True if a stats directory is configured (so an exit hook is worth registering).
pub(crate) fn configured() -> bool {
    config().stats_dir.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persist_writes_parseable_json() {
        let dir = tempfile::tempdir().unwrap();
        count_sent(3);
        let path = persist(dir.path()).unwrap();
        assert_eq!(
            path.file_name().unwrap().to_str().unwrap(),
            format!("{}.json", std::process::id())
        );
        let snap: Snapshot = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        assert!(snap.bytes_sent >= 3);
        // No temporary file is left behind.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
