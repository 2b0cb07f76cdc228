//! Keeps the config current while the plugin runs.
//!
//! The parent directory of the config file is watched (non-recursively) with `notify`, which
//! sees both an edit in place and a Kubernetes ConfigMap update. kubelet projects a ConfigMap
//! as `config.yaml -> ..data/config.yaml` and `..data -> ..<timestamp>/`, and updates it by
//! writing a new `..<timestamp>/` and renaming a fresh `..data_tmp` symlink over `..data`; the
//! rename happens in the parent directory, so it is seen there. After the events settle
//! ([`DEFAULT_DEBOUNCE`] of quiet) the file is read and parsed again. A slow poll
//! ([`DEFAULT_POLL`]) re-reads it as well, in case events are lost, the directory is replaced,
//! inotify cannot be used at all, or the file is a symlink whose target is edited elsewhere.
//!
//! ```text
//!   notify thread --try_send--> mpsc(1) --> watch task --debounce--> read + parse
//!                                   poll tick ----^                     |
//!                       good and different: watch::Sender<Arc<Config>> -+-> subscribers
//!                       bad: error! + counted, the last good config stays
//! ```
//!
//! Only the first load can fail the caller (a broken config at startup should stop the
//! process with a clear message). A missing file is not an error: the default config is used
//! and the directory is watched for the file to appear.

use std::ffi::{OsStr, OsString};
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::config::{self, Config, ConfigError};

/// How often the file is re-read even without events.
pub const DEFAULT_POLL: Duration = Duration::from_secs(10);
/// How long events must be quiet before the file is read.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(200);
/// The longest a burst of events can delay a read.
const DEBOUNCE_MAX: Duration = Duration::from_secs(2);

/// Tunables of [`spawn_with`].
#[derive(Clone, Debug)]
pub struct WatchOptions {
    /// Re-read period without events ([`DEFAULT_POLL`]).
    pub poll: Duration,
    /// Quiet time after an event before reading ([`DEFAULT_DEBOUNCE`]).
    pub debounce: Duration,
    /// Use `notify` (inotify); with `false` only the poll runs.
    pub use_notify: bool,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            poll: DEFAULT_POLL,
            debounce: DEFAULT_DEBOUNCE,
            use_notify: true,
        }
    }
}

/// Counters of the watch, shared with the metrics and readiness code.
#[derive(Debug, Default)]
pub struct ReloadStats {
    checks: AtomicU64,
    reloads: AtomicU64,
    failures: AtomicU64,
    file_missing: AtomicBool,
    last_error: Mutex<Option<String>>,
}

impl ReloadStats {
    /// How many times the file has been looked at since startup.
    pub fn checks(&self) -> u64 {
        self.checks.load(Ordering::Relaxed)
    }

    /// How many new configs have been published since startup.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// How many distinct bad file contents (or read errors) have been rejected since startup.
    pub fn reload_failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Whether the config file is absent right now (the config in force is then the default,
    /// or the last good one if the file went away).
    pub fn file_missing(&self) -> bool {
        self.file_missing.load(Ordering::Relaxed)
    }

    /// Why the file on disk is not the config in force, if it is not.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .map_or_else(|poisoned| poisoned.into_inner().clone(), |e| e.clone())
    }

    fn set_last_error(&self, error: Option<String>) {
        match self.last_error.lock() {
            Ok(mut e) => *e = error,
            Err(poisoned) => *poisoned.into_inner() = error,
        }
    }
}

/// The live config: subscribe for changes, read the current one, see the counters.
///
/// Dropping it stops the watch; receivers then see the channel closed.
#[derive(Debug)]
pub struct ConfigWatch {
    tx: Arc<watch::Sender<Arc<Config>>>,
    stats: Arc<ReloadStats>,
    path: Option<PathBuf>,
    task: Option<JoinHandle<()>>,
}

impl ConfigWatch {
    /// A receiver that sees every new config (identical re-reads publish nothing).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Config>> {
        self.tx.subscribe()
    }

    /// The config in force.
    pub fn current(&self) -> Arc<Config> {
        self.tx.borrow().clone()
    }

    /// The watched file, `None` when running on the built-in default.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The counters, to hand to metrics or readiness code.
    pub fn stats(&self) -> Arc<ReloadStats> {
        self.stats.clone()
    }

    /// See [`ReloadStats::reloads`].
    pub fn reloads(&self) -> u64 {
        self.stats.reloads()
    }

    /// See [`ReloadStats::reload_failures`].
    pub fn reload_failures(&self) -> u64 {
        self.stats.reload_failures()
    }
}

impl Drop for ConfigWatch {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// [`spawn_with`] with the default debounce and `notify` on.
pub fn spawn(path: Option<PathBuf>, poll: Duration) -> Result<ConfigWatch, ConfigError> {
    spawn_with(
        path,
        WatchOptions {
            poll,
            ..WatchOptions::default()
        },
    )
}

/// Loads the config at `path` and starts watching it.
///
/// `None` gives the default config and no watching. A missing file gives the default config
/// and a watch for the file to appear. A file that cannot be read, parsed or validated now is
/// an error. The directory watch is in place when this returns, so a change made afterwards
/// is seen.
///
/// # Panics
///
/// When called outside a Tokio runtime (the watch runs as a task).
pub fn spawn_with(
    path: Option<PathBuf>,
    options: WatchOptions,
) -> Result<ConfigWatch, ConfigError> {
    let stats = Arc::new(ReloadStats::default());
    let Some(path) = path else {
        let (tx, _) = watch::channel(Arc::new(config::load(None)?));
        return Ok(ConfigWatch {
            tx: Arc::new(tx),
            stats,
            path: None,
            task: None,
        });
    };

    let origin = path.display().to_string();
    let (initial, seen) = match std::fs::read_to_string(&path) {
        Ok(text) => (config::parse(&text, &origin)?, Seen::Text(text)),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            info!(
                path = %origin,
                resource = config::DEFAULT_RESOURCE,
                "config file does not exist yet; using the default pool of all RDMA devices \
                 and watching for the file"
            );
            stats.file_missing.store(true, Ordering::Relaxed);
            (Config::default(), Seen::Missing)
        }
        Err(source) => return Err(ConfigError::Read { path, source }),
    };
    let from_file = matches!(seen, Seen::Text(_));
    let (tx, _) = watch::channel(Arc::new(initial));
    let tx = Arc::new(tx);

    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path
        .file_name()
        .map(OsStr::to_os_string)
        .unwrap_or_default();
    let (events_tx, events_rx) = mpsc::channel(1);
    let mut watcher = Watch {
        path: path.clone(),
        origin,
        dir,
        file_name,
        options,
        tx: tx.clone(),
        stats: stats.clone(),
        seen,
        from_file,
        events_tx,
        notify: None,
        notify_failure_logged: false,
    };
    if watcher.options.use_notify {
        watcher.start_notify();
    }
    let span = info_span!("config_watch", path = %watcher.origin);
    let task = tokio::spawn(watcher.run(events_rx).instrument(span));
    Ok(ConfigWatch {
        tx,
        stats,
        path: Some(path),
        task: Some(task),
    })
}

/// What the last look at the file found.
#[derive(PartialEq)]
enum Seen {
    Missing,
    Text(String),
    ReadError(String),
}

/// The state of the watch task.
struct Watch {
    path: PathBuf,
    /// The path as shown in logs and errors.
    origin: String,
    dir: PathBuf,
    file_name: OsString,
    options: WatchOptions,
    tx: Arc<watch::Sender<Arc<Config>>>,
    stats: Arc<ReloadStats>,
    seen: Seen,
    /// Whether the config in force came from the file (rather than being the default).
    from_file: bool,
    /// Kept so that the event channel never closes, even without a notify watcher.
    events_tx: mpsc::Sender<()>,
    /// The watcher with the identity (device, inode) of the directory it watches.
    notify: Option<(RecommendedWatcher, (u64, u64))>,
    notify_failure_logged: bool,
}

impl Watch {
    async fn run(mut self, mut events: mpsc::Receiver<()>) {
        let mut poll =
            tokio::time::interval_at(Instant::now() + self.options.poll, self.options.poll);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                Some(()) = events.recv() => {
                    debounce(&mut events, self.options.debounce).await;
                    self.check("event").await;
                }
                _ = poll.tick() => {
                    if self.options.use_notify {
                        self.refresh_notify().await;
                    }
                    self.check("poll").await;
                }
            }
        }
    }

    /// Starts the directory watcher; on failure the poll carries on alone.
    fn start_notify(&mut self) {
        match start_notify(&self.dir, &self.file_name, self.events_tx.clone()) {
            Ok(w) => {
                if self.notify_failure_logged {
                    info!(dir = %self.dir.display(), "watching the config directory again");
                }
                self.notify_failure_logged = false;
                self.notify = Some(w);
            }
            Err(e) => {
                if !self.notify_failure_logged {
                    warn!(
                        dir = %self.dir.display(),
                        error = %e,
                        poll_seconds = self.options.poll.as_secs_f64(),
                        "cannot watch the config directory; falling back to polling"
                    );
                    self.notify_failure_logged = true;
                }
                self.notify = None;
            }
        }
    }

    /// Restarts the watcher when it failed before or the directory was replaced (an inotify
    /// watch follows the old inode).
    async fn refresh_notify(&mut self) {
        let now = tokio::fs::metadata(&self.dir)
            .await
            .ok()
            .map(|m| (m.dev(), m.ino()));
        let stale = match (&self.notify, now) {
            (None, _) => true,
            (Some((_, id)), Some(now)) => *id != now,
            (Some(_), None) => false,
        };
        if stale {
            if self.notify.is_some() {
                info!(dir = %self.dir.display(), "config directory was replaced; watching it anew");
            }
            self.start_notify();
        }
    }

    /// Reads the file and publishes it if it is good and new.
    async fn check(&mut self, trigger: &'static str) {
        let read = tokio::fs::read_to_string(&self.path).await;
        self.stats.checks.fetch_add(1, Ordering::Relaxed);
        match read {
            Ok(text) => {
                if matches!(&self.seen, Seen::Text(t) if *t == text) {
                    return;
                }
                if self.seen == Seen::Missing {
                    info!(trigger, "config file appeared");
                }
                self.stats.file_missing.store(false, Ordering::Relaxed);
                let parsed = config::parse(&text, &self.origin);
                self.seen = Seen::Text(text);
                match parsed {
                    Ok(new) => self.accept(new, trigger),
                    Err(e) => self.reject(&e, trigger),
                }
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                if self.seen == Seen::Missing {
                    return;
                }
                self.seen = Seen::Missing;
                self.stats.file_missing.store(true, Ordering::Relaxed);
                if self.from_file {
                    warn!(trigger, "config file is gone; keeping the last good config");
                } else {
                    debug!(
                        trigger,
                        "config file is still absent; keeping the default config"
                    );
                }
            }
            Err(source) => {
                let message = source.to_string();
                if matches!(&self.seen, Seen::ReadError(m) if *m == message) {
                    return;
                }
                self.seen = Seen::ReadError(message);
                let e = ConfigError::Read {
                    path: self.path.clone(),
                    source,
                };
                self.reject(&e, trigger);
            }
        }
    }

    fn accept(&mut self, new: Config, trigger: &'static str) {
        self.from_file = true;
        let was_failing = self.stats.last_error().is_some();
        self.stats.set_last_error(None);
        if **self.tx.borrow() == new {
            if was_failing {
                info!(trigger, "config file is valid again and unchanged");
            } else {
                debug!(trigger, "config file re-read; no change");
            }
            return;
        }
        let pools: Vec<&str> = new.pools.iter().map(|p| p.resource_name.as_str()).collect();
        info!(
            trigger,
            pools = ?pools,
            resync_seconds = new.resync.as_secs(),
            "config reloaded"
        );
        self.tx.send_replace(Arc::new(new));
        self.stats.reloads.fetch_add(1, Ordering::Relaxed);
    }

    fn reject(&self, e: &ConfigError, trigger: &'static str) {
        let failures = self.stats.failures.fetch_add(1, Ordering::Relaxed) + 1;
        error!(
            trigger,
            error = %e,
            failures,
            "config reload failed; keeping the last good config"
        );
        self.stats.set_last_error(Some(e.to_string()));
    }
}

/// Waits until no event has come for `quiet` (at most [`DEBOUNCE_MAX`] in all).
async fn debounce(events: &mut mpsc::Receiver<()>, quiet: Duration) {
    let deadline = Instant::now() + DEBOUNCE_MAX;
    loop {
        let wait = quiet.min(deadline.saturating_duration_since(Instant::now()));
        if wait.is_zero() {
            return;
        }
        match tokio::time::timeout(wait, events.recv()).await {
            Ok(Some(())) => continue,
            Ok(None) | Err(_) => return,
        }
    }
}

/// Watches `dir` and pokes `events` for every event that may concern `file_name`. The callback
/// runs on notify's thread and never blocks: a full channel means a check is pending already.
fn start_notify(
    dir: &Path,
    file_name: &OsStr,
    events: mpsc::Sender<()>,
) -> notify::Result<(RecommendedWatcher, (u64, u64))> {
    let id = std::fs::metadata(dir)
        .map(|m| (m.dev(), m.ino()))
        .map_err(notify::Error::io)?;
    let file_name = file_name.to_os_string();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let relevant = match &res {
            Ok(event) => is_relevant(event, &file_name),
            Err(e) => {
                debug!(error = %e, "notify error; re-reading the config");
                true
            }
        };
        if relevant {
            // Full: a check is already queued. Closed: the watch is shutting down.
            let _ = events.try_send(());
        }
    })?;
    watcher.watch(dir, RecursiveMode::NonRecursive)?;
    Ok((watcher, id))
}

/// Whether a directory event may change what the config path reads as: anything touching the
/// file itself or a `..`-prefixed ConfigMap entry (`..data`, `..data_tmp`, `..<timestamp>`),
/// and any event notify could not attribute. Opens and read-only closes (our own reads among
/// them) are not.
fn is_relevant(event: &notify::Event, file_name: &OsStr) -> bool {
    if let EventKind::Access(kind) = event.kind
        && kind != AccessKind::Close(AccessMode::Write)
    {
        return false;
    }
    if event.need_rescan() || event.paths.is_empty() {
        return true;
    }
    event.paths.iter().any(|p| {
        p.file_name()
            .is_some_and(|name| name == file_name || name.as_encoded_bytes().starts_with(b".."))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::os::unix::fs::symlink;

    const GOOD_A: &str = "pools:\n  - resourceName: rdma-streams.io/a\n";
    const GOOD_B: &str = "pools:\n  - resourceName: rdma-streams.io/b\n    slotsPerHca: 8\n";
    const GOOD_C: &str = "pools:\n  - resourceName: rdma-streams.io/c\n";
    const BAD: &str = "pools:\n  - resourceName: rdma-streams.io/x\n    bogus: 1\n";
    /// Long enough that only events can explain a reload.
    const NO_POLL: Duration = Duration::from_secs(3600);
    const LIMIT: Duration = Duration::from_secs(5);

    fn init_tracing() {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_max_level(tracing::Level::DEBUG)
            .try_init();
    }

    async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
        match tokio::time::timeout(LIMIT, fut).await {
            Ok(v) => v,
            Err(_) => panic!("timed out waiting for {what}"),
        }
    }

    /// Polls `cond` until it holds, within [`LIMIT`].
    async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
        within(what, async {
            while !cond() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    }

    async fn next_resource(rx: &mut watch::Receiver<Arc<Config>>) -> String {
        within("a new config", rx.changed())
            .await
            .expect("sender alive");
        rx.borrow_and_update().pools[0].resource_name.clone()
    }

    #[tokio::test]
    async fn edit_in_place_is_published() {
        init_tracing();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, GOOD_A).expect("write");
        let cw = spawn(Some(path.clone()), NO_POLL).expect("spawn");
        let mut rx = cw.subscribe();
        assert_eq!(cw.current().pools[0].resource_name, "rdma-streams.io/a");

        std::fs::write(&path, GOOD_B).expect("write");
        assert_eq!(next_resource(&mut rx).await, "rdma-streams.io/b");
        assert_eq!(cw.current().pools[0].slots_per_hca, 8);
        assert_eq!((cw.reloads(), cw.reload_failures()), (1, 0));

        // Our own reads (opens) must not trigger further reads.
        let checks = cw.stats().checks();
        tokio::time::sleep(DEFAULT_DEBOUNCE * 3).await;
        assert_eq!(cw.stats().checks(), checks);
    }

    #[tokio::test]
    async fn bad_edit_keeps_last_good_then_good_edit_is_published() {
        init_tracing();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, GOOD_A).expect("write");
        let cw = spawn(Some(path.clone()), NO_POLL).expect("spawn");
        let mut rx = cw.subscribe();

        std::fs::write(&path, BAD).expect("write");
        eventually("the failure to be counted", || cw.reload_failures() >= 1).await;
        assert!(!rx.has_changed().expect("sender alive"));
        assert_eq!(cw.current().pools[0].resource_name, "rdma-streams.io/a");
        let last_error = cw.stats().last_error().expect("an error is recorded");
        assert!(last_error.contains("unknown field `bogus`"), "{last_error}");
        assert!(last_error.contains("line 3 column 5"), "{last_error}");

        std::fs::write(&path, GOOD_C).expect("write");
        assert_eq!(next_resource(&mut rx).await, "rdma-streams.io/c");
        assert_eq!(cw.reloads(), 1);
        assert_eq!(cw.stats().last_error(), None);
    }

    #[tokio::test]
    async fn same_config_publishes_nothing() {
        init_tracing();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, GOOD_A).expect("write");
        let cw = spawn(Some(path.clone()), NO_POLL).expect("spawn");
        let rx = cw.subscribe();
        let checks = cw.stats().checks();

        // Different text, same config.
        std::fs::write(&path, format!("# a comment\n{GOOD_A}")).expect("write");
        eventually("the file to be re-read", || cw.stats().checks() > checks).await;
        assert!(!rx.has_changed().expect("sender alive"));
        assert_eq!((cw.reloads(), cw.reload_failures()), (0, 0));
    }

    /// Writes `..<ts>/config.yaml` and points `..data` at it the way kubelet does.
    fn configmap_update(dir: &Path, ts: &str, text: &str, old: Option<&str>) {
        let data_dir = dir.join(ts);
        std::fs::create_dir(&data_dir).expect("mkdir");
        std::fs::write(data_dir.join("config.yaml"), text).expect("write");
        symlink(ts, dir.join("..data_tmp")).expect("symlink");
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("rename");
        if let Some(old) = old {
            std::fs::remove_dir_all(dir.join(old)).expect("remove old");
        }
    }

    #[tokio::test]
    async fn configmap_symlink_swaps_are_picked_up() {
        init_tracing();
        let dir = tempfile::tempdir().expect("tempdir");
        let ts = [
            "..2026_11_30_01_02_03.123",
            "..2026_11_30_01_05_00.456",
            "..2026_11_30_01_09_59.789",
        ];
        configmap_update(dir.path(), ts[0], GOOD_A, None);
        symlink("..data/config.yaml", dir.path().join("config.yaml")).expect("symlink");

        let cw = spawn(Some(dir.path().join("config.yaml")), NO_POLL).expect("spawn");
        let mut rx = cw.subscribe();
        assert_eq!(cw.current().pools[0].resource_name, "rdma-streams.io/a");

        configmap_update(dir.path(), ts[1], GOOD_B, Some(ts[0]));
        assert_eq!(next_resource(&mut rx).await, "rdma-streams.io/b");
        configmap_update(dir.path(), ts[2], GOOD_C, Some(ts[1]));
        assert_eq!(next_resource(&mut rx).await, "rdma-streams.io/c");
        assert_eq!(cw.reloads(), 2);
    }

    #[tokio::test]
    async fn missing_file_means_default_until_created() {
        init_tracing();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.yaml");
        let cw = spawn(Some(path.clone()), NO_POLL).expect("spawn");
        let mut rx = cw.subscribe();
        assert_eq!(*cw.current(), Config::default());
        assert!(cw.stats().file_missing());

        std::fs::write(&path, GOOD_A).expect("write");
        assert_eq!(next_resource(&mut rx).await, "rdma-streams.io/a");
        assert!(!cw.stats().file_missing());
    }

    #[tokio::test]
    async fn deleted_file_keeps_last_good() {
        init_tracing();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, GOOD_A).expect("write");
        let cw = spawn(Some(path.clone()), NO_POLL).expect("spawn");
        let mut rx = cw.subscribe();

        std::fs::remove_file(&path).expect("remove");
        eventually("the deletion to be seen", || cw.stats().file_missing()).await;
        assert!(!rx.has_changed().expect("sender alive"));
        assert_eq!(cw.current().pools[0].resource_name, "rdma-streams.io/a");
        assert_eq!(cw.reload_failures(), 0);

        // Still watching.
        std::fs::write(&path, GOOD_B).expect("write");
        assert_eq!(next_resource(&mut rx).await, "rdma-streams.io/b");
    }

    #[tokio::test]
    async fn polling_alone_picks_up_changes() {
        init_tracing();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, GOOD_A).expect("write");
        let options = WatchOptions {
            poll: Duration::from_millis(50),
            use_notify: false,
            ..WatchOptions::default()
        };
        let cw = spawn_with(Some(path.clone()), options).expect("spawn");
        let mut rx = cw.subscribe();
        std::fs::write(&path, GOOD_B).expect("write");
        assert_eq!(next_resource(&mut rx).await, "rdma-streams.io/b");
    }

    #[tokio::test]
    async fn unwatchable_directory_falls_back_to_polling() {
        init_tracing();
        let dir = tempfile::tempdir().expect("tempdir");
        // The directory does not exist yet, so notify cannot watch it.
        let sub = dir.path().join("later");
        let path = sub.join("config.yaml");
        let options = WatchOptions {
            poll: Duration::from_millis(50),
            ..WatchOptions::default()
        };
        let cw = spawn_with(Some(path.clone()), options).expect("spawn");
        let mut rx = cw.subscribe();
        assert_eq!(*cw.current(), Config::default());
        std::fs::create_dir(&sub).expect("mkdir");
        std::fs::write(&path, GOOD_A).expect("write");
        assert_eq!(next_resource(&mut rx).await, "rdma-streams.io/a");
    }

    #[tokio::test]
    async fn startup_errors_and_no_path() {
        init_tracing();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, BAD).expect("write");
        let err = spawn(Some(path.clone()), NO_POLL).expect_err("bad config at startup");
        assert!(matches!(err, ConfigError::Parse { .. }), "{err}");

        let err = spawn(Some(dir.path().to_path_buf()), NO_POLL).expect_err("a directory");
        assert!(matches!(err, ConfigError::Read { .. }), "{err}");

        let cw = spawn(None, NO_POLL).expect("default");
        assert_eq!(*cw.current(), Config::default());
        assert_eq!(cw.path(), None);
        let mut rx = cw.subscribe();
        // Nothing is ever published, but the channel stays open.
        assert!(
            tokio::time::timeout(Duration::from_millis(100), rx.changed())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn dropping_the_watch_closes_the_channel() {
        init_tracing();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, GOOD_A).expect("write");
        let cw = spawn(Some(path), NO_POLL).expect("spawn");
        let mut rx = cw.subscribe();
        drop(cw);
        assert!(within("the channel to close", rx.changed()).await.is_err());
    }

    #[test]
    fn relevant_events() {
        use notify::event::{CreateKind, ModifyKind, RemoveKind, RenameMode};
        let name = OsStr::new("config.yaml");
        let ev = |kind, path: &str| notify::Event::new(kind).add_path(PathBuf::from(path));
        assert!(is_relevant(
            &ev(EventKind::Modify(ModifyKind::Any), "/c/config.yaml"),
            name
        ));
        assert!(is_relevant(
            &ev(
                EventKind::Access(AccessKind::Close(AccessMode::Write)),
                "/c/config.yaml"
            ),
            name
        ));
        assert!(is_relevant(
            &ev(EventKind::Create(CreateKind::Any), "/c/..data_tmp"),
            name
        ));
        assert!(is_relevant(
            &ev(
                EventKind::Modify(ModifyKind::Name(RenameMode::To)),
                "/c/..data"
            ),
            name
        ));
        assert!(is_relevant(
            &ev(EventKind::Remove(RemoveKind::Any), "/c/config.yaml"),
            name
        ));
        assert!(is_relevant(&notify::Event::new(EventKind::Any), name));
        assert!(!is_relevant(
            &ev(
                EventKind::Access(AccessKind::Open(AccessMode::Any)),
                "/c/config.yaml"
            ),
            name
        ));
        assert!(!is_relevant(
            &ev(EventKind::Modify(ModifyKind::Any), "/c/other.yaml"),
            name
        ));
    }
}
