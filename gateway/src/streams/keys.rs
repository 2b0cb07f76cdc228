//! The pre-shared keys gateways authenticate each other with (`--peer-keys-file`).
//!
//! The file holds one key per line, standard base64 (with padding) of at least
//! [`MIN_KEY_BYTES`] bytes; `#` starts a comment line, blank lines are ignored. The **first**
//! key signs, **every** listed key verifies, so a key is rotated without a flag day: add the new
//! key second on every node (roll), move it first (roll), remove the old one (roll).
//!
//! The file is watched (`rdma_streams_common::watched_file`: last good wins): a file that
//! does not parse keeps the keys in force and is logged and counted. Without a file, or
//! before it first appears, there is no key: this gateway then neither opens nor accepts RDMA
//! streams (`NO_PEER_KEY`).
//!
//! Keys never reach a log: [`PeerKeys`]'s `Debug` and [`PeerKeys::summary`] show each key's
//! fingerprint only (the first 4 bytes of its SHA-256), so operators can tell which key is
//! where in a rotation.

use std::{path::PathBuf, sync::Arc};

use base64::{Engine as _, engine::general_purpose::STANDARD};
use rdma_streams_common::watched_file::Watchable;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

/// The shortest key accepted: 256 bits, the size of HMAC-SHA256's output.
pub const MIN_KEY_BYTES: usize = 32;

/// One key (at least [`MIN_KEY_BYTES`] bytes).
#[derive(Clone, PartialEq, Eq)]
pub struct PeerKey(Vec<u8>);

impl PeerKey {
    /// A key of these bytes, if long enough.
    pub fn new(bytes: Vec<u8>) -> Option<PeerKey> {
        (bytes.len() >= MIN_KEY_BYTES).then_some(PeerKey(bytes))
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// The first 4 bytes of the key's SHA-256, in hex: names the key in logs without
    /// revealing it.
    pub fn fingerprint(&self) -> String {
        Sha256::digest(&self.0)[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

impl std::fmt::Debug for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PeerKey({})", self.fingerprint())
    }
}

/// The keys in force: the first signs, all verify. Empty: no key (no stream opened or
/// accepted).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerKeys(Vec<PeerKey>);

/// Why a keys file was refused (the keys in force stay).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeysError {
    #[error("{origin}:{line}: not standard base64 ({reason})")]
    Base64 {
        origin: String,
        line: usize,
        reason: String,
    },
    #[error("{origin}:{line}: a key of {bytes} bytes; at least {MIN_KEY_BYTES} are needed")]
    Short {
        origin: String,
        line: usize,
        bytes: usize,
    },
    #[error("{origin}: no key in the file")]
    Empty { origin: String },
    #[error("reading {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl PeerKeys {
    /// These keys (the first signs).
    #[cfg(test)]
    pub fn new(keys: Vec<PeerKey>) -> PeerKeys {
        PeerKeys(keys)
    }

    /// Parses a keys file's text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<PeerKeys, KeysError> {
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bytes = STANDARD.decode(line).map_err(|e| KeysError::Base64 {
                origin: origin.to_owned(),
                line: i + 1,
                reason: e.to_string(),
            })?;
            let len = bytes.len();
            keys.push(PeerKey::new(bytes).ok_or_else(|| KeysError::Short {
                origin: origin.to_owned(),
                line: i + 1,
                bytes: len,
            })?);
        }
        if keys.is_empty() {
            return Err(KeysError::Empty {
                origin: origin.to_owned(),
            });
        }
        Ok(PeerKeys(keys))
    }

    /// The key that signs, if any.
    pub fn signing(&self) -> Option<&PeerKey> {
        self.0.first()
    }

    /// Every key, the signing one first.
    pub fn all(&self) -> &[PeerKey] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl Watchable for PeerKeys {
    type Error = KeysError;

    fn parse(text: &str, origin: &str) -> Result<PeerKeys, KeysError> {
        PeerKeys::parse(text, origin)
    }

    fn fallback() -> PeerKeys {
        PeerKeys::default()
    }

    fn read_error(path: PathBuf, source: std::io::Error) -> KeysError {
        KeysError::Read { path, source }
    }

    fn summary(&self) -> String {
        if self.0.is_empty() {
            return "no peer key".into();
        }
        let prints: Vec<String> = self.0.iter().map(PeerKey::fingerprint).collect();
        format!(
            "{} peer key(s), signing with {} (fingerprints {})",
            self.0.len(),
            prints[0],
            prints.join(",")
        )
    }
}

/// The keys in force now, as the watched file publishes them (cheap to clone; reading never
/// blocks for long: the engine thread reads it).
#[derive(Clone, Debug)]
pub struct KeyRing(watch::Receiver<Arc<PeerKeys>>);

impl KeyRing {
    pub fn new(rx: watch::Receiver<Arc<PeerKeys>>) -> KeyRing {
        KeyRing(rx)
    }

    /// Fixed keys (tests, and a gateway without a keys file: none).
    pub fn fixed(keys: PeerKeys) -> KeyRing {
        KeyRing(watch::channel(Arc::new(keys)).1)
    }

    pub fn current(&self) -> Arc<PeerKeys> {
        self.0.borrow().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(bytes: &[u8]) -> String {
        STANDARD.encode(bytes)
    }

    #[test]
    fn keys_in_file_order_comments_and_blanks_skipped() {
        let text = format!(
            "# rotation: new key second\n\n  {}  \n# old\n{}\n",
            b64(&[1; 32]),
            b64(&[2; 48])
        );
        let keys = PeerKeys::parse(&text, "k").unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys.signing().unwrap().bytes(), &[1; 32]);
        assert_eq!(keys.all()[1].bytes(), &[2; 48]);
    }

    #[test]
    fn bad_files_say_which_line_and_why() {
        let short = format!("{}\n{}\n", b64(&[1; 32]), b64(&[2; 31]));
        let e = PeerKeys::parse(&short, "/k").unwrap_err();
        assert_eq!(
            e.to_string(),
            "/k:2: a key of 31 bytes; at least 32 are needed"
        );
        let e = PeerKeys::parse("# c\nnot base64!\n", "/k").unwrap_err();
        assert!(
            e.to_string().starts_with("/k:2: not standard base64"),
            "{e}"
        );
        // URL-safe base64 is not the standard alphabet.
        let url = base64::engine::general_purpose::URL_SAFE.encode([0xfb; 33]);
        assert!(matches!(
            PeerKeys::parse(&url, "/k"),
            Err(KeysError::Base64 { line: 1, .. })
        ));
        assert!(matches!(
            PeerKeys::parse("# only a comment\n\n", "/k"),
            Err(KeysError::Empty { .. })
        ));
    }

    #[test]
    fn no_key_is_ever_printed() {
        let key = PeerKey::new(vec![0x41; 32]).unwrap();
        let keys = PeerKeys::new(vec![key.clone()]);
        let shown = format!("{keys:?} {}", keys.summary());
        assert!(!shown.contains(&b64(&[0x41; 32])), "{shown}");
        assert!(!shown.contains("AAAA"), "{shown}");
        assert!(shown.contains(&key.fingerprint()), "{shown}");
        assert_eq!(key.fingerprint().len(), 8);
    }

    #[test]
    fn parsing_arbitrary_text_never_panics() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};
        rdma_streams_testkit::within(std::time::Duration::from_secs(60), || {
            let mut runner = TestRunner::new(Config {
                cases: 512,
                failure_persistence: None,
                ..Config::default()
            });
            runner
                .run(&".{0,300}", |text| {
                    if let Ok(keys) = PeerKeys::parse(&text, "p") {
                        prop_assert!(!keys.is_empty());
                        prop_assert!(keys.all().iter().all(|k| k.bytes().len() >= 32));
                    }
                    Ok(())
                })
                .unwrap();
        });
    }
}
