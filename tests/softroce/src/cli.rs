//! The libtest-like command line of a scenario test binary: name filters (substrings, or exact
//! names with `--exact`), `--skip`, `--list`; other libtest flags (`--nocapture`,
//! `--test-threads=N`, `-q`, ...) are accepted and ignored, so `cargo test --workspace` and
//! `cargo test -p rdma-streams-softroce -- NAME` work.

/// The parsed arguments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Args {
    /// Positional filters; a scenario runs when it matches any (all run when there is none).
    pub filters: Vec<String>,
    /// `--skip F`: scenarios matching any of these do not run.
    pub skip: Vec<String>,
    /// `--exact`: filters match whole names.
    pub exact: bool,
    /// `--list`: print the selected scenarios and exit.
    pub list: bool,
    /// `--ignored`: only ignored tests run, and there are none.
    pub only_ignored: bool,
}

/// libtest flags that take a value (`--flag value` or `--flag=value`).
const WITH_VALUE: &[&str] = &[
    "--test-threads",
    "--skip",
    "--format",
    "--color",
    "--logfile",
    "--shuffle-seed",
    "-Z",
];

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = String>) -> Args {
    let mut out = Args::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if !arg.starts_with('-') {
            out.filters.push(arg);
            continue;
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        let value = if WITH_VALUE.contains(&flag.as_str()) {
            inline.or_else(|| args.next())
        } else {
            None
        };
        match flag.as_str() {
            "--exact" => out.exact = true,
            "--list" => out.list = true,
            "--ignored" => out.only_ignored = true,
            "--skip" => out.skip.extend(value),
            _ => {}
        }
    }
    out
}

impl Args {
    /// Does scenario `name` run?
    pub fn selects(&self, name: &str) -> bool {
        let matches = |f: &String| {
            if self.exact {
                name == f
            } else {
                name.contains(f.as_str())
            }
        };
        !self.only_ignored
            && (self.filters.is_empty() || self.filters.iter().any(matches))
            && !self.skip.iter().any(matches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Args {
        parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn filters_and_ignored_flags() {
        let a = p(&[
            "--nocapture",
            "--test-threads",
            "2",
            "-q",
            "rping",
            "--color=never",
        ]);
        assert_eq!(a.filters, ["rping"]);
        assert!(a.selects("smoke_loop_rping") && !a.selects("smoke_loop_rstream"));
        let a = p(&["--test-threads=1", "--exact", "smoke_loop_rping"]);
        assert!(a.selects("smoke_loop_rping") && !a.selects("smoke_loop_rping2"));
        assert!(p(&[]).selects("anything"));
    }

    #[test]
    fn list_skip_and_ignored() {
        let a = p(&["--list", "--format", "terse", "--skip", "wire"]);
        assert!(a.list && a.filters.is_empty());
        assert!(a.selects("smoke_loop") && !a.selects("smoke_wire"));
        assert!(!p(&["--ignored"]).selects("smoke_loop"));
        assert!(p(&["--include-ignored"]).selects("smoke_loop"));
    }
}
