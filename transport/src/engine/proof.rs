//! The proof that binds a stream to its TCP connection (docs/shim-protocol.md, "Binding"): the
//! accepting side's CLAIM carries a fresh [`Secret`]; the connecting side, and only after it
//! received CLAIM, writes the secret on its kernel TCP connection right behind the bytes its app
//! sent there so far (they went at once: the first bytes never wait for the stream), and its
//! direction moves to the stream at that point. Only the real TCP endpoint can put bytes into
//! that connection (the kernel's sequence checks keep off-path senders out), so a stream whose
//! RDMA peer merely claimed the client's address never binds.
//!
//! The accepting side relays what arrives on the TCP connection to its app while it searches it
//! for the secret ([`Scan`]): bytes that may be the secret's start (at most 15, the end of what
//! arrived) wait for the next ones; every other byte goes on at once. Found, the secret is taken
//! out (the app never sees it) and marks where the client's direction moved to the stream;
//! nothing may follow it on the TCP connection. A relay that gave up waiting for the proof keeps
//! searching for a while (its guard): a proof found then fails the connection instead of
//! reaching the app.

use std::time::Instant;

use crate::wire::{SECRET_LEN, Secret};

/// The search for the secret in the bytes of one direction (see the module docs).
#[derive(Debug, Clone)]
pub(super) struct Scan {
    secret: Secret,
    /// The last bytes searched may be the secret's start: they wait (`< SECRET_LEN`).
    held: usize,
    /// A guard: the search ends then, and a secret found before is a failure.
    guard_until: Option<Instant>,
}

/// What a search found in the bytes given.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Found {
    /// Not the secret; the last [`Scan::held`] bytes may be its start.
    No,
    /// The secret starts at this offset of the bytes given.
    At(usize),
}

impl Scan {
    /// A search while the connection waits for its proof.
    pub(super) fn new(secret: Secret) -> Scan {
        Scan {
            secret,
            held: 0,
            guard_until: None,
        }
    }

    /// A guard's search: it ends at `until`.
    pub(super) fn guard(secret: Secret, until: Instant) -> Scan {
        Scan {
            guard_until: Some(until),
            ..Scan::new(secret)
        }
    }

    /// This search as a guard until `until` (a connection that gave up waiting).
    pub(super) fn into_guard(self, until: Instant) -> Scan {
        Scan {
            guard_until: Some(until),
            ..self
        }
    }

    /// When a guard ends.
    pub(super) fn guard_until(&self) -> Option<Instant> {
        self.guard_until
    }

    /// How many of the last bytes searched wait for the next ones.
    pub(super) fn held(&self) -> usize {
        self.held
    }

    /// The bytes held may go on (the source ended, or an urgent byte is among them: the secret
    /// is never urgent).
    pub(super) fn release(&mut self) {
        self.held = 0;
    }

    /// Searches `window`: the bytes held so far, then the bytes that arrived since.
    pub(super) fn feed(&mut self, window: &[u8]) -> Found {
        let secret = self.secret.bytes();
        if window.len() >= SECRET_LEN
            && let Some(at) = window
                .windows(SECRET_LEN)
                .position(|w| w == secret.as_slice())
        {
            self.held = 0;
            return Found::At(at);
        }
        self.held = (1..SECRET_LEN.min(window.len() + 1))
            .rev()
            .find(|&k| window.ends_with(&secret[..k]))
            .unwrap_or(0);
        Found::No
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: Secret = Secret(*b"0123456789abcdef");

    #[test]
    fn the_secret_is_found_wherever_it_starts_and_its_start_is_held() {
        let mut s = Scan::new(SECRET);
        assert_eq!(s.feed(b"GET / HTTP/1.0\r\n"), Found::No);
        assert_eq!(s.held(), 0);
        assert_eq!(s.feed(b"xx0123"), Found::No);
        assert_eq!(s.held(), 4, "the secret's start waits");
        assert_eq!(s.feed(b"0123456789abcdef"), Found::At(0));
        let mut s = Scan::new(SECRET);
        assert_eq!(s.feed(b"a00123456789abcdef"), Found::At(2));
        assert_eq!(s.held(), 0);
    }

    #[test]
    fn bytes_that_only_start_like_it_go_on() {
        let mut s = Scan::new(SECRET);
        assert_eq!(s.feed(b"012"), Found::No);
        assert_eq!(s.held(), 3);
        assert_eq!(s.feed(b"012X"), Found::No);
        assert_eq!(s.held(), 0);
        // A full-length miss whose end starts the secret again.
        assert_eq!(s.feed(b"0123456789abcde0"), Found::No);
        assert_eq!(s.held(), 1);
        s.release();
        assert_eq!(s.held(), 0);
    }

    #[test]
    fn a_guard_says_until_when() {
        let until = Instant::now();
        assert_eq!(Scan::guard(SECRET, until).guard_until(), Some(until));
        assert_eq!(Scan::new(SECRET).guard_until(), None);
        assert_eq!(
            Scan::new(SECRET).into_guard(until).guard_until(),
            Some(until)
        );
    }
}
