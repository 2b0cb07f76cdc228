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

/// The pool config's side of the watch: what a file's text, a bad file and an unreadable path
/// become. [`WatchedFile`] itself (reloads, last good, symlink swaps, polling) is tested in
/// `rdma_streams_common::watched_file`.
#[cfg(test)]
mod tests {
    use super::*;

    /// Long enough that only events can explain a reload.
    const NO_POLL: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn a_config_file_is_watched_as_a_config() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.yaml");
        std::fs::write(
            &path,
            "pools:\n  - resourceName: rdma-streams.io/b\n    slotsPerHca: 8\n",
        )
        .expect("write");
        let cw = spawn(Some(path.clone()), NO_POLL).expect("spawn");
        assert_eq!(cw.current().pools[0].resource_name, "rdma-streams.io/b");
        assert_eq!(cw.current().pools[0].slots_per_hca, 8);
        let summary = cw.current().summary();
        assert!(
            summary.starts_with(r#"pools ["rdma-streams.io/b"], resync "#),
            "{summary}"
        );
    }

    #[tokio::test]
    async fn startup_errors_are_config_errors_and_no_path_is_the_default_pool() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.yaml");
        std::fs::write(
            &path,
            "pools:\n  - resourceName: rdma-streams.io/x\n    bogus: 1\n",
        )
        .expect("write");
        let err = spawn(Some(path.clone()), NO_POLL).expect_err("bad config at startup");
        assert!(matches!(err, ConfigError::Parse { .. }), "{err}");
        let text = rdma_streams_common::report::Report(&err).to_string();
        assert!(text.contains("unknown field `bogus`"), "{text}");
        assert!(text.contains("line 3 column 5"), "{text}");

        let err = spawn(Some(dir.path().to_path_buf()), NO_POLL).expect_err("a directory");
        assert!(matches!(err, ConfigError::Read { .. }), "{err}");

        let cw = spawn(None, NO_POLL).expect("default");
        assert_eq!(*cw.current(), Config::default());
    }
}
