//! `STREAMSHIM_RING_KIB`: how many bytes a busy upgraded connection's ring holds per
//! direction, the one memory/throughput knob of the shim. A connection starts on 64 KiB rings
//! (200 KiB pinned) and moves to rings of this size only while its stream is busy
//! (`rdma_streams_transport::engine`'s rings), so the default trades up to 2 MiB of locked
//! memory per busy direction at each end for a 2 MiB transfer in flight (measured against
//! 1 MiB in `docs/benchmarks.md`); a process with many busy connections under a small
//! `RLIMIT_MEMLOCK` and no `CAP_IPC_LOCK` may want less.

use std::ffi::OsStr;

use crate::settings::RING_ENV;

/// The ring when the variable is unset: the engine's default
/// ([`rdma_streams_transport::engine::DEFAULT_RING`], 2 MiB each way).
pub const DEFAULT_RING_KIB: usize = rdma_streams_transport::engine::DEFAULT_RING / 1024;
/// The smallest ring the variable may ask for (KiB).
pub const MIN_RING_KIB: usize = 16;
/// The largest (KiB): the wire's largest ring, 16 MiB.
pub const MAX_RING_KIB: usize = (1 << rdma_streams_transport::wire::MAX_RING_LOG) / 1024;

/// The ring's bytes for the variable's value: unset or empty gives the default; a value that is
/// not a whole number of KiB in [`MIN_RING_KIB`]..=[`MAX_RING_KIB`] is an error (the caller says
/// so once and uses the default). The engine rounds it up to a power of two.
pub fn ring_bytes_from_value(value: Option<&OsStr>) -> Result<usize, String> {
    let Some(raw) = value else {
        return Ok(DEFAULT_RING_KIB * 1024);
    };
    let text = raw.to_str().unwrap_or("\u{fffd}").trim();
    if text.is_empty() {
        return Ok(DEFAULT_RING_KIB * 1024);
    }
    match text.parse::<usize>() {
        Ok(kib) if (MIN_RING_KIB..=MAX_RING_KIB).contains(&kib) => Ok(kib * 1024),
        _ => Err(format!(
            "{RING_ENV}={text:?} is not a ring size ({MIN_RING_KIB} to {MAX_RING_KIB} KiB)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;

    fn parse(v: &str) -> Result<usize, String> {
        ring_bytes_from_value(Some(OsStr::new(v)))
    }

    #[test]
    fn unset_and_empty_give_the_default() {
        assert_eq!(ring_bytes_from_value(None), Ok(2048 * 1024));
        assert_eq!(parse(""), Ok(2048 * 1024));
        assert_eq!(parse("  "), Ok(2048 * 1024));
    }

    #[test]
    fn whole_kib_in_range_are_taken() {
        assert_eq!(parse("16"), Ok(16 * 1024));
        assert_eq!(parse(" 256 "), Ok(256 * 1024));
        assert_eq!(parse("16384"), Ok(16 * 1024 * 1024));
        // Not a power of two: taken (the engine rounds it up).
        assert_eq!(parse("300"), Ok(300 * 1024));
    }

    #[test]
    fn everything_else_is_an_error_that_names_the_variable() {
        for bad in [
            "0",
            "15",
            "16385",
            "-1",
            "1m",
            "1.5",
            "99999999999999999999999",
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(e.contains(RING_ENV) && e.contains(bad), "{e}");
        }
        let not_utf8 = OsString::from_vec(vec![0xff, b'1']);
        assert!(ring_bytes_from_value(Some(&not_utf8)).is_err());
    }
}
