//! Why a policy could not be used: [`PolicyError`], whose `Display` is one line.

use std::io;
use std::path::{Path, PathBuf};

use super::MAX_POLICY_BYTES;

/// Why a policy could not be used. `Display` is a single line, meant to be printed once as
/// `streamshim: <error>; upgrades disabled`.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be opened or read (or is not UTF-8).
    #[error("policy {}: cannot read: {source}", escape_controls(&path.display().to_string()))]
    Read {
        /// The policy file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The file is larger than [`MAX_POLICY_BYTES`].
    #[error(
        "policy {}: larger than {MAX_POLICY_BYTES} bytes",
        escape_controls(&path.display().to_string())
    )]
    TooLarge {
        /// The policy file.
        path: PathBuf,
    },
    /// YAML syntax, unknown field, bad CIDR/port/pattern/version.
    #[error("{}", fmt_parse(path.as_deref(), *line, *column, message))]
    Parse {
        /// The policy file, when parsed from one.
        path: Option<PathBuf>,
        /// 1-based line, when known.
        line: Option<usize>,
        /// 1-based column, when known.
        column: Option<usize>,
        /// What is wrong (one line, with the field path such as `client.allow[0]`).
        message: String,
    },
}

/// `text` with its control characters escaped (`\n`, `\u{1b}`): a line break in the
/// `STREAMSHIM_POLICY` path, or an escape sequence spelled in the policy and quoted back by the
/// YAML error, must neither split the one-line message nor reach a terminal.
fn escape_controls(text: &str) -> String {
    if !text.contains(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn fmt_parse(path: Option<&Path>, line: Option<usize>, column: Option<usize>, msg: &str) -> String {
    let mut s = String::from("policy");
    if let Some(p) = path {
        s.push(' ');
        s.push_str(&escape_controls(&p.display().to_string()));
    }
    match (line, column) {
        (Some(l), Some(c)) => s.push_str(&format!(": line {l} column {c}")),
        (Some(l), None) => s.push_str(&format!(": line {l}")),
        _ => {}
    }
    s.push_str(": ");
    s.push_str(msg);
    s
}

impl PolicyError {
    pub(super) fn from_yaml(path: Option<&Path>, e: &rdma_streams_yaml::Error) -> PolicyError {
        PolicyError::Parse {
            path: path.map(Path::to_owned),
            line: e.line(),
            column: e.column(),
            message: escape_controls(e.message()),
        }
    }

    /// 1-based (line, column) of a parse error, when known.
    pub fn location(&self) -> Option<(usize, usize)> {
        match self {
            PolicyError::Parse {
                line: Some(l),
                column: Some(c),
                ..
            } => Some((*l, *c)),
            _ => None,
        }
    }
}
