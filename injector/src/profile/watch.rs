//! The live profile config: the shared [`WatchedFile`] over [`Config`]. A missing file means
//! the built-in default; a bad new file keeps the last good one.

use std::{path::PathBuf, time::Duration};

pub use rdma_streams_common::watched_file::{DEFAULT_POLL, ReloadStats, Watchable, WatchedFile};

use crate::profile::{self, Config, ProfileError};

/// The live profiles.
pub type ProfileWatch = WatchedFile<Config>;

impl Watchable for Config {
    type Error = ProfileError;

    fn parse(text: &str, origin: &str) -> Result<Self, ProfileError> {
        profile::parse(text, origin)
    }

    fn fallback() -> Self {
        Config::builtin_default()
    }

    fn read_error(path: PathBuf, source: std::io::Error) -> ProfileError {
        ProfileError::Read { path, source }
    }

    fn summary(&self) -> String {
        format!(
            "profiles {:?}, default {}",
            self.profile_names(),
            self.default_profile
        )
    }
}

/// Loads `path` (or the built-in default) and keeps watching it.
pub fn spawn(path: Option<PathBuf>, poll: Duration) -> Result<ProfileWatch, ProfileError> {
    rdma_streams_common::watched_file::spawn(path, poll)
}
