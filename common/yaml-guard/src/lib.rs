//! A linear-time check to run on YAML text before `serde_yaml` parses it.
//!
//! serde_yaml 0.9 parses with unsafe-libyaml (libyaml 0.2.5 translated to Rust). For every token
//! its scanner walks the stack of possible simple keys, which holds one entry per open flow
//! collection (`[`, `{`), so flow collections nested n deep cost O(n²) or worse. Measured on a
//! release build: 160 KiB of `{a: ` took 3.2 s, 320 KiB 32.5 s (`cargo test --release -p
//! rdma-streams-transport --lib -- --ignored --nocapture serde_yaml_alone`); a 1 MiB policy
//! file would stall every shimmed process of a pod far longer (upstream: yaml/yaml-serde#1,
//! "Parsing deeply nested flow collection is quadratically slow"). serde_yaml's
//! own nesting limit (128) does not help: it is applied while deserializing, after the scanner
//! has read the whole document.
//!
//! [`check`] reads the text once, in linear time, and refuses it when libyaml could nest flow
//! collections deeper than [`MAX_FLOW_DEPTH`] (twice what serde_yaml accepts) anywhere in it. The
//! caller then reports the error instead of parsing. Behind the limit the scanner's work is at
//! most [`MAX_FLOW_DEPTH`] per token: a mebibyte parses in well under a second.
//!
//! How. libyaml enters flow context only at a `[` or `{` where a node may start (the start of
//! a line, after `-`, `?` or `:`, after an anchor or a tag), and inside flow context its scanner
//! is simple: quoted scalars, plain scalars that end at flow indicators, comments, anchors,
//! aliases and tags, whatever the indentation. The check does not follow block context
//! (indentation, block scalars, where such a `[` may be literal text): it treats every `[` and
//! `{` where a node may start as a possible entry into flow context and follows every possible
//! entry with libyaml's flow-context rules at once, keeping for each scanner state only the
//! deepest follower, and dropping a follower where libyaml would stop with a scanner error. The
//! follower of the real entry is always among them, so the deepest follower is at least as deep
//! as libyaml. The price of not following block context is generosity: a `[` or `{` after `: `
//! inside a block scalar or a quoted string counts as an opening too, so text that opens
//! hundreds of such brackets without closing them is refused as well. Configuration files and
//! the scripts, JSON and configs embedded in manifests do not.

#![warn(missing_docs)]

use std::fmt;

/// Deepest flow-collection nesting [`check`] lets through: twice serde_yaml's own limit, so
/// every document serde_yaml accepts passes (unless its text opens hundreds of brackets after
/// `: ` without closing them), and the scanner's work stays linear.
pub const MAX_FLOW_DEPTH: usize = 256;

/// A document whose flow collections may nest deeper than the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooDeep {
    /// 1-based line of the opening that went past the limit.
    pub line: usize,
    /// 1-based column (in characters) of that opening.
    pub column: usize,
    /// The limit.
    pub limit: usize,
}

impl fmt::Display for TooDeep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "flow collections ([...], {{...}}) nested deeper than {} levels",
            self.limit
        )
    }
}

impl std::error::Error for TooDeep {}

/// Refuses `text` if libyaml could nest flow collections deeper than [`MAX_FLOW_DEPTH`] in it.
pub fn check(text: &str) -> Result<(), TooDeep> {
    check_with_limit(text, MAX_FLOW_DEPTH)
}

/// [`check`] with another limit.
pub fn check_with_limit(text: &str, limit: usize) -> Result<(), TooDeep> {
    let b = text.as_bytes();
    // The deepest follower in each state; 0: none.
    let mut deepest = [0usize; State::COUNT];
    let mut line = Line::default();
    let mut i = 0usize;
    while i < b.len() {
        let unit = Unit::at(b, i, !line.started);
        let mut next = [0usize; State::COUNT];
        if deepest.iter().any(|&depth| depth > 0) {
            for state in State::ALL {
                let depth = deepest[state as usize];
                if depth == 0 {
                    continue;
                }
                // A scanner error ends libyaml's work, and the follower with it.
                let Some((to, change)) = step(state, b, i, unit) else {
                    continue;
                };
                // Back to depth 0 is back in block context: the follower ends there.
                let depth = depth.saturating_add_signed(change);
                let slot = &mut next[to as usize];
                *slot = (*slot).max(depth);
            }
        }
        if matches!(unit, Unit::Byte(b'[' | b'{')) && line.may_start_a_node() {
            // A possible entry into flow context.
            let slot = &mut next[State::TokenStart as usize];
            *slot = (*slot).max(1);
        }
        if next.iter().any(|&depth| depth > limit) {
            let (line, column) = position(b, i);
            return Err(TooDeep {
                line,
                column,
                limit,
            });
        }
        deepest = next;
        line.read(unit);
        i += match unit {
            Unit::Break(len) => len,
            Unit::Bom => 3,
            Unit::Byte(_) => 1,
        };
    }
    Ok(())
}

/// What came before on the current line, for telling where a block-context node may start.
#[derive(Debug, Default)]
struct Line {
    /// Whether anything was read on this line (libyaml skips a byte order mark in column 0).
    started: bool,
    /// The last character that is not a blank.
    last: Option<u8>,
    /// The first character of the last word (a run of non-blanks).
    word_first: Option<u8>,
    /// Whether the character just read is part of that word.
    in_word: bool,
}

impl Line {
    /// Whether a `[` or `{` here may start a flow collection in block context, as far as
    /// libyaml's parser lets the document go on: at the start of a line, after an indicator
    /// (`-`, `?`, `:`, also of `---` and `...`), or after an anchor, alias or tag. Elsewhere
    /// the character is text (inside a plain, quoted or block scalar, a comment), or the parser
    /// fails within the line (the scanner looks at most the rest of the line, 1024 characters,
    /// ahead for a `:`).
    fn may_start_a_node(&self) -> bool {
        match self.last {
            None => true,
            Some(b':' | b'-' | b'?' | b'.') => true,
            Some(_) => !self.in_word && matches!(self.word_first, Some(b'&' | b'*' | b'!')),
        }
    }

    fn read(&mut self, unit: Unit) {
        self.started = true;
        match unit {
            Unit::Break(_) => *self = Line::default(),
            Unit::Bom | Unit::Byte(b' ' | b'\t') => self.in_word = false,
            Unit::Byte(c) => {
                if !self.in_word {
                    self.word_first = Some(c);
                    self.in_word = true;
                }
                self.last = Some(c);
            }
        }
    }
}

/// 1-based line and column (in characters) of byte `at`.
fn position(b: &[u8], at: usize) -> (usize, usize) {
    let (mut i, mut line, mut column) = (0usize, 1usize, 1usize);
    while i < at {
        match break_len(b, i) {
            0 => {
                // UTF-8 continuation bytes do not move the column.
                if b[i] & 0xc0 != 0x80 {
                    column += 1;
                }
                i += 1;
            }
            len => {
                line += 1;
                column = 1;
                i += len;
            }
        }
    }
    (line, column)
}

/// Where libyaml's flow-context scanner is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Between tokens: blanks, line breaks and comments are skipped here.
    TokenStart,
    /// A comment, to the end of the line.
    Comment,
    /// Inside a word of a plain scalar.
    PlainWord,
    /// Blanks or line breaks inside a plain scalar (a comment may start here).
    PlainGap,
    /// A single-quoted scalar.
    Single,
    /// A `'` in a single-quoted scalar: its end, or the first half of `''`.
    SingleQuote,
    /// A double-quoted scalar.
    Double,
    /// After a `\` in a double-quoted scalar.
    DoubleEscape,
    /// Just after `&` or `*`.
    AnchorStart,
    /// An anchor or alias name.
    Anchor,
    /// Just after `!`.
    TagStart,
    /// A tag (`!handle!suffix`, `!suffix`).
    Tag,
    /// A verbatim tag (`!<...>`), where `,`, `[` and `]` are tag characters.
    TagVerbatim,
    /// Just after the `>` of a verbatim tag.
    TagEnd,
}

impl State {
    const COUNT: usize = 14;
    const ALL: [State; State::COUNT] = [
        State::TokenStart,
        State::Comment,
        State::PlainWord,
        State::PlainGap,
        State::Single,
        State::SingleQuote,
        State::Double,
        State::DoubleEscape,
        State::AnchorStart,
        State::Anchor,
        State::TagStart,
        State::Tag,
        State::TagVerbatim,
        State::TagEnd,
    ];
}

/// What the scanner reads in one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    /// A line break of this many bytes: LF, CR, CR LF, NEL, LS, PS (libyaml's `IS_BREAK`).
    Break(usize),
    /// A byte order mark at the start of a line (skipped between tokens).
    Bom,
    /// Any other byte.
    Byte(u8),
}

impl Unit {
    fn at(b: &[u8], i: usize, line_start: bool) -> Unit {
        match break_len(b, i) {
            0 if line_start && b.get(i..i + 3) == Some(&[0xef, 0xbb, 0xbf][..]) => Unit::Bom,
            0 => Unit::Byte(b[i]),
            len => Unit::Break(len),
        }
    }
}

fn break_len(b: &[u8], i: usize) -> usize {
    match b.get(i..) {
        Some([b'\r', b'\n', ..]) => 2,
        Some([b'\r' | b'\n', ..]) => 1,
        Some([0xc2, 0x85, ..]) => 2,
        Some([0xe2, 0x80, 0xa8 | 0xa9, ..]) => 3,
        _ => 0,
    }
}

/// libyaml's `IS_BLANKZ`: a blank, a line break, or the end.
fn blankz(b: &[u8], i: usize) -> bool {
    matches!(b.get(i), None | Some(b' ' | b'\t' | b'\0')) || break_len(b, i) > 0
}

/// libyaml's URI characters of a tag (`yaml_parser_scan_tag_uri`), flow indicators excluded.
fn uri(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"-_;/?:@&=+$.%!~*'()".contains(&c)
}

/// The state after reading `unit` (at byte `i` of `b`) in `state`, and the change of the flow
/// level; `None` where libyaml stops with a scanner error (nothing after it is scanned).
/// Mirrors libyaml's scanner in flow context (`yaml_parser_fetch_next_token`,
/// `scan_to_next_token`, `scan_plain_scalar`, `scan_flow_scalar`, `scan_anchor`, `scan_tag`).
/// Errors the parser reports (a missing `,`, a block entry in flow context) let the follower go
/// on: being generous there costs nothing but precision.
fn step(mut state: State, b: &[u8], i: usize, unit: Unit) -> Option<(State, isize)> {
    use State as S;
    loop {
        // `continue` reads the same unit again in the new state (a token that ends at the
        // character that starts the next one).
        let byte = match unit {
            Unit::Byte(byte) => byte,
            Unit::Break(_) => {
                return Some(match state {
                    S::TokenStart | S::Comment | S::SingleQuote => (S::TokenStart, 0),
                    S::PlainWord | S::PlainGap => (S::PlainGap, 0),
                    S::Single | S::Double => (state, 0),
                    // An escaped line break continues the scalar.
                    S::DoubleEscape => (S::Double, 0),
                    // A break ends a name; an empty anchor name is an error.
                    S::AnchorStart => return None,
                    S::Anchor | S::TagStart | S::Tag | S::TagEnd => (S::TokenStart, 0),
                    S::TagVerbatim => return None,
                });
            }
            Unit::Bom => {
                return match state {
                    S::TokenStart => Some((S::TokenStart, 0)),
                    S::PlainWord | S::PlainGap => Some((S::PlainWord, 0)),
                    S::Comment | S::Single | S::Double => Some((state, 0)),
                    // Not a character that may follow these.
                    S::SingleQuote => Some((S::TokenStart, 0)),
                    _ => None,
                };
            }
        };
        return match state {
            S::TokenStart => match byte {
                b' ' | b'\t' => Some((S::TokenStart, 0)),
                b'#' => Some((S::Comment, 0)),
                b'[' | b'{' => Some((S::TokenStart, 1)),
                b']' | b'}' => Some((S::TokenStart, -1)),
                // Entries, and in flow context `?` and `:` are always indicators. A block entry
                // (`- `) and a directive are refused by the parser, not the scanner.
                b',' | b'?' | b':' | b'%' => Some((S::TokenStart, 0)),
                b'-' if blankz(b, i + 1) => Some((S::TokenStart, 0)),
                b'*' | b'&' => Some((S::AnchorStart, 0)),
                b'!' => Some((S::TagStart, 0)),
                b'\'' => Some((S::Single, 0)),
                b'"' => Some((S::Double, 0)),
                // No token starts with these in flow context.
                b'|' | b'>' | b'@' | b'`' => None,
                _ => Some((S::PlainWord, 0)),
            },
            S::Comment => Some((S::Comment, 0)),
            S::PlainWord => match byte {
                b' ' | b'\t' => Some((S::PlainGap, 0)),
                // `: ` ends the scalar (a value follows); `:` before a flow indicator is an error.
                b':' if blankz(b, i + 1) => {
                    state = S::TokenStart;
                    continue;
                }
                b':' if matches!(b.get(i + 1), Some(b',' | b'?' | b'[' | b']' | b'{' | b'}')) => {
                    None
                }
                b',' | b'[' | b']' | b'{' | b'}' => {
                    state = S::TokenStart;
                    continue;
                }
                _ => Some((S::PlainWord, 0)),
            },
            S::PlainGap => match byte {
                b' ' | b'\t' => Some((S::PlainGap, 0)),
                b'#' => {
                    state = S::TokenStart;
                    continue;
                }
                _ => {
                    state = S::PlainWord;
                    continue;
                }
            },
            S::Single => match byte {
                b'\'' => Some((S::SingleQuote, 0)),
                _ => Some((S::Single, 0)),
            },
            S::SingleQuote => match byte {
                b'\'' => Some((S::Single, 0)),
                _ => {
                    state = S::TokenStart;
                    continue;
                }
            },
            S::Double => match byte {
                b'\\' => Some((S::DoubleEscape, 0)),
                b'"' => Some((S::TokenStart, 0)),
                _ => Some((S::Double, 0)),
            },
            // libyaml's escapes; any other character is an error.
            S::DoubleEscape => b"0abt\tnvfre \"/\\N_LPxuU"
                .contains(&byte)
                .then_some((S::Double, 0)),
            S::AnchorStart | S::Anchor if name(byte) => Some((S::Anchor, 0)),
            // A name must not be empty, and must end where a token may follow.
            S::AnchorStart => None,
            S::Anchor => {
                if blankz(b, i) || b"?:,]}%@`".contains(&byte) {
                    state = S::TokenStart;
                    continue;
                }
                None
            }
            S::TagStart if byte == b'<' => Some((S::TagVerbatim, 0)),
            S::TagStart | S::Tag if uri(byte) => Some((S::Tag, 0)),
            // A tag ends before a blank, or (in flow context) a `,`.
            S::TagStart | S::Tag | S::TagEnd => {
                if blankz(b, i) || byte == b',' {
                    state = S::TokenStart;
                    continue;
                }
                None
            }
            S::TagVerbatim => match byte {
                b'>' => Some((S::TagEnd, 0)),
                b',' | b'[' | b']' => Some((S::TagVerbatim, 0)),
                c if uri(c) => Some((S::TagVerbatim, 0)),
                _ => None,
            },
        };
    }
}

/// libyaml's `IS_ALPHA`: the characters of anchor names.
fn name(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
}

#[cfg(test)]
mod tests;
