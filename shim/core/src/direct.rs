//! `STREAMSHIM_DIRECT_READ`: whether `read`, `recv` and `recvfrom` of an upgraded fd may copy
//! the stream's bytes straight from its receive ring (on by default; `0` keeps every read on the
//! socketpair, the path of every other call). The switch exists to rule the fast path out when
//! chasing a problem, and to measure it side by side.
//!
//! [`wait_all`] is `recv(MSG_WAITALL)` on a blocking upgraded fd, built from direct reads and
//! the original `recv` without the flag: the kernel's `MSG_WAITALL` would wait on the
//! socketpair for bytes a direct read could take from the ring meanwhile.

use std::ffi::OsStr;

/// The variable.
pub const DIRECT_READ_ENV: &str = "STREAMSHIM_DIRECT_READ";

/// The switch for the variable's value: unset, empty or `1` is on, `0` off; anything else is an
/// error (the caller says so once and keeps it on).
pub fn direct_read_from_value(value: Option<&OsStr>) -> Result<bool, String> {
    let text = value.map(|v| v.to_str().unwrap_or("\u{fffd}").trim());
    match text {
        None | Some("" | "1") => Ok(true),
        Some("0") => Ok(false),
        Some(other) => Err(format!("{DIRECT_READ_ENV}={other:?} is neither 0 nor 1")),
    }
}

/// Fills `buf` as `recv(MSG_WAITALL)` does on a blocking socket, from two sources in turn:
/// `direct(rest)` (bytes straight from the ring, None when it has none for now) and
/// `wait(rest)` (the original `recv` without `MSG_WAITALL`: blocks until the socketpair holds
/// bytes; 0 at EOF, -1 with errno on an error, a signal or a receive timeout). Returns the byte
/// count: `buf.len()`, or less at EOF, or what was read before an error; -1 only when the
/// error came first, with the error's errno.
pub fn wait_all(
    buf: &mut [u8],
    direct: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    wait: &mut dyn FnMut(&mut [u8]) -> isize,
) -> isize {
    let mut got = 0usize;
    while got < buf.len() {
        if let Some(n) = direct(&mut buf[got..]) {
            got += n;
            continue;
        }
        match wait(&mut buf[got..]) {
            n if n > 0 => got += n.unsigned_abs(),
            0 => break,
            _ if got > 0 => break,
            err => return err,
        }
    }
    isize::try_from(got).unwrap_or(isize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source handing out `chunks` in turn, each `Some(bytes)` or a wait result.
    fn run(len: usize, plan: &[(&str, &[u8], isize)]) -> (isize, Vec<u8>, Vec<&'static str>) {
        let plan = std::cell::RefCell::new(plan.iter().copied());
        let calls = std::cell::RefCell::new(Vec::new());
        let mut buf = vec![0u8; len];
        let mut direct = |rest: &mut [u8]| {
            calls.borrow_mut().push("direct");
            let mut plan = plan.borrow_mut();
            let peek = plan.clone().next();
            match peek {
                Some(("direct", bytes, _)) => {
                    plan.next();
                    rest[..bytes.len()].copy_from_slice(bytes);
                    Some(bytes.len())
                }
                _ => None,
            }
        };
        let mut wait = |rest: &mut [u8]| {
            calls.borrow_mut().push("wait");
            match plan.borrow_mut().next() {
                Some(("wait", bytes, rc)) => {
                    rest[..bytes.len()].copy_from_slice(bytes);
                    rc
                }
                other => panic!("unexpected wait, plan says {other:?}"),
            }
        };
        let rc = wait_all(&mut buf, &mut direct, &mut wait);
        (rc, buf, calls.into_inner())
    }

    #[test]
    fn wait_all_fills_the_buffer_from_both_sources_in_order() {
        let (rc, buf, calls) = run(
            9,
            &[
                ("direct", b"abc", 0),
                ("wait", b"de", 2),
                ("direct", b"fgh", 0),
                ("wait", b"i", 1),
            ],
        );
        assert_eq!((rc, &buf[..]), (9, &b"abcdefghi"[..]));
        assert_eq!(
            calls,
            ["direct", "direct", "wait", "direct", "direct", "wait"]
        );
    }

    #[test]
    fn wait_all_stops_short_at_eof_and_after_an_error_keeps_what_it_read() {
        let (rc, buf, _) = run(8, &[("direct", b"ab", 0), ("wait", b"", 0)]);
        assert_eq!((rc, &buf[..2]), (2, &b"ab"[..]), "EOF after two bytes");
        let (rc, _, _) = run(8, &[("wait", b"", 0)]);
        assert_eq!(rc, 0, "EOF at once");
        let (rc, buf, _) = run(8, &[("wait", b"xyz", 3), ("wait", b"", -1)]);
        assert_eq!(
            (rc, &buf[..3]),
            (3, &b"xyz"[..]),
            "a signal after three bytes"
        );
        let (rc, _, _) = run(8, &[("wait", b"", -1)]);
        assert_eq!(rc, -1, "the error first");
    }

    fn parse(v: &str) -> Result<bool, String> {
        direct_read_from_value(Some(OsStr::new(v)))
    }

    #[test]
    fn on_unless_zero() {
        assert_eq!(direct_read_from_value(None), Ok(true));
        assert_eq!(parse(""), Ok(true));
        assert_eq!(parse("1"), Ok(true));
        assert_eq!(parse(" 0 "), Ok(false));
    }

    #[test]
    fn anything_else_is_an_error_naming_the_variable() {
        for bad in ["yes", "off", "2", "-1"] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(DIRECT_READ_ENV) && e.contains(bad), "{e}");
        }
    }
}
