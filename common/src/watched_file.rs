//! Keeps a config file current while a process runs: a generic, reloadable, last-good-wins
//! view of one file, shared by the device plugin (pools) and the injector (profiles).
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
//!                       good and different: watch::Sender<Arc<T>> ------+-> subscribers
//!                       bad: error! + counted, the last good config stays
//! ```
//!
//! Only the first load can fail the caller (a broken config at startup should stop the
//! process with a clear message). A missing file is not an error: [`Watchable::fallback`] is
//! used and the directory is watched for the file to appear.

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

use crate::report::Report;

/// A config type that can be watched: parsed from the file's text, with a fallback for when
/// there is no file.
pub trait Watchable: Clone + PartialEq + Send + Sync + 'static {
    /// Parse or validation failure; operators read its [`Report`] (message and causes).
    type Error: std::error::Error + Send + Sync + 'static;

    /// Parses and validates the file's text; `origin` names the file in messages.
    fn parse(text: &str, origin: &str) -> Result<Self, Self::Error>;

    /// The value in force when there is no file (no path, or the file does not exist yet).
    fn fallback() -> Self;

    /// The error for a file that exists but cannot be read.
    fn read_error(path: PathBuf, source: std::io::Error) -> Self::Error;

    /// A short description for the "reloaded" log line.
    fn summary(&self) -> String;
}

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
pub struct WatchedFile<T: Watchable> {
    tx: Arc<watch::Sender<Arc<T>>>,
    stats: Arc<ReloadStats>,
    path: Option<PathBuf>,
    task: Option<JoinHandle<()>>,
}

impl<T: Watchable> WatchedFile<T> {
    /// A receiver that sees every new config (identical re-reads publish nothing).
    pub fn subscribe(&self) -> watch::Receiver<Arc<T>> {
        self.tx.subscribe()
    }

    /// The config in force.
    pub fn current(&self) -> Arc<T> {
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

impl<T: Watchable> Drop for WatchedFile<T> {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// [`spawn_with`] with the default debounce and `notify` on.
pub fn spawn<T: Watchable>(
    path: Option<PathBuf>,
    poll: Duration,
) -> Result<WatchedFile<T>, T::Error> {
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
pub fn spawn_with<T: Watchable>(
    path: Option<PathBuf>,
    options: WatchOptions,
) -> Result<WatchedFile<T>, T::Error> {
    let stats = Arc::new(ReloadStats::default());
    let Some(path) = path else {
        let (tx, _) = watch::channel(Arc::new(T::fallback()));
        return Ok(WatchedFile {
            tx: Arc::new(tx),
            stats,
            path: None,
            task: None,
        });
    };

    let origin = path.display().to_string();
    let (initial, seen) = match std::fs::read_to_string(&path) {
        Ok(text) => (T::parse(&text, &origin)?, Seen::Text(text)),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            let fallback = T::fallback();
            info!(
                path = %origin,
                using = %fallback.summary(),
                "config file does not exist yet; using the built-in default and watching for the file"
            );
            stats.file_missing.store(true, Ordering::Relaxed);
            (fallback, Seen::Missing)
        }
        Err(source) => return Err(T::read_error(path, source)),
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
    Ok(WatchedFile {
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
struct Watch<T: Watchable> {
    path: PathBuf,
    /// The path as shown in logs and errors.
    origin: String,
    dir: PathBuf,
    file_name: OsString,
    options: WatchOptions,
    tx: Arc<watch::Sender<Arc<T>>>,
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

impl<T: Watchable> Watch<T> {
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
                        error = %Report(&e),
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
                let parsed = T::parse(&text, &self.origin);
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
                let e = T::read_error(self.path.clone(), source);
                self.reject(&e, trigger);
            }
        }
    }

    fn accept(&mut self, new: T, trigger: &'static str) {
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
        info!(trigger, config = %new.summary(), "config reloaded");
        self.tx.send_replace(Arc::new(new));
        self.stats.reloads.fetch_add(1, Ordering::Relaxed);
    }

    fn reject(&self, e: &T::Error, trigger: &'static str) {
        let failures = self.stats.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let report = Report(e).to_string();
        error!(
            trigger,
            error = %report,
            failures,
            "config reload failed; keeping the last good config"
        );
        self.stats.set_last_error(Some(report));
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
                debug!(error = %Report(e), "notify error; re-reading the config");
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
mod tests;
