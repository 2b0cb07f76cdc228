//! What a Python `unittest` run in verbose mode says of each test (the guest runs other
//! projects' test suites under the shim and compares them test by test).

use std::collections::BTreeMap;

/// How a test ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum End {
    /// `ok`, or `expected failure`.
    Passed,
    /// `skipped ...`.
    Skipped,
    /// `FAIL`, `ERROR`, or `unexpected success`.
    Failed,
}

/// What a `python3 -m test -v` run printed of its tests.
#[derive(Debug, Default)]
pub struct Run {
    /// `<test id> -> how it ended`: a line `name (id) ... ok` (or `FAIL`, `ERROR`,
    /// `skipped '...'`, `expected failure`, `unexpected success`), whose verdict may come on a
    /// later line when the test printed something first.
    pub ends: BTreeMap<String, End>,
    /// The test the output ends in without its verdict: the one a hang (`--timeout`, whose
    /// stack dump follows it on the same line) or a crash ended the run in.
    pub unfinished: Option<String>,
}

/// Reads the output `out` of a run.
pub fn read(out: &str) -> Run {
    let mut run = Run::default();
    for line in out.lines() {
        if let Some((head, rest)) = line.split_once(") ... ")
            && let Some((_, id)) = head.rsplit_once(" (")
            && !id.contains(' ')
        {
            match verdict(rest) {
                Some(end) => {
                    run.ends.insert(id.to_owned(), end);
                    run.unfinished = None;
                }
                None => run.unfinished = Some(id.to_owned()),
            }
        } else if let Some(id) = &run.unfinished
            && let Some(end) = verdict(line)
        {
            run.ends.insert(id.clone(), end);
            run.unfinished = None;
        }
    }
    run
}

/// How a verdict word (the text after ` ... `, or a line of its own) ends a test.
fn verdict(s: &str) -> Option<End> {
    let s = s.trim();
    if s == "ok" || s == "expected failure" {
        Some(End::Passed)
    } else if s.starts_with("skipped") {
        Some(End::Skipped)
    } else if s == "FAIL" || s == "ERROR" || s == "unexpected success" {
        Some(End::Failed)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_read_unittest_lines_and_late_verdicts() {
        let out = "testA (test.test_socket.BasicTCPTest.testA) ... ok\n\
                   testB (test.test_socket.X.testB) ... skipped 'no'\n\
                   testC (test.test_socket.X.testC) ... \nsome output\nFAIL\n\
                   test_d (test.test_ftplib.Y.test_d) ... ERROR\n\
                   noise (not a test) ... ok and more\n";
        let run = read(out);
        let v = &run.ends;
        assert_eq!(
            v.get("test.test_socket.BasicTCPTest.testA"),
            Some(&End::Passed)
        );
        assert_eq!(v.get("test.test_socket.X.testB"), Some(&End::Skipped));
        assert_eq!(v.get("test.test_socket.X.testC"), Some(&End::Failed));
        assert_eq!(v.get("test.test_ftplib.Y.test_d"), Some(&End::Failed));
        assert_eq!(v.len(), 4);
        assert_eq!(run.unfinished, None);
    }

    #[test]
    fn unfinished_names_the_test_a_timeout_ended_the_run_in() {
        let out = "testA (test.test_socket.X.testA) ... ok\n\
                   testB (test.test_socket.X.testB) ... Timeout (0:05:00)!\n\
                   Thread 0x1 (most recent call first):\n";
        let run = read(out);
        assert_eq!(run.unfinished.as_deref(), Some("test.test_socket.X.testB"));
        assert_eq!(run.ends.len(), 1);
    }
}
