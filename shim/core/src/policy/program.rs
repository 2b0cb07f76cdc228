//! Which programs a policy names: [`ProgramPattern`] globs over a basename, and the names
//! this process is known by ([`current_program_names`]).

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

/// A glob over a program's basename: `*` matches any run of bytes, `?` exactly one byte, every
/// other byte itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProgramPattern(String);

impl ProgramPattern {
    /// The pattern; errors for an empty pattern or one with `/` (patterns match basenames).
    pub fn new(p: &str) -> Result<ProgramPattern, String> {
        if p.is_empty() {
            return Err("empty program pattern".to_owned());
        }
        if p.contains('/') {
            return Err(format!(
                "program pattern {p:?} contains '/': patterns match the program's basename"
            ));
        }
        Ok(ProgramPattern(p.to_owned()))
    }

    /// Whether `name` (a basename) matches.
    pub fn matches(&self, name: &str) -> bool {
        glob_match(self.0.as_bytes(), name.as_bytes())
    }

    /// The pattern text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for ProgramPattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A visitor (not `String::deserialize` then a check) so errors carry the value's
        // line and column.
        struct V;
        impl Visitor<'_> for V {
            type Value = ProgramPattern;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a program name or glob")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ProgramPattern, E> {
                ProgramPattern::new(v).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

/// Iterative glob match with single-star backtracking: O(len(p) * len(s)) worst case, no
/// allocation, no recursion.
fn glob_match(pat: &[u8], s: &[u8]) -> bool {
    let (mut p, mut t) = (0usize, 0usize);
    // Position of the last `*` seen and the text position it is currently matched up to.
    let mut star: Option<(usize, usize)> = None;
    loop {
        match pat.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
                continue;
            }
            Some(&c) => {
                if let Some(&b) = s.get(t)
                    && (c == b'?' || c == b)
                {
                    p += 1;
                    t += 1;
                    continue;
                }
            }
            None => {
                if t == s.len() {
                    return true;
                }
            }
        }
        match star {
            Some((sp, st)) if st < s.len() => {
                star = Some((sp, st + 1));
                p = sp + 1;
                t = st + 1;
            }
            _ => return false,
        }
    }
}

/// The part after the last `/` (the whole string when there is none).
pub fn basename(path: &str) -> &str {
    match path.rsplit_once('/') {
        Some((_, b)) => b,
        None => path,
    }
}

/// The names [`Policy::program_allowed_any`](super::Policy::program_allowed_any) should see for
/// this process: the basename of `/proc/self/exe` and of `argv[0]` (deduplicated; either may be
/// missing). Allocates and makes a syscall: call once per process.
pub fn current_program_names() -> Vec<String> {
    let mut names = Vec::with_capacity(2);
    if let Ok(exe) = std::fs::read_link("/proc/self/exe") {
        let s = exe.to_string_lossy();
        // A deleted binary reads as "/path/prog (deleted)".
        let s = s.strip_suffix(" (deleted)").unwrap_or(&s);
        let b = basename(s);
        if !b.is_empty() {
            names.push(b.to_owned());
        }
    }
    if let Some(arg0) = std::env::args_os().next() {
        let s = arg0.to_string_lossy();
        let b = basename(&s);
        if !b.is_empty() && !names.iter().any(|n| n == b) {
            names.push(b.to_owned());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    #[test]
    fn globs() {
        let m = |p: &str, s: &str| glob_match(p.as_bytes(), s.as_bytes());
        assert!(m("iperf3", "iperf3"));
        assert!(!m("iperf3", "iperf"));
        assert!(!m("iperf", "iperf3"));
        assert!(m("qemu-system-*", "qemu-system-x86_64"));
        assert!(m("qemu-system-*", "qemu-system-"));
        assert!(!m("qemu-system-*", "qemu-img"));
        assert!(m("*", ""));
        assert!(m("*", "anything"));
        assert!(m("python3.?", "python3.9"));
        assert!(!m("python3.?", "python3.11"));
        assert!(m("python3*", "python3.11"));
        assert!(m("*a*b*c", "xxaxxbxxc"));
        assert!(!m("*a*b*c", "xxaxxbxxcx"));
        assert!(m("a**b", "ab"));
        assert!(m("*?", "x"));
        assert!(!m("*?", ""));
        assert!(!m("", "x"));
        assert!(m("", ""));
    }

    #[test]
    fn basenames_and_this_process() {
        assert_eq!(basename("/usr/bin/iperf3"), "iperf3");
        assert_eq!(basename("iperf3"), "iperf3");
        assert_eq!(basename("/usr/bin/"), "");
        let names = current_program_names();
        assert!(!names.is_empty());
        assert!(names.iter().all(|n| !n.contains('/') && !n.is_empty()));
    }

    proptest! {
        #[test]
        fn glob_star_matches_everything(s in "\\PC{0,40}") {
            prop_assert!(glob_match(b"*", s.as_bytes()));
            prop_assert!(glob_match(s.as_bytes(), s.as_bytes()));
        }
    }
}
