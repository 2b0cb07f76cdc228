//! Control messages of one connection (net/smc's `smc_cdc.c`): what our send half queued,
//! posted and saw completed, and the checks a peer's message passes before anything of it is
//! used.
//!
//! A control message (CLAIM, CONFIRM, a credit report, FIN: [`crate::wire::Control`]) takes one
//! of the peer's posted receives and one of our control slots until its completion reports it.
//! The send half ([`super::tx`]) posts them under its lock; [`Controls`] is the bookkeeping it
//! keeps there. A message from the peer ([`decode`]) must be exactly one control message long
//! and of a known kind; whether the connection takes it now is [`super::binding`]'s to say.

use std::collections::VecDeque;

use crate::wire::{CONTROL_LEN, Control, ControlKind};

/// Our control messages: queued, posted (their count is the next one's sequence number) and
/// completed.
#[derive(Debug, Default)]
pub(super) struct Controls {
    queued: VecDeque<ControlKind>,
    posted: u64,
    /// Messages completed: every message with a lower sequence number.
    done: u64,
    /// FIN's sequence number, once posted.
    fin: Option<u64>,
}

impl Controls {
    /// Queues `kind`; a credit report only when none is queued (one carries the latest counts).
    pub(super) fn queue(&mut self, kind: ControlKind) {
        if kind == ControlKind::Credit && self.queued.contains(&ControlKind::Credit) {
            return;
        }
        self.queued.push_back(kind);
    }

    /// Takes the next queued message, to be posted now ([`Controls::posted_one`]).
    pub(super) fn next(&mut self) -> Option<ControlKind> {
        self.queued.pop_front()
    }

    /// `kind` was posted, with sequence number [`Controls::posted`] (before this call).
    pub(super) fn posted_one(&mut self, kind: ControlKind) {
        if kind == ControlKind::Fin {
            self.fin = Some(self.posted);
        }
        self.posted += 1;
    }

    /// Messages queued and not posted.
    pub(super) fn queued(&self) -> usize {
        self.queued.len()
    }

    /// Messages posted so far.
    pub(super) fn posted(&self) -> u64 {
        self.posted
    }

    /// Messages posted and not reported completed (each holds one of the peer's receives).
    pub(super) fn in_flight(&self) -> u64 {
        self.posted - self.done
    }

    /// A completion reported the first `n` messages done.
    pub(super) fn completed_up_to(&mut self, n: u64) {
        self.done = self.done.max(n.min(self.posted));
    }

    /// FIN is queued or posted.
    pub(super) fn fin_queued(&self) -> bool {
        self.fin.is_some() || self.queued.contains(&ControlKind::Fin)
    }

    /// FIN was posted and its completion came (every byte before it arrived).
    pub(super) fn fin_done(&self) -> bool {
        self.fin.is_some_and(|seq| self.done > seq)
    }
}

/// A message the peer sent into one of our receive slots: `len` bytes of `slot`.
pub(super) fn decode(slot: &[u8], len: usize) -> Result<Control, String> {
    if len != CONTROL_LEN {
        return Err(format!("a control message of {len} bytes"));
    }
    Control::decode(slot).ok_or_else(|| String::from("unknown control message"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credits_coalesce_and_fin_is_done_only_after_its_completion() {
        let mut c = Controls::default();
        c.queue(ControlKind::Credit);
        c.queue(ControlKind::Credit);
        c.queue(ControlKind::Fin);
        assert!(c.fin_queued());
        assert!(!c.fin_done());
        let kinds: Vec<_> = std::iter::from_fn(|| {
            let k = c.next()?;
            c.posted_one(k);
            Some(k)
        })
        .collect();
        assert_eq!(kinds, [ControlKind::Credit, ControlKind::Fin]);
        assert_eq!(c.in_flight(), 2);
        c.completed_up_to(1);
        assert!(!c.fin_done(), "only the credit completed");
        c.completed_up_to(0);
        assert_eq!(c.in_flight(), 1, "completions never go back");
        c.completed_up_to(9);
        assert!(c.fin_done());
        assert_eq!(c.in_flight(), 0, "never more than was posted");
    }

    #[test]
    fn a_peer_message_of_another_length_or_kind_is_refused() {
        let good = Control {
            kind: ControlKind::Credit,
            consumed: 5,
            reposted: 2,
        }
        .encode();
        assert_eq!(decode(&good, CONTROL_LEN).map(|c| c.consumed), Ok(5));
        assert!(decode(&good, CONTROL_LEN - 1).is_err());
        assert!(decode(&good, 0).is_err());
        let mut bad = good;
        bad[0] = 0xee;
        assert!(decode(&bad, CONTROL_LEN).is_err());
    }
}
