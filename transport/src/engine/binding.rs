//! What a connection takes from its peer before and after its stream is bound, by its
//! [`Handshake`] (docs/shim-protocol.md, "Binding"). The peer is not trusted: a control message
//! out of its place, or stream bytes before the stream may carry them, is a [`Violation`] and
//! fails that stream alone (the accepting side of the shim then relays its TCP connection, which
//! the peer never proved it holds).
//!
//! | handshake | CLAIM from the peer | CONFIRM from the peer | MOVED from the peer | stream bytes and FIN from the peer |
//! | --- | --- | --- | --- | --- |
//! | `Open` (the gateway) | never | never | never | from the start |
//! | `Confirm` (the shim's connecting side) | once, before our CONFIRM | never | once, after our CONFIRM | after its MOVED |
//! | `Claim` (the shim's accepting side) | never | once, after our CLAIM | never | after its CONFIRM |
//!
//! A finished connection's queue pair may carry the next connection between the same two
//! processes (docs/shim-protocol.md, "Reused connections"): the connecting side takes REUSED
//! once, after its REUSE; the accepting side takes REUSE once, after the peer's FIN. Either is
//! the last message of the connection: the next one starts with a binding of its own, and
//! anything after it here is a violation.
//!
//! RC keeps each direction in order, so a peer that follows the protocol never breaks these
//! rules: the accepting side sends MOVED, then its first stream byte, once bound, which is
//! after the CONFIRM, which the connecting side posts after it saw CLAIM and before its own
//! first stream byte.

use super::Handshake;
use crate::wire::{ControlKind, Secret};

/// Something the peer sent that the protocol does not allow at that point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum Violation {
    /// CLAIM on a connection that takes none, or a second one, or one after our CONFIRM.
    #[error("a CLAIM the connection does not take ({0})")]
    Claim(&'static str),
    /// CONFIRM on a connection that takes none, before our CLAIM, or a second one.
    #[error("a CONFIRM the connection does not take ({0})")]
    Confirm(&'static str),
    /// MOVED on a connection that takes none, before our CONFIRM, or a second one.
    #[error("a MOVED the connection does not take ({0})")]
    Moved(&'static str),
    /// Stream bytes or FIN before the stream may carry them.
    #[error("stream bytes before the stream was confirmed")]
    EarlyData,
    /// A second FIN, or bytes after FIN.
    #[error("stream bytes or FIN after FIN")]
    AfterFin,
    /// REUSE or REUSED out of place, or anything after one.
    #[error("a reuse message the connection does not take ({0})")]
    Reuse(&'static str),
}

/// One connection's binding state (see the module docs).
#[derive(Debug, Clone)]
pub(super) struct Binding {
    handshake: Handshake,
    /// Connecting side: the peer's CLAIM came with this secret.
    claim: Option<Secret>,
    /// Connecting side: our CONFIRM is out (the peer may send bytes from then on).
    confirmed: bool,
    /// Accepting side: our CLAIM is out with this secret.
    claimed: Option<Secret>,
    /// Accepting side: the peer's CONFIRM came.
    confirm_seen: bool,
    /// Connecting side: the peer's MOVED came, with the count of its bytes sent over TCP.
    moved: Option<u64>,
    /// The peer's FIN came.
    fin: bool,
    /// Connecting side: our REUSE is out.
    reuse_sent: bool,
    /// The connection's last message came (REUSE or REUSED).
    last: bool,
}

impl Binding {
    pub(super) fn new(handshake: Handshake) -> Binding {
        Binding {
            handshake,
            claim: None,
            confirmed: false,
            claimed: None,
            confirm_seen: false,
            moved: None,
            fin: false,
            reuse_sent: false,
            last: false,
        }
    }

    /// The handshake the connection was made with.
    pub(super) fn handshake(&self) -> Handshake {
        self.handshake
    }

    /// A control message came from the peer.
    pub(super) fn on_control(&mut self, kind: ControlKind) -> Result<(), Violation> {
        if self.last {
            return Err(Violation::Reuse("after the connection's last message"));
        }
        match kind {
            ControlKind::Credit => Ok(()),
            // It marks a byte of the next data write, or moves the next write to another ring:
            // taken where that write would be.
            ControlKind::Urgent(_) | ControlKind::Switch(_) => self.on_data(),
            // The peer offers a ring for our bytes: once the stream is bound (after its FIN
            // too, since it still takes our bytes then).
            ControlKind::Ring(_) => self.bound(),
            ControlKind::Fin => {
                self.on_data()?;
                self.fin = true;
                Ok(())
            }
            ControlKind::Claim(secret) => match self.handshake {
                Handshake::Confirm if self.claim.is_some() => Err(Violation::Claim("a second")),
                Handshake::Confirm if self.confirmed => Err(Violation::Claim("after CONFIRM")),
                Handshake::Confirm => {
                    self.claim = Some(secret);
                    Ok(())
                }
                Handshake::Open | Handshake::Claim => {
                    Err(Violation::Claim("not a connecting side"))
                }
            },
            ControlKind::Confirm => match self.handshake {
                Handshake::Claim if self.claimed.is_none() => {
                    Err(Violation::Confirm("before our CLAIM"))
                }
                Handshake::Claim if self.confirm_seen => Err(Violation::Confirm("a second")),
                Handshake::Claim => {
                    self.confirm_seen = true;
                    Ok(())
                }
                Handshake::Open | Handshake::Confirm => {
                    Err(Violation::Confirm("not an accepting side"))
                }
            },
            ControlKind::Moved(count) => match self.handshake {
                Handshake::Confirm if !self.confirmed => Err(Violation::Moved("before CONFIRM")),
                Handshake::Confirm if self.moved.is_some() => Err(Violation::Moved("a second")),
                Handshake::Confirm => {
                    self.moved = Some(count);
                    Ok(())
                }
                Handshake::Open | Handshake::Claim => {
                    Err(Violation::Moved("not a connecting side"))
                }
            },
            ControlKind::Reuse(_) => match self.handshake {
                Handshake::Claim if !self.fin => Err(Violation::Reuse("REUSE before FIN")),
                Handshake::Claim => {
                    self.last = true;
                    Ok(())
                }
                Handshake::Open | Handshake::Confirm => {
                    Err(Violation::Reuse("REUSE to a connecting side"))
                }
            },
            ControlKind::Reused(_) => match self.handshake {
                Handshake::Confirm if !self.reuse_sent => Err(Violation::Reuse("unasked")),
                Handshake::Confirm => {
                    self.last = true;
                    Ok(())
                }
                Handshake::Open | Handshake::Claim => {
                    Err(Violation::Reuse("an answer to an accepting side"))
                }
            },
        }
    }

    /// Our REUSE goes out (the connecting side).
    pub(super) fn reuse_sent(&mut self) {
        self.reuse_sent = true;
    }

    /// Stream bytes came from the peer: Ok when the stream may carry them.
    pub(super) fn on_data(&self) -> Result<(), Violation> {
        if self.fin {
            return Err(Violation::AfterFin);
        }
        self.bound()
    }

    /// The stream is bound: the peer may send stream bytes (until its FIN).
    fn bound(&self) -> Result<(), Violation> {
        let open = match self.handshake {
            Handshake::Open => true,
            Handshake::Confirm => self.confirmed && self.moved.is_some(),
            Handshake::Claim => self.confirm_seen,
        };
        if open {
            Ok(())
        } else {
            Err(Violation::EarlyData)
        }
    }

    /// Our CLAIM goes out with `secret` (the accepting side).
    pub(super) fn claim_sent(&mut self, secret: Secret) {
        self.claimed = Some(secret);
    }

    /// Our CONFIRM goes out (the connecting side).
    pub(super) fn confirm_sent(&mut self) {
        self.confirmed = true;
    }

    /// The secret of the peer's CLAIM, once it came (the connecting side).
    pub(super) fn claim(&self) -> Option<Secret> {
        self.claim
    }

    /// The peer's CONFIRM came (the accepting side).
    pub(super) fn confirm_seen(&self) -> bool {
        self.confirm_seen
    }

    /// The count of bytes the peer sent over TCP before its move, once its MOVED came (the
    /// connecting side).
    pub(super) fn moved(&self) -> Option<u64> {
        self.moved
    }

    /// The peer's FIN came.
    pub(super) fn peer_fin(&self) -> bool {
        self.fin
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Payload;

    #[test]
    fn reuse_is_taken_once_in_its_place_and_ends_the_connection() {
        let p = Payload::new(b"hello").unwrap();
        // The accepting side: only after the peer's FIN, once, and nothing after it.
        let mut b = Binding::new(Handshake::Claim);
        b.claim_sent(S);
        assert_eq!(b.on_control(ControlKind::Confirm), Ok(()));
        assert!(b.on_control(ControlKind::Reuse(p)).is_err(), "before FIN");
        let mut b = Binding::new(Handshake::Claim);
        b.claim_sent(S);
        assert_eq!(b.on_control(ControlKind::Confirm), Ok(()));
        assert_eq!(b.on_control(ControlKind::Fin), Ok(()));
        assert!(b.on_control(ControlKind::Reused(p)).is_err());
        let mut b = Binding::new(Handshake::Claim);
        b.claim_sent(S);
        assert_eq!(b.on_control(ControlKind::Confirm), Ok(()));
        assert_eq!(b.on_control(ControlKind::Fin), Ok(()));
        assert_eq!(b.on_control(ControlKind::Credit), Ok(()));
        assert_eq!(b.on_control(ControlKind::Reuse(p)), Ok(()));
        assert!(b.on_control(ControlKind::Reuse(p)).is_err(), "a second");
        assert!(b.on_control(ControlKind::Credit).is_err(), "after it");
        // The connecting side: an answer only to its own REUSE, once.
        let mut b = Binding::new(Handshake::Confirm);
        assert!(b.on_control(ControlKind::Reused(p)).is_err(), "unasked");
        let mut b = Binding::new(Handshake::Confirm);
        assert!(b.on_control(ControlKind::Reuse(p)).is_err());
        b.reuse_sent();
        assert_eq!(b.on_control(ControlKind::Reused(p)), Ok(()));
        assert!(b.on_control(ControlKind::Reused(p)).is_err(), "a second");
        // The gateway's connections are never reused.
        let mut b = Binding::new(Handshake::Open);
        assert_eq!(b.on_control(ControlKind::Fin), Ok(()));
        assert!(b.on_control(ControlKind::Reuse(p)).is_err());
        b.reuse_sent();
        assert!(b.on_control(ControlKind::Reused(p)).is_err());
    }

    const S: Secret = Secret([9; crate::wire::SECRET_LEN]);

    #[test]
    fn the_gateway_takes_bytes_at_once_and_no_claim_or_confirm() {
        let mut b = Binding::new(Handshake::Open);
        assert_eq!(b.on_data(), Ok(()));
        assert!(b.on_control(ControlKind::Claim(S)).is_err());
        assert!(b.on_control(ControlKind::Confirm).is_err());
        assert_eq!(b.on_control(ControlKind::Credit), Ok(()));
        assert_eq!(b.on_control(ControlKind::Fin), Ok(()));
        assert_eq!(b.on_data(), Err(Violation::AfterFin));
        assert_eq!(b.on_control(ControlKind::Fin), Err(Violation::AfterFin));
        assert_eq!(
            b.on_control(ControlKind::Urgent(0)),
            Err(Violation::AfterFin)
        );
    }

    #[test]
    fn a_connecting_side_takes_one_claim_then_bytes_after_its_confirm() {
        let mut b = Binding::new(Handshake::Confirm);
        assert_eq!(b.on_data(), Err(Violation::EarlyData), "before CLAIM");
        assert_eq!(b.on_control(ControlKind::Fin), Err(Violation::EarlyData));
        assert_eq!(
            b.on_control(ControlKind::Urgent(0)),
            Err(Violation::EarlyData)
        );
        assert!(b.on_control(ControlKind::Confirm).is_err());
        assert_eq!(b.on_control(ControlKind::Claim(S)), Ok(()));
        assert_eq!(b.claim(), Some(S));
        assert!(b.on_control(ControlKind::Claim(S)).is_err(), "a second");
        assert_eq!(b.on_data(), Err(Violation::EarlyData), "before CONFIRM");
        assert!(
            b.on_control(ControlKind::Moved(3)).is_err(),
            "MOVED before CONFIRM"
        );
        b.confirm_sent();
        assert_eq!(b.on_data(), Err(Violation::EarlyData), "before MOVED");
        assert_eq!(b.on_control(ControlKind::Moved(3)), Ok(()));
        assert_eq!(b.moved(), Some(3));
        assert!(b.on_control(ControlKind::Moved(3)).is_err(), "a second");
        assert_eq!(b.on_data(), Ok(()));
    }

    #[test]
    fn a_claim_after_our_confirm_is_refused() {
        let mut b = Binding::new(Handshake::Confirm);
        b.confirm_sent();
        assert!(b.on_control(ControlKind::Claim(S)).is_err());
    }

    #[test]
    fn an_accepting_side_takes_confirm_only_after_its_claim_and_bytes_only_after_confirm() {
        let mut b = Binding::new(Handshake::Claim);
        // What the attacker of the issue sent: CONFIRM and a write before any CLAIM.
        assert!(b.on_control(ControlKind::Confirm).is_err());
        assert_eq!(b.on_data(), Err(Violation::EarlyData));
        assert!(b.on_control(ControlKind::Claim(S)).is_err());
        b.claim_sent(S);
        assert_eq!(
            b.on_data(),
            Err(Violation::EarlyData),
            "CLAIM out, no CONFIRM"
        );
        assert_eq!(b.on_control(ControlKind::Confirm), Ok(()));
        assert!(b.confirm_seen());
        assert!(b.on_control(ControlKind::Confirm).is_err(), "a second");
        assert!(
            b.on_control(ControlKind::Moved(0)).is_err(),
            "never a MOVED"
        );
        assert_eq!(b.on_data(), Ok(()));
        assert_eq!(b.on_control(ControlKind::Fin), Ok(()));
        assert!(b.peer_fin());
        assert_eq!(b.on_data(), Err(Violation::AfterFin));
    }
}
