//! Stderr output without a logging framework: a fixed stack buffer and one write(2).
//!
//! `STREAMSHIM_LOG` (`info` or `debug`; anything else is silent) is read once, at the
//! decision ([`crate::settings`]). Lines are `streamshim[<pid>]: <message>` and are cut at [`MAX_LINE`] bytes.

use std::fmt::{self, Write};
use std::sync::atomic::{AtomicU8, Ordering};

use crate::sys;

/// Longest line written (longer ones are truncated).
pub const MAX_LINE: usize = 1024;

/// Log levels, ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    /// Nothing but the one bad-policy line.
    Off = 0,
    /// The per-process decision and errors writing stats.
    Info = 1,
    /// Also every counted connection.
    Debug = 2,
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Off as u8);

impl Level {
    /// Parses `STREAMSHIM_LOG`'s value.
    pub fn parse(v: &str) -> Level {
        match v.trim().to_ascii_lowercase().as_str() {
            "info" => Level::Info,
            "debug" | "trace" => Level::Debug,
            _ => Level::Off,
        }
    }
}

/// Sets the process's level (at the decision).
pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

/// Whether messages of `level` are written.
#[inline]
pub fn enabled(level: Level) -> bool {
    level != Level::Off && LEVEL.load(Ordering::Relaxed) >= level as u8
}

struct LineBuf {
    buf: [u8; MAX_LINE],
    len: usize,
}

impl Write for LineBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // Keep room for the newline; silently truncate.
        let room = MAX_LINE.saturating_sub(1).saturating_sub(self.len);
        let n = s.len().min(room);
        if let (Some(dst), Some(src)) = (
            self.buf.get_mut(self.len..self.len.saturating_add(n)),
            s.as_bytes().get(..n),
        ) {
            dst.copy_from_slice(src);
            self.len = self.len.saturating_add(n);
        }
        Ok(())
    }
}

/// Writes one line `streamshim[<pid>]: <args>` to stderr, whatever the level.
pub fn line(args: fmt::Arguments<'_>) {
    let mut b = LineBuf {
        buf: [0; MAX_LINE],
        len: 0,
    };
    let _ = write!(b, "streamshim[{}]: ", std::process::id());
    let _ = b.write_fmt(args);
    let _ = b.write_str("\n");
    if let Some(bytes) = b.buf.get(..b.len) {
        sys::write_stderr(bytes);
    }
}

/// Like [`line`] without the pid (the fixed-format bad-policy message).
pub fn plain_line(args: fmt::Arguments<'_>) {
    let mut b = LineBuf {
        buf: [0; MAX_LINE],
        len: 0,
    };
    let _ = b.write_fmt(args);
    let _ = b.write_str("\n");
    if let Some(bytes) = b.buf.get(..b.len) {
        sys::write_stderr(bytes);
    }
}

/// Logs at `level` if enabled.
macro_rules! log_at {
    ($level:expr, $($arg:tt)*) => {
        if $crate::log::enabled($level) {
            $crate::log::line(format_args!($($arg)*));
        }
    };
}
pub(crate) use log_at;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_leniently() {
        assert_eq!(Level::parse("info"), Level::Info);
        assert_eq!(Level::parse(" DEBUG\n"), Level::Debug);
        assert_eq!(Level::parse("trace"), Level::Debug);
        for v in ["", "off", "warn", "1", "verbose"] {
            assert_eq!(Level::parse(v), Level::Off, "{v:?}");
        }
    }

    #[test]
    fn lines_are_truncated_not_overflowed() {
        let mut b = LineBuf {
            buf: [0; MAX_LINE],
            len: 0,
        };
        for _ in 0..100 {
            let _ = b.write_str("0123456789abcdef0123456789abcdef");
        }
        assert_eq!(b.len, MAX_LINE - 1, "room kept for the newline");
        let _ = b.write_str("\n");
        assert_eq!(b.len, MAX_LINE - 1);
    }
}
