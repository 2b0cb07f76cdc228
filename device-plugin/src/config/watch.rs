//! Keeps the pool config current while the plugin runs: the shared [`WatchedFile`] over
//! [`Config`]. A missing file means the default pool; a bad new file keeps the last good one.

use std::path::PathBuf;
use std::time::Duration;

pub use rdma_streams_common::watched_file::DEFAULT_POLL;
use rdma_streams_common::watched_file::{Watchable, WatchedFile};

use crate::config::{self, Config, ConfigError};

/// The live pool config.
pub type ConfigWatch = WatchedFile<Config>;

impl Watchable for Config {
    type Error = ConfigError;

    fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        config::parse(text, origin)
    }

    fn fallback() -> Self {
        Config::default()
    }

    fn read_error(path: PathBuf, source: std::io::Error) -> ConfigError {
        ConfigError::Read { path, source }
    }

    fn summary(&self) -> String {
        let pools: Vec<&str> = self
            .pools
            .iter()
            .map(|p| p.resource_name.as_str())
            .collect();
        format!("pools {pools:?}, resync {}s", self.resync.as_secs())
    }
}

/// Loads the config at `path` (see [`rdma_streams_common::watched_file::spawn`]).
pub fn spawn(path: Option<PathBuf>, poll: Duration) -> Result<ConfigWatch, ConfigError> {
    rdma_streams_common::watched_file::spawn(path, poll)
}

#[cfg(test)]
mod tests {
    use rdma_streams_common::watched_file::{DEFAULT_DEBOUNCE, WatchOptions, spawn_with};

    use super::*;
    use std::future::Future;
    use std::os::unix::fs::symlink;
    use std::path::Path;
    use std::sync::Arc;
    use tokio::sync::watch;

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
        let cw = spawn_with::<Config>(Some(path.clone()), options).expect("spawn");
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
        let cw = spawn_with::<Config>(Some(path.clone()), options).expect("spawn");
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
}
