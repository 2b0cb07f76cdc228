//! The harness's error type: every variant names what went wrong and, for missing pieces,
//! what to install.

use std::io;
use std::path::PathBuf;

/// Why a guest could not be booted or a run could not be set up. A command that fails or times
/// out inside a guest is not an error: it is an [`crate::Outcome`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tool, kernel or module the harness needs is not installed.
    #[error("{what} not found: {hint}")]
    Missing {
        /// What is missing, e.g. "a kernel image with rdma_rxe".
        what: String,
        /// How to install it (usually: `make deps`).
        hint: String,
    },
    /// An I/O operation on the host failed.
    #[error("{context}: {source}")]
    Io {
        /// What the harness was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A spec or an environment variable is invalid.
    #[error("{0}")]
    Invalid(String),
    /// The guest could not be started or never reached its init script.
    #[error("guest {name} did not boot: {reason} (console log: {console})")]
    Boot {
        /// The guest's name.
        name: String,
        /// What was seen.
        reason: String,
        /// Where the console log was kept.
        console: PathBuf,
    },
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn missing(what: impl Into<String>, hint: impl Into<String>) -> Self {
        Error::Missing {
            what: what.into(),
            hint: hint.into(),
        }
    }
}
