//! inotify on kubelet's socket folder: who created or removed which file.
//!
//! kubelet restarts show up as its sockets (ours included) being removed and a new
//! `kubelet.sock` being created. Runners subscribe to these events and also poll, so a lost
//! event (or a watch that could not be set up) delays recovery by one poll period at most.

use std::path::Path;

use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use rdma_streams_common::report::Report;
use tokio::sync::broadcast;
use tracing::{debug, warn};

/// A file appeared in or vanished from the watched folder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirEvent {
    Created(String),
    Removed(String),
}

/// A live watch on one folder; events fan out to every subscriber.
pub struct DirWatch {
    tx: broadcast::Sender<DirEvent>,
    _watcher: Option<RecommendedWatcher>,
}

impl DirWatch {
    /// Watches `dir` (created when missing). When inotify cannot be used the watch still
    /// exists but never fires; callers poll as well.
    pub fn new(dir: &Path) -> Self {
        let (tx, _) = broadcast::channel(256);
        if let Err(error) = std::fs::create_dir_all(dir) {
            warn!(dir = %dir.display(), error = %Report(&error), "cannot create the kubelet socket folder");
        }
        let sender = tx.clone();
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let Ok(event) = res else { return };
            let make: fn(String) -> DirEvent = match event.kind {
                EventKind::Create(_) => DirEvent::Created,
                EventKind::Remove(_) => DirEvent::Removed,
                // A rename over an existing name shows up as Modify(Name): report both sides.
                EventKind::Modify(notify::event::ModifyKind::Name(mode)) => match mode {
                    notify::event::RenameMode::From => DirEvent::Removed,
                    _ => DirEvent::Created,
                },
                _ => return,
            };
            for path in &event.paths {
                if let Some(name) = path.file_name() {
                    let _ = sender.send(make(name.to_string_lossy().into_owned()));
                }
            }
        })
        .and_then(|mut w| w.watch(dir, RecursiveMode::NonRecursive).map(|()| w));
        let watcher = match watcher {
            Ok(w) => {
                debug!(dir = %dir.display(), "watching kubelet socket folder");
                Some(w)
            }
            Err(error) => {
                warn!(dir = %dir.display(), error = %Report(&error), "inotify unavailable; relying on polling");
                None
            }
        };
        Self {
            tx,
            _watcher: watcher,
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<DirEvent> {
        self.tx.subscribe()
    }

    /// Whether inotify is active.
    #[cfg(test)]
    pub fn is_active(&self) -> bool {
        self._watcher.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn reports_create_and_remove() {
        let dir = tempfile::tempdir().unwrap();
        let w = DirWatch::new(dir.path());
        assert!(w.is_active());
        let mut rx = w.subscribe();
        let f = dir.path().join("kubelet.sock");
        std::fs::write(&f, "").unwrap();
        std::fs::remove_file(&f).unwrap();
        let mut seen = Vec::new();
        while seen.len() < 2 {
            let ev = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .unwrap()
                .unwrap();
            seen.push(ev);
        }
        assert_eq!(
            seen,
            [
                DirEvent::Created("kubelet.sock".into()),
                DirEvent::Removed("kubelet.sock".into())
            ]
        );
    }
}
