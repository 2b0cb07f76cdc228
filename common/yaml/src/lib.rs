//! Every YAML read and write of the workspace, in one place: the shim's policy file, the device
//! plugin's config and report, the injector's profiles and `inject -f` manifests, the chart
//! tests' renders.
//!
//! The parser is serde-saphyr (pure Rust, no `unsafe` C translation, maintained), with one set
//! of options for every reader:
//! - **the types serde_yaml read**: YAML 1.2 core booleans only (`yes`, `no`, `on`, `off`, `y`
//!   and `n` are strings, as Kubernetes' API server reads them in JSON), and plain scalars with
//!   leading zeros or underscores (`0755`, `1_000`) stay strings when read untyped, so a
//!   manifest that `inject -f` reads and writes back keeps its values;
//! - **bounded work on hostile text**: the parser refuses flow collections nested deeper than
//!   [`MAX_FLOW_DEPTH`] as it scans (linear time: unlike libyaml, behind serde_yaml, whose
//!   scanner took 32.5 s over 320 KiB of `{a: `), and its budget caps events, nodes, aliases,
//!   anchors and block nesting, so an alias bomb is refused, not expanded;
//! - **duplicate keys are an error** (as serde_yaml refused them);
//! - errors are one line: the message and, where known, the line and column ([`Error`]).

#![warn(missing_docs)]

use std::fmt;

use serde::de::DeserializeOwned;

/// Deepest nesting of flow collections (`[...]`, `{...}`) read; deeper is refused while
/// scanning.
pub const MAX_FLOW_DEPTH: usize = 64;

/// Deepest nesting of collections of any style read (serde-saphyr's own default). Reading an
/// untyped value recurses once per level, so the bound also bounds the stack a hostile file can
/// take; no file of ours nests past 10.
pub const MAX_DEPTH: usize = 64;

/// Most documents read from one text.
pub const MAX_DOCUMENTS: usize = 65_536;

/// The options of every read.
fn options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.flow_nesting_limit = MAX_FLOW_DEPTH;
    budget.max_depth = MAX_DEPTH;
    // A manifest may hold many documents; each is bounded by the rest of the budget.
    budget.max_documents = MAX_DOCUMENTS;
    // A manifest of many mebibytes (`inject -f` of a cluster's export) has millions of nodes;
    // the text's own size bounds them (a node is at least two bytes).
    budget.max_nodes = 1 << 22;
    budget.max_events = 1 << 23;
    serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        with_snippet: false,
        budget: Some(budget),
    }
}

/// A YAML text that could not be read (or a value that could not be written): what was wrong,
/// and where, when known. Displayed as one line, `<message> at line L column C`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    message: String,
    line: Option<usize>,
    column: Option<usize>,
}

impl Error {
    /// What was wrong (one line, without the location).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// 1-based line of the error, when known.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// 1-based column of the error, when known.
    pub fn column(&self) -> Option<usize> {
        self.column
    }

    /// The error of a read, `path` (where in the document, as `a.b[2].c`; empty at the top)
    /// in front of the message.
    fn read(e: &serde_saphyr::Error, path: &str) -> Error {
        let location = e.location();
        let line = location.map(|l| usize::try_from(l.line()).unwrap_or(usize::MAX));
        let column = location.map(|l| usize::try_from(l.column()).unwrap_or(usize::MAX));
        let mut message = e
            .without_snippet()
            .to_string()
            .replace(['\n', '\r'], " ")
            .trim()
            .to_owned();
        if let (Some(l), Some(c)) = (line, column) {
            for suffix in [
                format!(" at line {l}, column {c}"),
                format!(" at line {l} column {c}"),
            ] {
                if let Some(stripped) = message.strip_suffix(&suffix) {
                    message = stripped.to_owned();
                }
            }
            let prefix = format!("error: line {l} column {c}: ");
            if let Some(stripped) = message.strip_prefix(&prefix) {
                message = stripped.to_owned();
            }
        }
        if !path.is_empty() && path != "." {
            message = format!("{path}: {message}");
        }
        Error {
            message,
            line,
            column,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, " at line {l} column {c}"),
            (Some(l), None) => write!(f, " at line {l}"),
            _ => Ok(()),
        }
    }
}

impl std::error::Error for Error {}

/// Reads one YAML document as a `T`. An empty text (or one of comments only) reads as YAML's
/// null: `Option<T>` gives None.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, Error> {
    let mut path = String::new();
    serde_saphyr::with_deserializer_from_str_with_options(text, options(), |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            path = e.path().to_string();
            e.into_inner()
        })
    })
    .map_err(|e| Error::read(&e, &path))
}

/// A document of a multi-document text that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentError {
    /// 0-based index among the text's non-empty documents.
    pub index: usize,
    /// What was wrong.
    pub error: Error,
}

impl fmt::Display for DocumentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {}: {}", self.index, self.error)
    }
}

impl std::error::Error for DocumentError {}

/// Reads every document of a multi-document text (`---` separated) as a `T`; empty documents
/// are skipped. The first document that cannot be read ends the read.
pub fn documents<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, DocumentError> {
    let mut input = text.as_bytes();
    let mut docs = Vec::new();
    for (index, doc) in serde_saphyr::read_with_options(&mut input, options()).enumerate() {
        match doc {
            Ok(doc) => docs.push(doc),
            Err(e) => {
                return Err(DocumentError {
                    index,
                    error: Error::read(&e, ""),
                });
            }
        }
    }
    Ok(docs)
}

/// Writes `value` as one YAML document (block style, no `---`), as `from_str` reads it back:
/// a string with line breaks as a literal block (`|`), every other string on its line however
/// long (never folded).
#[cfg(feature = "serialize")]
pub fn to_string<T: serde::Serialize>(value: &T) -> Result<String, Error> {
    let options = serde_saphyr::ser_options! {
        folded_wrap_chars: usize::MAX,
    };
    serde_saphyr::to_string_with_options(value, options).map_err(|e| Error {
        message: e.to_string().replace(['\n', '\r'], " "),
        line: None,
        column: None,
    })
}

#[cfg(test)]
mod tests;
