//! What caBundle the webhooks should carry for a CA, also while the CA changes.
//!
//! The CA Secret is the one source of truth: every replica serves a certificate from the CA in
//! it, follows it when it changes ([`super::follow`]) and keeps the caBundle right for it
//! ([`super::cabundle`]). A CA change is not seen by every replica at the same instant, so
//! for a while some replicas still serve a certificate from the previous CA. A young CA
//! therefore *joins* the bundle instead of replacing it: while the CA is younger than
//! [`ROTATION_OVERLAP`] a bundle that contains it is left alone, and one that lacks it gets it
//! added in front of the certificates already there. Once the overlap is over the bundle is
//! exactly the CA again. The rule depends only on the CA certificate, the bundle and the clock,
//! so all replicas agree on it and never patch the bundle back and forth.

use std::{
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use rdma_streams_common::runtime::Tasks;
use tokio::sync::watch;

use crate::server::x509;

use super::{CertAuthority, ca::CLOCK_SKEW_ALLOWANCE};

/// How long after its creation a new CA shares the caBundle with the certificates already in
/// it: far longer than replicas take to see the CA Secret change (a watch event).
pub const ROTATION_OVERLAP: Duration = Duration::from_secs(15 * 60);

const PEM_END: &str = "-----END CERTIFICATE-----";

/// The caBundle wanted for one CA; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleTarget {
    /// The CA certificate (PEM).
    pub ca_pem: String,
    /// Until then a bundle that holds the CA may hold other certificates too.
    pub overlap_until: Option<SystemTime>,
}

impl BundleTarget {
    /// The target for `ca`: its PEM, with an overlap until [`ROTATION_OVERLAP`] after its
    /// creation (its `notBefore` plus the clock-skew allowance it was back-dated by).
    pub fn for_ca(ca: &CertAuthority) -> BundleTarget {
        let not_before = pem_not_before(ca.cert_pem());
        BundleTarget {
            ca_pem: ca.cert_pem().to_owned(),
            overlap_until: not_before.map(|t| t + CLOCK_SKEW_ALLOWANCE + ROTATION_OVERLAP),
        }
    }

    /// Exactly `ca_pem`, never anything else.
    #[cfg(test)]
    pub fn exact(ca_pem: impl Into<String>) -> BundleTarget {
        BundleTarget {
            ca_pem: ca_pem.into(),
            overlap_until: None,
        }
    }

    /// True while the CA is young enough to share the bundle.
    pub fn in_overlap(&self, now: SystemTime) -> bool {
        self.overlap_until.is_some_and(|until| now < until)
    }

    /// The bundle a webhook whose caBundle is `current` should get, or `None` if it is right.
    pub fn wanted(&self, current: Option<&[u8]>, now: SystemTime) -> Option<String> {
        let current = current.map(String::from_utf8_lossy);
        let current = current.as_deref();
        if current == Some(self.ca_pem.as_str()) {
            return None;
        }
        if !self.in_overlap(now) {
            return Some(self.ca_pem.clone());
        }
        let others = current.map(pem_blocks).unwrap_or_default();
        let ca = self.ca_pem.trim();
        if others.contains(&ca) {
            return None;
        }
        let mut bundle = self.ca_pem.clone();
        if !bundle.ends_with('\n') {
            bundle.push('\n');
        }
        for block in others {
            bundle.push_str(block);
            bundle.push('\n');
        }
        Some(bundle)
    }
}

/// The bundle targets of the CAs published on `ca`: the task `bundle targets` of `tasks`
/// follows it until it closes, nobody listens any more, or shutdown.
pub fn bundle_targets(
    mut ca: watch::Receiver<Arc<CertAuthority>>,
    tasks: &Tasks,
) -> watch::Receiver<BundleTarget> {
    let (tx, rx) = watch::channel(BundleTarget::for_ca(&ca.borrow_and_update()));
    let shutdown = tasks.shutdown().clone();
    tasks.spawn("bundle targets", async move {
        loop {
            tokio::select! {
                changed = ca.changed() => if changed.is_err() { return },
                () = shutdown.cancelled() => return,
            }
            let target = BundleTarget::for_ca(&ca.borrow_and_update());
            if tx.send(target).is_err() {
                return;
            }
        }
    });
    rx
}

/// The certificate blocks of a PEM bundle, trimmed; text outside blocks is dropped.
fn pem_blocks(bundle: &str) -> Vec<&str> {
    let mut blocks = Vec::new();
    let mut rest = bundle;
    while let Some(start) = rest.find("-----BEGIN CERTIFICATE-----") {
        let Some(len) = rest[start..].find(PEM_END) else {
            break;
        };
        let end = start + len + PEM_END.len();
        blocks.push(rest[start..end].trim());
        rest = &rest[end..];
    }
    blocks
}

/// `notBefore` of the first certificate of `pem`.
fn pem_not_before(pem: &str) -> Option<SystemTime> {
    let secs = x509::summarize_pem(pem).not_before?;
    Some(UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEW: &str = "-----BEGIN CERTIFICATE-----\nMIIBnew\n-----END CERTIFICATE-----\n";
    const OLD: &str = "-----BEGIN CERTIFICATE-----\nMIIBold\n-----END CERTIFICATE-----\n";

    fn young() -> BundleTarget {
        BundleTarget {
            ca_pem: NEW.into(),
            overlap_until: Some(SystemTime::now() + Duration::from_secs(60)),
        }
    }

    #[test]
    fn a_bundle_that_is_the_ca_is_right_in_and_after_the_overlap() {
        let now = SystemTime::now();
        assert_eq!(young().wanted(Some(NEW.as_bytes()), now), None);
        assert_eq!(
            BundleTarget::exact(NEW).wanted(Some(NEW.as_bytes()), now),
            None
        );
    }

    #[test]
    fn a_young_ca_joins_the_bundle_and_a_bundle_holding_it_stays() {
        let now = SystemTime::now();
        let joined = young().wanted(Some(OLD.as_bytes()), now).unwrap();
        assert_eq!(joined, format!("{NEW}{OLD}"));
        assert_eq!(young().wanted(Some(joined.as_bytes()), now), None);
        // The other order, and a bundle without a final newline, hold it too.
        let other_order = format!("{OLD}{}", NEW.trim_end());
        assert_eq!(young().wanted(Some(other_order.as_bytes()), now), None);
        // Nothing there yet, or garbage: just the CA.
        assert_eq!(young().wanted(None, now).unwrap(), NEW);
        assert_eq!(young().wanted(Some(b"junk"), now).unwrap(), NEW);
    }

    #[test]
    fn after_the_overlap_the_bundle_is_exactly_the_ca() {
        let later = SystemTime::now() + Duration::from_secs(120);
        let joined = format!("{NEW}{OLD}");
        assert_eq!(young().wanted(Some(joined.as_bytes()), later).unwrap(), NEW);
        assert_eq!(young().wanted(Some(OLD.as_bytes()), later).unwrap(), NEW);
        let exact = BundleTarget::exact(NEW);
        assert_eq!(
            exact
                .wanted(Some(joined.as_bytes()), SystemTime::now())
                .unwrap(),
            NEW
        );
    }

    #[test]
    fn a_real_ca_overlaps_for_its_first_minutes() {
        let ca = CertAuthority::generate().unwrap();
        let target = BundleTarget::for_ca(&ca);
        let until = target.overlap_until.expect("notBefore parsed");
        let now = SystemTime::now();
        assert!(
            until > now + ROTATION_OVERLAP - Duration::from_secs(5),
            "{until:?}"
        );
        assert!(until <= now + ROTATION_OVERLAP, "{until:?}");
        assert!(target.in_overlap(now));
        assert!(!target.in_overlap(until));
    }
}
