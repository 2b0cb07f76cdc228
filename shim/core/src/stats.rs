//! Per-process connection counters and the `STREAMSHIM_STATS` JSON file.
//!
//! Counting is lock-free and allocation-free ([`Stats::record`] is one relaxed `fetch_add`), so it
//! is safe on hot paths, inside signal handlers and between `fork` and `exec`. Snapshots and the
//! file write allocate and are meant for exit time (or an occasional flush), never for a hook's
//! fast path.
//!
//! `STREAMSHIM_STATS` is a path template: `%p` expands to the writing process's pid (so a forked
//! child does not clobber its parent's file), `%%` to `%`; a value ending in `/` names a directory
//! and means `<dir>/streamshim-%p.json`. The file is replaced atomically (temp file + rename).
//!
//! JSON layout (format `version` 1; reason maps list only non-zero counters):
//!
//! ```json
//! {"version":1,"pid":4242,
//!  "client":{"total":{"rdma":3,"tcp":1},"rdma":{"UPGRADED":3},"tcp":{"POLICY":1}},
//!  "server":{"total":{"rdma":0,"tcp":0},"rdma":{},"tcp":{}},
//!  "total":{"rdma":3,"tcp":1},
//!  "rdma_bytes":{"sent":1048576,"received":512,"direct":500,"direct_written":1048000},
//!  "tcp_bytes_before_move":{"sent":300,"received":4096,"direct":200},
//!  "rdma_closed":2,"rdma_resets":0,"pinned_peak":4399104,"spare_connects":2,
//!  "reused_links":1}
//! ```

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::Permissions;
use std::io::{self, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::reason::{Path, Reason, Role};

/// Version of the JSON layout written by [`Stats::to_json`].
pub const STATS_FORMAT_VERSION: u32 = 1;

/// File name used when `STREAMSHIM_STATS` names a directory (ends in `/`).
pub const DEFAULT_FILE_TEMPLATE: &str = "streamshim-%p.json";

const SLOTS: usize = Role::ALL.len() * Path::ALL.len() * Reason::COUNT;

const fn slot(role: Role, path: Path, reason: Reason) -> usize {
    (role.index() * Path::ALL.len() + path.index()) * Reason::COUNT + reason.index()
}

/// Lock-free per-process counters. Usually used through [`Stats::global`].
#[derive(Debug)]
pub struct Stats {
    connections: [AtomicU64; SLOTS],
    rdma_bytes_sent: AtomicU64,
    rdma_bytes_received: AtomicU64,
    rdma_closed: AtomicU64,
    rdma_resets: AtomicU64,
    pinned_peak: AtomicU64,
    rdma_bytes_direct: AtomicU64,
    rdma_bytes_direct_written: AtomicU64,
    spare_connects: AtomicU64,
    reused_links: AtomicU64,
    before_move_sent: AtomicU64,
    before_move_received: AtomicU64,
    before_move_direct: AtomicU64,
}

static GLOBAL: Stats = Stats::new();

impl Default for Stats {
    fn default() -> Self {
        Stats::new()
    }
}

impl Stats {
    /// All counters zero. `const`, so it can back a `static`.
    pub const fn new() -> Stats {
        Stats {
            connections: [const { AtomicU64::new(0) }; SLOTS],
            rdma_bytes_sent: AtomicU64::new(0),
            rdma_bytes_received: AtomicU64::new(0),
            rdma_closed: AtomicU64::new(0),
            rdma_resets: AtomicU64::new(0),
            pinned_peak: AtomicU64::new(0),
            rdma_bytes_direct: AtomicU64::new(0),
            rdma_bytes_direct_written: AtomicU64::new(0),
            spare_connects: AtomicU64::new(0),
            reused_links: AtomicU64::new(0),
            before_move_sent: AtomicU64::new(0),
            before_move_received: AtomicU64::new(0),
            before_move_direct: AtomicU64::new(0),
        }
    }

    /// The process-wide counters.
    pub fn global() -> &'static Stats {
        &GLOBAL
    }

    /// Counts one connection that ended on `path` for `reason`. Lock-free, allocation-free,
    /// async-signal-safe.
    pub fn record(&self, role: Role, path: Path, reason: Reason) {
        if let Some(c) = self.connections.get(slot(role, path, reason)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one connection with the path implied by the reason ([`Reason::path`]).
    pub fn record_reason(&self, role: Role, reason: Reason) {
        self.record(role, reason.path(), reason);
    }

    /// Counts bytes of a connection with a stream that went over TCP before its move.
    pub fn add_before_move(&self, sent: u64, received: u64) {
        self.before_move_sent.fetch_add(sent, Ordering::Relaxed);
        self.before_move_received
            .fetch_add(received, Ordering::Relaxed);
    }

    /// Counts bytes of a connection before its move that the app's thread sent on the TCP
    /// socket itself (a part of [`Stats::add_before_move`]'s `sent`).
    pub fn add_before_move_direct(&self, n: u64) {
        self.before_move_direct.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds bytes the app sent over an upgraded (RDMA) connection.
    pub fn add_rdma_bytes_sent(&self, n: u64) {
        self.rdma_bytes_sent.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds bytes the app received over an upgraded (RDMA) connection.
    pub fn add_rdma_bytes_received(&self, n: u64) {
        self.rdma_bytes_received.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` received bytes were read straight from a receive ring (a direct read).
    pub fn add_rdma_bytes_direct(&self, n: u64) {
        self.rdma_bytes_direct.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` sent bytes were written straight into a send ring (a direct write).
    pub fn add_rdma_bytes_direct_written(&self, n: u64) {
        self.rdma_bytes_direct_written
            .fetch_add(n, Ordering::Relaxed);
    }

    /// Counts the end of an upgraded connection; `reset` when it ended by an error or reset
    /// (`RDMA_ERROR` after the upgrade) rather than an orderly close.
    pub fn record_rdma_close(&self, reset: bool) {
        self.rdma_closed.fetch_add(1, Ordering::Relaxed);
        if reset {
            self.rdma_resets.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The current value of one connection counter.
    pub fn count(&self, role: Role, path: Path, reason: Reason) -> u64 {
        self.connections
            .get(slot(role, path, reason))
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Connections of `role` on `path`, over all reasons.
    pub fn path_total(&self, role: Role, path: Path) -> u64 {
        Reason::ALL
            .iter()
            .fold(0u64, |acc, &r| acc.wrapping_add(self.count(role, path, r)))
    }

    /// Sets every counter to zero (for example in a `fork` child that wants only its own
    /// connections counted). Lock-free and async-signal-safe.
    pub fn reset(&self) {
        for c in &self.connections {
            c.store(0, Ordering::Relaxed);
        }
        self.rdma_bytes_sent.store(0, Ordering::Relaxed);
        self.rdma_bytes_received.store(0, Ordering::Relaxed);
        self.rdma_bytes_direct.store(0, Ordering::Relaxed);
        self.rdma_bytes_direct_written.store(0, Ordering::Relaxed);
        self.rdma_closed.store(0, Ordering::Relaxed);
        self.rdma_resets.store(0, Ordering::Relaxed);
        self.pinned_peak.store(0, Ordering::Relaxed);
        self.spare_connects.store(0, Ordering::Relaxed);
        self.reused_links.store(0, Ordering::Relaxed);
        self.before_move_sent.store(0, Ordering::Relaxed);
        self.before_move_received.store(0, Ordering::Relaxed);
        self.before_move_direct.store(0, Ordering::Relaxed);
    }

    /// A connect took a spare connection (its RDMA connect made ahead).
    pub fn add_spare_connect(&self) {
        self.spare_connects.fetch_add(1, Ordering::Relaxed);
    }

    /// The engine's connections that took a finished connection's queue pair so far.
    pub fn note_reused_links(&self, n: u64) {
        self.reused_links.fetch_max(n, Ordering::Relaxed);
    }

    /// The engine pinned `bytes` at once (kept when it is the most so far).
    pub fn note_pinned_peak(&self, bytes: u64) {
        self.pinned_peak.fetch_max(bytes, Ordering::Relaxed);
    }

    /// A consistent-enough copy of the counters (each counter read once, relaxed), with this
    /// process's pid. Allocates.
    pub fn snapshot(&self) -> StatsSnapshot {
        self.snapshot_with_pid(std::process::id())
    }

    /// Like [`Stats::snapshot`] with an explicit pid.
    pub fn snapshot_with_pid(&self, pid: u32) -> StatsSnapshot {
        let role_counts = |role: Role| {
            let mut rc = RoleCounts::default();
            for path in Path::ALL {
                for reason in Reason::ALL {
                    let n = self.count(role, path, reason);
                    if n == 0 {
                        continue;
                    }
                    let (map, total) = match path {
                        Path::Rdma => (&mut rc.rdma, &mut rc.total.rdma),
                        Path::Tcp => (&mut rc.tcp, &mut rc.total.tcp),
                    };
                    map.insert(reason.as_str().to_owned(), n);
                    *total = total.wrapping_add(n);
                }
            }
            rc
        };
        let client = role_counts(Role::Client);
        let server = role_counts(Role::Server);
        let total = PathTotals {
            rdma: client.total.rdma.wrapping_add(server.total.rdma),
            tcp: client.total.tcp.wrapping_add(server.total.tcp),
        };
        StatsSnapshot {
            version: STATS_FORMAT_VERSION,
            pid,
            client,
            server,
            total,
            rdma_bytes: ByteCounts {
                sent: self.rdma_bytes_sent.load(Ordering::Relaxed),
                received: self.rdma_bytes_received.load(Ordering::Relaxed),
                direct: self.rdma_bytes_direct.load(Ordering::Relaxed),
                direct_written: self.rdma_bytes_direct_written.load(Ordering::Relaxed),
            },
            rdma_closed: self.rdma_closed.load(Ordering::Relaxed),
            rdma_resets: self.rdma_resets.load(Ordering::Relaxed),
            pinned_peak: self.pinned_peak.load(Ordering::Relaxed),
            spare_connects: self.spare_connects.load(Ordering::Relaxed),
            reused_links: self.reused_links.load(Ordering::Relaxed),
            tcp_bytes_before_move: MovedBytes {
                sent: self.before_move_sent.load(Ordering::Relaxed),
                received: self.before_move_received.load(Ordering::Relaxed),
                direct: self.before_move_direct.load(Ordering::Relaxed),
            },
        }
    }

    /// The snapshot as one line of JSON (no trailing newline).
    pub fn to_json(&self) -> String {
        self.snapshot().to_json()
    }

    /// Writes the snapshot as JSON to `path`, atomically (see [`write_atomic`]).
    pub fn write_to(&self, path: &FsPath) -> io::Result<()> {
        let mut json = self.to_json();
        json.push('\n');
        write_atomic(path, json.as_bytes())
    }
}

/// Connections per path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathTotals {
    /// Upgraded connections.
    pub rdma: u64,
    /// Connections that stayed on TCP.
    pub tcp: u64,
}

/// Counters of one role.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleCounts {
    /// Sums of the two maps below.
    pub total: PathTotals,
    /// Non-zero counters of connections on the RDMA path, by reason name (normally `UPGRADED`).
    pub rdma: BTreeMap<String, u64>,
    /// Non-zero counters of connections on TCP, by fallback reason name.
    pub tcp: BTreeMap<String, u64>,
}

impl RoleCounts {
    /// The counter for `reason` on `path` (0 when absent).
    pub fn get(&self, path: Path, reason: Reason) -> u64 {
        let map = match path {
            Path::Rdma => &self.rdma,
            Path::Tcp => &self.tcp,
        };
        map.get(reason.as_str()).copied().unwrap_or(0)
    }
}

/// Bytes carried over upgraded connections, from the app's point of view.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByteCounts {
    /// Written by the app, sent to the peer.
    pub sent: u64,
    /// Received from the peer, read by the app.
    pub received: u64,
    /// Of `received`, bytes the app's `read`/`recv` took straight from the receive ring
    /// instead of through the socketpair (absent in files of older shims: 0).
    #[serde(default)]
    pub direct: u64,
    /// Of `sent`, bytes the app's `write`/`send` put straight into the send ring instead of
    /// through the socketpair (absent in files of older shims: 0).
    #[serde(default)]
    pub direct_written: u64,
}

/// Bytes of upgraded connections that went over TCP before their move to the stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MovedBytes {
    /// Written by the app, sent to the peer.
    pub sent: u64,
    /// Received from the peer, read by the app.
    pub received: u64,
    /// Of `sent`, bytes the app's `write`/`send` sent on the TCP socket itself instead of
    /// through the socketpair and the engine (absent in files of older shims: 0).
    #[serde(default)]
    pub direct: u64,
}

/// A copy of the counters, as written to the stats file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsSnapshot {
    /// JSON layout version ([`STATS_FORMAT_VERSION`]).
    pub version: u32,
    /// The process the counters belong to.
    pub pid: u32,
    /// Connections this process made.
    pub client: RoleCounts,
    /// Connections this process accepted.
    pub server: RoleCounts,
    /// Both roles together.
    pub total: PathTotals,
    /// Bytes over upgraded connections.
    pub rdma_bytes: ByteCounts,
    /// Upgraded connections that ended.
    pub rdma_closed: u64,
    /// Upgraded connections that ended by an error or reset.
    pub rdma_resets: u64,
    /// The most bytes the process's engine pinned at once (as its budget counts them).
    #[serde(default)]
    pub pinned_peak: u64,
    /// Connects that took a spare connection (their RDMA connect made ahead).
    #[serde(default)]
    pub spare_connects: u64,
    /// Upgraded connections (both roles) that took a finished connection's queue pair instead
    /// of a connect request of their own (docs/shim-protocol.md, "Reused connections").
    #[serde(default)]
    pub reused_links: u64,
    /// Bytes of connections with a stream that went over TCP before their move to it, or before
    /// they turned out to stay on TCP (the first bytes, which never wait for the stream;
    /// absent in files of older shims: 0).
    #[serde(default)]
    pub tcp_bytes_before_move: MovedBytes,
}

impl StatsSnapshot {
    /// The counts of one role.
    pub fn role(&self, role: Role) -> &RoleCounts {
        match role {
            Role::Client => &self.client,
            Role::Server => &self.server,
        }
    }

    /// One line of JSON, no trailing newline. Never fails (an impossible serializer error
    /// yields `{}`).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }
}

/// Writes `bytes` to `path` so readers see either the old file or the whole new one: a temp file
/// of its own in the same directory (`tempfile`: `.<name>.tmp.<random>`, created exclusively,
/// mode 0666 less umask as `File::create` gives), then `rename`; not synced (stats are a
/// snapshot, not a record). On any error the temp file is removed and the error returned;
/// never panics. The same steps as `rdma_streams_common::atomic_file`, which the shim cannot
/// link.
pub fn write_atomic(path: &FsPath, bytes: &[u8]) -> io::Result<()> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "stats path has no file name component",
        )
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => FsPath::new("."),
    };
    let mut prefix = OsString::from(".");
    prefix.push(name);
    prefix.push(".tmp.");
    let mut tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .permissions(Permissions::from_mode(0o666))
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Where this process's stats go: the `STREAMSHIM_STATS` template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsSink {
    template: OsString,
}

impl StatsSink {
    /// The sink a `STREAMSHIM_STATS` value names (read by [`crate::settings`]); `None` when
    /// unset or empty (write no stats).
    pub fn from_value(value: Option<&OsStr>) -> Option<StatsSink> {
        let v = value?;
        if v.is_empty() {
            return None;
        }
        Some(StatsSink::new(v))
    }

    /// A sink for this template. A template ending in `/` gets [`DEFAULT_FILE_TEMPLATE`] appended.
    pub fn new(template: impl Into<OsString>) -> StatsSink {
        let mut template = template.into();
        if template.as_bytes().ends_with(b"/") {
            template.push(DEFAULT_FILE_TEMPLATE);
        }
        StatsSink { template }
    }

    /// The template as given (after the directory rule).
    pub fn template(&self) -> &OsStr {
        &self.template
    }

    /// The file for process `pid`: `%p` -> pid, `%%` -> `%`, any other `%` kept as is.
    pub fn path_for(&self, pid: u32) -> PathBuf {
        let t = self.template.as_bytes();
        let mut out = Vec::with_capacity(t.len().saturating_add(10));
        let mut i = 0;
        while let Some(&b) = t.get(i) {
            if b == b'%' {
                match t.get(i.saturating_add(1)) {
                    Some(b'p') => {
                        out.extend_from_slice(pid.to_string().as_bytes());
                        i = i.saturating_add(2);
                        continue;
                    }
                    Some(b'%') => {
                        out.push(b'%');
                        i = i.saturating_add(2);
                        continue;
                    }
                    _ => {}
                }
            }
            out.push(b);
            i = i.saturating_add(1);
        }
        PathBuf::from(OsString::from_vec(out))
    }

    /// The file for the calling process (pid read now, so it is right after `fork`).
    pub fn path(&self) -> PathBuf {
        self.path_for(std::process::id())
    }

    /// Writes `stats` to [`StatsSink::path`] atomically and returns the path written.
    pub fn write(&self, stats: &Stats) -> io::Result<PathBuf> {
        let path = self.path();
        stats.write_to(&path)?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_distinct_and_in_range() {
        let mut seen = std::collections::HashSet::new();
        for role in Role::ALL {
            for path in Path::ALL {
                for reason in Reason::ALL {
                    let s = slot(role, path, reason);
                    assert!(s < SLOTS);
                    assert!(seen.insert(s));
                }
            }
        }
        assert_eq!(seen.len(), SLOTS);
    }

    #[test]
    fn record_and_count() {
        let s = Stats::new();
        s.record(Role::Client, Path::Rdma, Reason::Upgraded);
        s.record(Role::Client, Path::Rdma, Reason::Upgraded);
        s.record(Role::Client, Path::Tcp, Reason::Timeout);
        s.record_reason(Role::Server, Reason::PeerRefused);
        s.record_reason(Role::Server, Reason::Upgraded);
        assert_eq!(s.count(Role::Client, Path::Rdma, Reason::Upgraded), 2);
        assert_eq!(s.count(Role::Client, Path::Tcp, Reason::Timeout), 1);
        assert_eq!(s.count(Role::Server, Path::Tcp, Reason::PeerRefused), 1);
        assert_eq!(s.count(Role::Server, Path::Rdma, Reason::Upgraded), 1);
        assert_eq!(s.count(Role::Server, Path::Tcp, Reason::Timeout), 0);
        assert_eq!(s.path_total(Role::Client, Path::Rdma), 2);
        assert_eq!(s.path_total(Role::Client, Path::Tcp), 1);
        s.reset();
        assert_eq!(s.path_total(Role::Client, Path::Rdma), 0);
        assert_eq!(s.snapshot_with_pid(1).total, PathTotals::default());
    }

    #[test]
    fn snapshot_json_layout() {
        let s = Stats::new();
        for _ in 0..3 {
            s.record_reason(Role::Client, Reason::Upgraded);
        }
        s.record_reason(Role::Client, Reason::Policy);
        s.record_reason(Role::Server, Reason::NegativeCache);
        s.add_rdma_bytes_sent(1000);
        s.add_rdma_bytes_sent(24);
        s.add_rdma_bytes_received(7);
        s.add_rdma_bytes_direct(5);
        s.add_rdma_bytes_direct_written(1000);
        s.record_rdma_close(false);
        s.record_rdma_close(true);
        s.note_pinned_peak(4096);
        s.note_pinned_peak(1024);
        s.add_spare_connect();
        s.note_reused_links(2);
        s.note_reused_links(1);
        s.add_before_move(300, 4000);
        s.add_before_move(0, 96);
        s.add_before_move_direct(200);
        let snap = s.snapshot_with_pid(4242);
        assert_eq!(snap.role(Role::Client).get(Path::Rdma, Reason::Upgraded), 3);
        assert_eq!(
            snap.role(Role::Server)
                .get(Path::Tcp, Reason::NegativeCache),
            1
        );
        assert_eq!(snap.role(Role::Server).get(Path::Tcp, Reason::Policy), 0);
        let v: serde_json::Value = serde_json::from_str(&snap.to_json()).unwrap();
        let expected = serde_json::json!({
            "version": 1,
            "pid": 4242,
            "client": {"total": {"rdma": 3, "tcp": 1}, "rdma": {"UPGRADED": 3}, "tcp": {"POLICY": 1}},
            "server": {"total": {"rdma": 0, "tcp": 1}, "rdma": {}, "tcp": {"NEGATIVE_CACHE": 1}},
            "total": {"rdma": 3, "tcp": 2},
            "rdma_bytes": {"sent": 1024, "received": 7, "direct": 5, "direct_written": 1000},
            "rdma_closed": 2,
            "rdma_resets": 1,
            "pinned_peak": 4096,
            "spare_connects": 1,
            "reused_links": 2,
            "tcp_bytes_before_move": {"sent": 300, "received": 4096, "direct": 200}
        });
        assert_eq!(v, expected);
        let back: StatsSnapshot = serde_json::from_value(v).unwrap();
        assert_eq!(back, snap);
        assert!(!snap.to_json().contains('\n'));
    }

    #[test]
    fn concurrent_records_are_not_lost() {
        let s = Stats::new();
        std::thread::scope(|sc| {
            for _ in 0..4 {
                sc.spawn(|| {
                    for _ in 0..10_000 {
                        s.record_reason(Role::Client, Reason::Upgraded);
                        s.add_rdma_bytes_sent(2);
                    }
                });
            }
        });
        assert_eq!(s.count(Role::Client, Path::Rdma, Reason::Upgraded), 40_000);
        assert_eq!(s.snapshot().rdma_bytes.sent, 80_000);
    }

    #[test]
    fn global_is_shared() {
        let a = Stats::global() as *const Stats;
        let b = Stats::global() as *const Stats;
        assert_eq!(a, b);
        let snap = Stats::global().snapshot();
        assert_eq!(snap.pid, std::process::id());
    }

    #[test]
    fn template_expansion() {
        let s = StatsSink::new("/tmp/shim-%p.json");
        assert_eq!(s.path_for(77), PathBuf::from("/tmp/shim-77.json"));
        let s = StatsSink::new("/x/%p/%%p-%q-%p%");
        assert_eq!(s.path_for(5), PathBuf::from("/x/5/%p-%q-5%"));
        let s = StatsSink::new("/var/run/stats/");
        assert_eq!(
            s.path_for(9),
            PathBuf::from("/var/run/stats/streamshim-9.json")
        );
        let s = StatsSink::new("plain.json");
        assert_eq!(s.path_for(9), PathBuf::from("plain.json"));
        assert_eq!(s.template(), OsStr::new("plain.json"));
        assert_eq!(
            StatsSink::new("/t/%p").path(),
            PathBuf::from(format!("/t/{}", std::process::id()))
        );
    }

    #[test]
    fn non_utf8_template_survives() {
        let raw = OsString::from_vec(b"/tmp/\xff-%p".to_vec());
        let s = StatsSink::new(raw);
        assert_eq!(s.path_for(3).as_os_str().as_bytes(), b"/tmp/\xff-3");
    }

    #[test]
    fn from_value_rules() {
        assert_eq!(StatsSink::from_value(None), None);
        assert_eq!(StatsSink::from_value(Some(OsStr::new(""))), None);
        assert_eq!(
            StatsSink::from_value(Some(OsStr::new("/a/%p"))),
            Some(StatsSink::new("/a/%p"))
        );
    }

    #[test]
    fn write_is_atomic_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let s = Stats::new();
        s.record_reason(Role::Client, Reason::Timeout);
        let sink = StatsSink::new(dir.path().join("s-%p.json").into_os_string());
        let written = sink.write(&s).unwrap();
        assert_eq!(
            written,
            dir.path().join(format!("s-{}.json", std::process::id()))
        );
        let text = std::fs::read_to_string(&written).unwrap();
        assert!(text.ends_with('\n'));
        let snap: StatsSnapshot = serde_json::from_str(&text).unwrap();
        assert_eq!(snap.client.get(Path::Tcp, Reason::Timeout), 1);

        // Overwrite replaces the whole file.
        s.record_reason(Role::Client, Reason::Timeout);
        sink.write(&s).unwrap();
        let snap: StatsSnapshot =
            serde_json::from_str(&std::fs::read_to_string(&written).unwrap()).unwrap();
        assert_eq!(snap.client.get(Path::Tcp, Reason::Timeout), 2);

        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn write_errors_do_not_panic() {
        let s = Stats::new();
        let dir = tempfile::tempdir().unwrap();
        // Missing directory.
        let err = s
            .write_to(&dir.path().join("missing/dir/s.json"))
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        // No file name.
        assert_eq!(
            s.write_to(FsPath::new("/")).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        // Target is an existing directory: rename fails, temp file cleaned up.
        let target = dir.path().join("isdir");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("keep"), b"x").unwrap();
        assert!(s.write_to(&target).is_err());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![OsString::from("isdir")]);
    }
}
