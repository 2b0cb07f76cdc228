//! Where a policy comes from: [`PolicySource`], the value of `STREAMSHIM_POLICY`.

use std::ffi::OsStr;
use std::path::PathBuf;

use super::{Policy, PolicyError};

/// Where the policy comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicySource {
    /// `STREAMSHIM_POLICY` unset or empty: [`Policy::allow_all`].
    Default,
    /// A policy file.
    File(PathBuf),
}

impl PolicySource {
    /// The source a `STREAMSHIM_POLICY` value names (read by [`crate::settings`]): unset or
    /// empty is [`PolicySource::Default`].
    pub fn from_value(value: Option<&OsStr>) -> PolicySource {
        match value {
            Some(v) if !v.is_empty() => PolicySource::File(PathBuf::from(v)),
            _ => PolicySource::Default,
        }
    }

    /// The policy this source names.
    pub fn load(&self) -> Result<Policy, PolicyError> {
        match self {
            PolicySource::Default => Ok(Policy::allow_all()),
            PolicySource::File(p) => Policy::load(p),
        }
    }
}
