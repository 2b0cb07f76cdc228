//! Finished connections kept for the next one between the same two processes
//! (docs/shim-protocol.md, "Reused connections"; SMC-R keeps its link groups the same way).
//!
//! A connection of the shim that finished in order leaves a queue pair, a CQ, registered start
//! rings and every receive posted: all a next connection between the same two engines needs.
//! Instead of disconnecting, each side *parks* it for [`IDLE`] (the accepting side twice as
//! long, so that a connecting side's REUSE finds it there). The connecting side's next connect
//! to the same listener from the same address takes it: REUSE carries the connect request's
//! payload, the accepting side's listener judges it as it judges a connect request (nothing is
//! allocated for it), and REUSED carries the accept's. A REUSE the accepting side does not take
//! is answered with a disconnect, and the connecting side makes a connect request instead:
//! nothing waits on a parked link longer than [`REUSE_WAIT`].

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// How long the connecting side keeps a finished connection for the next one.
pub(super) const IDLE: Duration = Duration::from_secs(2);
/// How long a connect waits for REUSED before it makes a connect request instead: far above
/// a REUSE's round trip (a millisecond or two under TCG), and far enough below the shim's
/// default negotiation bound (200 ms) that the connect request still fits in it.
pub(super) const REUSE_WAIT: Duration = Duration::from_millis(50);
/// Parked connections of an engine at most ...
pub(super) const MAX_PARKED: usize = 64;
/// ... and with one peer address.
pub(super) const MAX_PARKED_PER_PEER: usize = 16;

/// Which end of the finished connection this side was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    /// The connecting side: a connect to `dst` from `src` may take it.
    Connecting { dst: SocketAddr, src: IpAddr },
    /// The accepting side: `listener`'s acceptor judges the peer's REUSE; `from` is the peer.
    Accepting { listener: u64, from: Option<IpAddr> },
}

impl Side {
    /// The peer's address.
    pub(super) fn peer(&self) -> Option<IpAddr> {
        match *self {
            Side::Connecting { dst, .. } => Some(dst.ip()),
            Side::Accepting { from, .. } => from,
        }
    }
}

/// A parked connection's state (its queue pair and link stay in its `StreamConn`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Parked {
    pub(super) side: Side,
    /// When it is disconnected if no connection took it.
    pub(super) until: Instant,
    /// The connecting side: the connection whose REUSE is out.
    pub(super) reuser: Option<u64>,
}

impl Parked {
    /// Parked at `now` on `side`.
    pub(super) fn new(side: Side, now: Instant) -> Parked {
        let idle = match side {
            Side::Connecting { .. } => IDLE,
            Side::Accepting { .. } => 2 * IDLE,
        };
        Parked {
            side,
            until: now + idle,
            reuser: None,
        }
    }

    /// A connect to `dst` from `src` may take it now.
    pub(super) fn takes(&self, dst: SocketAddr, src: Option<IpAddr>, now: Instant) -> bool {
        self.reuser.is_none()
            && self.until > now
            && matches!(self.side, Side::Connecting { dst: d, src: s }
                if d == dst && src.is_none_or(|src| src == s))
    }
}

/// Whether one more parked connection with `peer` stays within [`MAX_PARKED`] and
/// [`MAX_PARKED_PER_PEER`], given those parked now.
pub(super) fn room<'a>(parked: impl Iterator<Item = &'a Parked>, peer: Option<IpAddr>) -> bool {
    let (mut all, mut theirs) = (0usize, 0usize);
    for p in parked {
        all += 1;
        if p.side.peer() == peer {
            theirs += 1;
        }
    }
    all < MAX_PARKED && theirs < MAX_PARKED_PER_PEER
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_connect_to_the_same_listener_from_the_same_address_takes_a_parked_link() {
        let now = Instant::now();
        let dst: SocketAddr = "198.18.0.1:5201".parse().unwrap();
        let src: IpAddr = "198.18.0.2".parse().unwrap();
        let mut p = Parked::new(Side::Connecting { dst, src }, now);
        assert!(p.takes(dst, Some(src), now));
        assert!(p.takes(dst, None, now));
        assert!(!p.takes("198.18.0.1:5202".parse().unwrap(), Some(src), now));
        assert!(!p.takes(dst, Some("198.18.0.3".parse().unwrap()), now));
        assert!(!p.takes(dst, Some(src), now + IDLE), "expired");
        p.reuser = Some(7);
        assert!(!p.takes(dst, Some(src), now), "taken");
        let a = Parked::new(
            Side::Accepting {
                listener: 1,
                from: Some(src),
            },
            now,
        );
        assert!(
            !a.takes(dst, Some(src), now),
            "an accepting side is never taken"
        );
        assert_eq!(a.until, now + 2 * IDLE);
    }

    #[test]
    fn parked_links_are_bounded_in_all_and_per_peer() {
        let now = Instant::now();
        let one: IpAddr = "198.18.0.2".parse().unwrap();
        let accepting = |from: IpAddr| {
            Parked::new(
                Side::Accepting {
                    listener: 1,
                    from: Some(from),
                },
                now,
            )
        };
        let theirs: Vec<Parked> = (0..MAX_PARKED_PER_PEER).map(|_| accepting(one)).collect();
        assert!(!room(theirs.iter(), Some(one)));
        let other: IpAddr = "198.18.0.3".parse().unwrap();
        assert!(room(theirs.iter(), Some(other)));
        let many: Vec<Parked> = (0..MAX_PARKED)
            .map(|i| accepting(IpAddr::from([10, 0, (i / 200) as u8, (i % 200) as u8])))
            .collect();
        assert!(!room(many.iter(), Some(other)));
    }
}
