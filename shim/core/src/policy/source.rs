//! Where a policy comes from: [`PolicySource`], the value of `STREAMSHIM_POLICY`.

use std::ffi::OsStr;
use std::path::PathBuf;

use super::{POLICY_ENV, Policy, PolicyError};

/// Where the policy comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicySource {
    /// `STREAMSHIM_POLICY` unset or empty: [`Policy::allow_all`].
    Default,
    /// A policy file.
    File(PathBuf),
}

impl PolicySource {
    /// Reads `STREAMSHIM_POLICY`.
    pub fn from_env() -> PolicySource {
        Self::from_value(std::env::var_os(POLICY_ENV).as_deref())
    }

    /// Like [`PolicySource::from_env`] with the variable's value given.
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
