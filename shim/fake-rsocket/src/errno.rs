//! The error currency of the safe layer: a C `errno` value.

use std::io;

/// An `errno` value that an exported function reports with a `-1` return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Errno(pub(crate) i32);

impl From<io::Error> for Errno {
    fn from(e: io::Error) -> Errno {
        Errno(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

/// Result of a safe operation behind an exported function.
pub(crate) type Res<T> = Result<T, Errno>;

/// Shorthand for `Err(Errno(code))`.
pub(crate) fn err<T>(code: i32) -> Res<T> {
    Err(Errno(code))
}
