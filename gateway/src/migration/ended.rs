//! [`EndedMigrations`]: which migrations of each VMI are over, so a late `Started` for one of
//! them cannot restart it.
//!
//! Two producers report a migration's start: the node hook (at once) and the VMI watch (when
//! its stream gets there). A watch that lags a whole migration behind delivers the previous
//! migration's `Started` after a node hook has started the next one; taken as news, it would
//! tear the running migration down (the core replaces a different migration of the same VMI)
//! and capture for one that is over. A migration is recorded here when it ends (its `Ended`,
//! named or not) or when a different migration of its VMI replaces it, and its `Started` is
//! then ignored.
//!
//! Bounded: the newest [`PER_VMI`] migration ids per VMI, and the [`VMIS`] VMIs whose migration
//! ended most recently. A migration forgotten by then is older than anything a watch could
//! still be replaying.

use std::collections::{HashMap, VecDeque};

/// Migration ids kept per VMI.
pub const PER_VMI: usize = 8;
/// VMIs kept.
pub const VMIS: usize = 4096;

/// See the module docs.
#[derive(Debug, Default)]
pub struct EndedMigrations {
    /// VMI uid -> its ended migration ids, oldest first.
    per_vmi: HashMap<String, VecDeque<String>>,
    /// VMI uids, least recently recorded first.
    order: VecDeque<String>,
}

impl EndedMigrations {
    /// Records that migration `id` of VMI `uid` is over. An empty id (a producer that does not
    /// know which migration it is) records nothing.
    pub fn record(&mut self, uid: &str, id: &str) {
        if id.is_empty() {
            return;
        }
        if let Some(at) = self.order.iter().position(|u| u == uid) {
            self.order.remove(at);
        }
        self.order.push_back(uid.to_owned());
        let ids = self.per_vmi.entry(uid.to_owned()).or_default();
        if !ids.iter().any(|known| known == id) {
            ids.push_back(id.to_owned());
            if ids.len() > PER_VMI {
                ids.pop_front();
            }
        }
        while self.order.len() > VMIS {
            if let Some(oldest) = self.order.pop_front() {
                self.per_vmi.remove(&oldest);
            }
        }
    }

    /// True if migration `id` of VMI `uid` is recorded as over (never for an empty id).
    pub fn contains(&self, uid: &str, id: &str) -> bool {
        !id.is_empty()
            && self
                .per_vmi
                .get(uid)
                .is_some_and(|ids| ids.iter().any(|known| known == id))
    }

    /// Number of VMIs with a recorded migration.
    #[cfg(test)]
    pub fn vmis(&self) -> usize {
        self.per_vmi.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_ids_are_known_per_vmi_and_empty_ids_never() {
        let mut ended = EndedMigrations::default();
        ended.record("u1", "m1");
        ended.record("u1", "");
        assert!(ended.contains("u1", "m1"));
        assert!(!ended.contains("u2", "m1"), "another VMI's migration");
        assert!(!ended.contains("u1", "m2"));
        assert!(!ended.contains("u1", ""));
        ended.record("u1", "m1");
        assert_eq!(ended.per_vmi["u1"].len(), 1, "recorded once");
    }

    #[test]
    fn each_vmi_keeps_its_newest_ids() {
        let mut ended = EndedMigrations::default();
        for n in 0..=PER_VMI {
            ended.record("u1", &format!("m{n}"));
        }
        assert!(!ended.contains("u1", "m0"), "the oldest went");
        assert!((1..=PER_VMI).all(|n| ended.contains("u1", &format!("m{n}"))));
    }

    #[test]
    fn the_vmis_recorded_least_recently_go_first() {
        let mut ended = EndedMigrations::default();
        for n in 0..VMIS {
            ended.record(&format!("u{n}"), "m");
        }
        // u0 is recorded again: u1 is now the least recent and goes when one more VMI comes.
        ended.record("u0", "m2");
        ended.record("new", "m");
        assert_eq!(ended.vmis(), VMIS);
        assert!(ended.contains("u0", "m") && ended.contains("u0", "m2"));
        assert!(!ended.contains("u1", "m"));
        assert!(ended.contains("new", "m"));
    }
}
