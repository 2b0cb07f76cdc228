//! An error and its causes on one line: `top: cause: cause`.
//!
//! The convention, for every error type of the project: **a message leaves its source out, the
//! report adds it.** A `thiserror` variant with a `#[source]` or `#[from]` field says what was
//! being done (`#[error("sysfs root {path} is not readable")]`), never `{source}` or `{0}`;
//! whoever shows an error to a person (the binaries' `main`, a log line, a gRPC status or an
//! admission message) shows [`Report`] of it, never its bare `Display`:
//!
//! ```
//! use rdma_streams_common::report::Report;
//!
//! #[derive(Debug, thiserror::Error)]
//! #[error("sysfs root {path} is not readable")]
//! struct SysRoot {
//!     path: String,
//!     #[source]
//!     source: std::io::Error,
//! }
//!
//! let error = SysRoot {
//!     path: "/x".into(),
//!     source: std::io::Error::from_raw_os_error(2),
//! };
//! assert_eq!(
//!     Report(&error).to_string(),
//!     "sysfs root /x is not readable: No such file or directory (os error 2)"
//! );
//! // In a log line: tracing::warn!(error = %Report(&error), "discovery failed");
//! ```
//!
//! One line, like anyhow's `{:#}` and like Go's `fmt.Errorf("...: %w")` errors that Kubernetes
//! prints, because the same text goes to a terminal, into a log field (one JSON value, one text
//! line), into a gRPC status message and into an admission response: a multi-line `caused by:`
//! form would suit the terminal alone and break the other three.
//!
//! Errors of other crates do not all follow the convention (kube's `HyperError: {0}`, for
//! one): a cause whose text its parent's message already contains is left out, so such an error
//! still reads once. Errors of this project must not rely on that: a message that repeats its
//! source hides nothing from the report, but repeats it wherever the bare `Display` is used.

use std::{
    error::Error,
    fmt,
    io::Write,
    process::{ExitCode, Termination},
};

/// Displays an error followed by each of its sources (`Error::source`), joined by `": "`.
///
/// Each message is written without surrounding whitespace; a cause with an empty message, or
/// whose text the error above it already says, is skipped; after a message that ends with `:`
/// the next cause follows a space, not a second colon.
#[derive(Clone, Copy)]
pub struct Report<'a>(pub &'a (dyn Error + 'a));

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parent = self.0.to_string();
        let top = parent.trim_end();
        f.write_str(top)?;
        // Whether the line so far is empty or ends with a colon: the separator before a cause.
        let mut written = !top.is_empty();
        let mut tail_colon = top.ends_with(':');
        let mut next = self.0.source();
        while let Some(cause) = next {
            let text = cause.to_string();
            let trimmed = text.trim();
            if !trimmed.is_empty() && !parent.contains(trimmed) {
                if written {
                    f.write_str(if tail_colon { " " } else { ": " })?;
                }
                f.write_str(trimmed)?;
                written = true;
                tail_colon = trimmed.ends_with(':');
            }
            parent = text;
            next = cause.source();
        }
        Ok(())
    }
}

impl fmt::Debug for Report<'_> {
    /// The same one line: a `Report` in a `{:?}` context (an `assert!` message, a `?error`
    /// log field) still shows the causes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// How a binary's `main` ends: the run's exit code, or its error as a [`Report`], logged and
/// written plainly on stderr (in case logging is filtered; never panicking on a closed pipe,
/// unlike `eprintln!`), and [`ExitCode::FAILURE`].
///
/// ```no_run
/// # fn parse_and_run() -> Result<(), std::io::Error> { Ok(()) }
/// fn main() -> std::process::ExitCode {
///     rdma_streams_common::report::exit("example", parse_and_run())
/// }
/// ```
pub fn exit<T: Termination, E: Error>(binary: &str, result: Result<T, E>) -> ExitCode {
    match result {
        Ok(done) => done.report(),
        Err(error) => {
            tracing::error!(error = %Report(&error), "{binary} failed");
            let _ = writeln!(std::io::stderr(), "{binary}: {}", Report(&error));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    #[test]
    fn exit_is_the_run_code_or_failure() {
        use std::process::ExitCode;
        let ok: Result<(), std::io::Error> = Ok(());
        assert_eq!(exit("x", ok), ExitCode::SUCCESS);
        let code: Result<ExitCode, std::io::Error> = Ok(ExitCode::from(3));
        assert_eq!(exit("x", code), ExitCode::from(3));
        let failed: Result<(), _> = Err(std::io::Error::from_raw_os_error(2));
        assert_eq!(exit("x", failed), ExitCode::FAILURE);
    }

    use super::*;

    /// A test error: a message and an optional source.
    #[derive(Debug)]
    struct E(&'static str, Option<Box<dyn Error + Send + Sync + 'static>>);

    impl fmt::Display for E {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for E {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|s| s as &(dyn Error + 'static))
        }
    }

    fn e(message: &'static str, source: Option<E>) -> E {
        E(
            message,
            source.map(|s| Box::new(s) as Box<dyn Error + Send + Sync>),
        )
    }

    #[test]
    fn a_chain_of_three_reads_top_first_on_one_line() {
        let error = e(
            "starting the plugin",
            Some(e("reading the config", Some(e("permission denied", None)))),
        );
        assert_eq!(
            Report(&error).to_string(),
            "starting the plugin: reading the config: permission denied"
        );
    }

    #[test]
    fn an_error_without_a_source_is_its_message() {
        let error = e("unknown profile nope", None);
        assert_eq!(Report(&error).to_string(), "unknown profile nope");
        assert_eq!(format!("{:?}", Report(&error)), "unknown profile nope");
    }

    #[test]
    fn a_message_ending_in_a_colon_gets_no_second_colon() {
        let error = e(
            "cannot start:",
            Some(e("bind failed:  ", Some(e("busy", None)))),
        );
        assert_eq!(
            Report(&error).to_string(),
            "cannot start: bind failed: busy"
        );
    }

    #[test]
    fn a_cause_the_message_already_says_is_not_repeated() {
        // Another crate's `#[error("HyperError: {0}")]` over a source with its own source.
        let error = e(
            "HyperError: client error (Connect)",
            Some(e(
                "client error (Connect)",
                Some(e("tcp connect error", Some(e("Connection refused", None)))),
            )),
        );
        assert_eq!(
            Report(&error).to_string(),
            "HyperError: client error (Connect): tcp connect error: Connection refused"
        );
    }

    #[test]
    fn empty_messages_add_no_separator() {
        let error = e("", Some(e("", Some(e("the cause", None)))));
        assert_eq!(Report(&error).to_string(), "the cause");
        let error = e("top", Some(e("", Some(e("the cause", None)))));
        assert_eq!(Report(&error).to_string(), "top: the cause");
    }

    #[test]
    fn an_io_error_wrapping_an_error_shows_that_errors_causes() {
        let error = io::Error::other(e("handshake failed", Some(e("bad record", None))));
        assert_eq!(Report(&error).to_string(), "handshake failed: bad record");
    }

    #[test]
    fn thiserror_variants_following_the_convention_read_once() {
        #[derive(Debug, thiserror::Error)]
        enum Outer {
            #[error("sysfs root {path} is not readable")]
            SysRoot {
                path: &'static str,
                #[source]
                source: io::Error,
            },
        }
        #[derive(Debug, thiserror::Error)]
        enum Top {
            #[error(transparent)]
            Discovery(#[from] Outer),
        }
        let error = Top::from(Outer::SysRoot {
            path: "/x",
            source: io::Error::from_raw_os_error(2), // ENOENT
        });
        assert_eq!(
            Report(&error).to_string(),
            "sysfs root /x is not readable: No such file or directory (os error 2)"
        );
    }
}
