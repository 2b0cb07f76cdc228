//! `STREAMSHIM_DIRECT_READ`: whether `read`, `recv` and `recvfrom` of an upgraded fd may copy
//! the stream's bytes straight from its receive ring (on by default; `0` keeps every read on the
//! socketpair, the path of every other call). `STREAMSHIM_DIRECT_WRITE`, the same for `write`,
//! `send` and `sendto` and the send ring. The switches exist to rule the fast paths out when
//! chasing a problem, and to measure them side by side.
//!
//! [`wait_all`] is `recv(MSG_WAITALL)` on a blocking upgraded fd, built from direct reads and
//! the original `recv` without the flag: the kernel's `MSG_WAITALL` would wait on the
//! socketpair for bytes a direct read could take from the ring meanwhile.

use std::ffi::OsStr;
use std::time::Duration;

/// How long a blocking `write`/`send` of an upgraded fd waits for room in the stream's send
/// ring (for the peer to consume) before it queues the rest in the socketpair, as it did
/// before direct writes: the socketpair's buffer then adds to the ring's, so a program that
/// relies on the kernel buffering some bytes before its peer reads (both ends writing first)
/// is never held by the ring's smaller size for longer than this.
pub const WRITE_WAIT: Duration = Duration::from_millis(250);

/// The switch for the value of the variable `name`: unset, empty or `1` is on, `0` off;
/// anything else is an error (the caller says so once and keeps it on).
pub fn switch_from_value(name: &str, value: Option<&OsStr>) -> Result<bool, String> {
    let text = value.map(|v| v.to_str().unwrap_or("\u{fffd}").trim());
    match text {
        None | Some("" | "1") => Ok(true),
        Some("0") => Ok(false),
        Some(other) => Err(format!("{name}={other:?} is neither 0 nor 1")),
    }
}

/// Writes `buf` as `write` does, from two sinks in turn: `direct(rest)` (bytes straight into
/// the send ring, None when it takes none for now) as long as it takes some, then `rest(rest)`
/// (the original call on the socketpair: blocks or not as the fd does; -1 with errno on an
/// error) once for whatever is left. Returns the byte count: all of `buf`, or what was written
/// before the original call wrote less or failed; -1 only when nothing was written, with the
/// original's errno.
pub fn write_direct_then_rest(
    buf: &[u8],
    direct: &mut dyn FnMut(&[u8]) -> Option<usize>,
    rest: &mut dyn FnMut(&[u8]) -> isize,
) -> isize {
    let mut done = 0usize;
    while done < buf.len() {
        match direct(&buf[done..]) {
            Some(n) if n > 0 => done += n,
            _ => break,
        }
    }
    if done < buf.len() {
        match rest(&buf[done..]) {
            n if n >= 0 => done += n.unsigned_abs(),
            _ if done > 0 => {}
            err => return err,
        }
    }
    isize::try_from(done).unwrap_or(isize::MAX)
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
    use crate::settings::{DIRECT_READ_ENV, DIRECT_WRITE_ENV};

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
        switch_from_value(DIRECT_READ_ENV, Some(OsStr::new(v)))
    }

    /// `write_direct_then_rest` over a ring taking `takes` in turn and a socketpair answering
    /// `rest_rc`: (result, bytes per sink in order).
    fn write_plan(len: usize, takes: &[usize], rest_rc: isize) -> (isize, Vec<(char, usize)>) {
        let buf: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut takes = takes.iter().copied();
        let calls = std::cell::RefCell::new(Vec::new());
        let mut direct = |b: &[u8]| {
            let n = takes.next()?.min(b.len());
            calls.borrow_mut().push(('d', n));
            Some(n)
        };
        let mut rest = |b: &[u8]| {
            calls.borrow_mut().push(('r', b.len()));
            rest_rc
        };
        let rc = write_direct_then_rest(&buf, &mut direct, &mut rest);
        (rc, calls.into_inner())
    }

    #[test]
    fn write_goes_to_the_ring_while_it_takes_bytes_then_once_to_the_socketpair() {
        assert_eq!(write_plan(10, &[4, 6], 0), (10, vec![('d', 4), ('d', 6)]));
        assert_eq!(
            write_plan(10, &[4], 6),
            (10, vec![('d', 4), ('r', 6)]),
            "the rest once the ring is full"
        );
        assert_eq!(write_plan(10, &[], 10), (10, vec![('r', 10)]));
        assert_eq!(
            write_plan(10, &[4], 2),
            (6, vec![('d', 4), ('r', 6)]),
            "a short write of the rest (non-blocking)"
        );
        assert_eq!(
            write_plan(10, &[4], -1),
            (4, vec![('d', 4), ('r', 6)]),
            "EAGAIN or EPIPE after direct bytes: what was written"
        );
        assert_eq!(write_plan(10, &[], -1), (-1, vec![('r', 10)]));
        assert_eq!(
            write_plan(10, &[0, 5], 10),
            (10, vec![('d', 0), ('r', 10)]),
            "a zero take ends the ring's turn"
        );
    }

    #[test]
    fn on_unless_zero() {
        assert_eq!(switch_from_value(DIRECT_READ_ENV, None), Ok(true));
        assert_eq!(parse(""), Ok(true));
        assert_eq!(parse("1"), Ok(true));
        assert_eq!(parse(" 0 "), Ok(false));
    }

    #[test]
    fn anything_else_is_an_error_naming_the_variable() {
        for bad in ["yes", "off", "2", "-1"] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(DIRECT_READ_ENV) && e.contains(bad), "{e}");
            let e = switch_from_value(DIRECT_WRITE_ENV, Some(OsStr::new(bad))).unwrap_err();
            assert!(e.contains(DIRECT_WRITE_ENV), "{e}");
        }
    }
}
