//! `STREAMSHIM_DIRECT_READ`: whether `read`, `recv` and `recvfrom` of an upgraded fd may copy
//! the stream's bytes straight from its receive ring (on by default; `0` keeps every read on the
//! socketpair, the path of every other call). The switch exists to rule the fast path out when
//! chasing a problem, and to measure it side by side.

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

#[cfg(test)]
mod tests {
    use super::*;

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
