//! Renewing the serving certificate before it expires: at two thirds of its life a new one
//! is issued from the same CA and written over the old files. The HTTPS server reads the
//! files per handshake, so nothing else has to happen; the caBundle does not change.
//!
//! When the CA changes ([`super::follow`]) the replica moves to it, but only once the caBundle
//! holds the new CA ([`super::cabundle`] says so on [`CaFeed::bundled`]) and the API server
//! had [`CaFeed::propagation`] to see that: a certificate from a CA the API server does not
//! trust yet would fail every admission call to this replica. Until then the replica serves
//! (and renews) from the CA it had, which the bundle keeps during the new CA's overlap.

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, SystemTime},
};

use rdma_streams_common::report::Report;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{CertAuthority, ServiceIdentity, ServingCert, issue_serving_cert, write_serving_cert};

/// Longest single sleep: the wake-up time is recomputed from the wall clock at least this
/// often, so suspend or clock jumps delay a renewal by at most this much.
const MAX_SLEEP: Duration = Duration::from_secs(60 * 60);
/// Pause after a failed renewal (the current certificate still has a third of its life).
const RETRY_AFTER: Duration = Duration::from_secs(60);
/// How long the API server gets to pick up a caBundle change before a replica serves from the
/// new CA (it watches webhook configurations).
pub const DEFAULT_PROPAGATION: Duration = Duration::from_secs(5);

/// Where the renewal learns of a new CA and of the caBundle holding it.
#[derive(Debug)]
pub struct CaFeed {
    /// The CA of the CA Secret ([`super::follow`]).
    pub ca: watch::Receiver<Arc<CertAuthority>>,
    /// The CA PEM the caBundle is known to hold (from [`super::cabundle`]).
    pub bundled: watch::Receiver<Option<String>>,
    /// Pause between the bundle holding a new CA and serving from it.
    pub propagation: Duration,
}

impl CaFeed {
    /// The newest CA if it differs from `issuer` and the bundle holds it.
    fn ready_switch(&self, issuer: &CertAuthority) -> Option<Arc<CertAuthority>> {
        let newest = self.ca.borrow().clone();
        let held = self.bundled.borrow().as_deref() == Some(newest.cert_pem());
        (newest.cert_pem() != issuer.cert_pem() && held).then_some(newest)
    }
}

/// Keeps `<dir>/tls.crt` and `<dir>/tls.key` renewed until `shutdown` is cancelled, moving to a
/// new CA as the module docs say. `current` is the certificate now on disk (from
/// [`super::bootstrap()`]), and `issuer` the CA that issued it. Never returns on errors: a
/// failed renewal is logged and retried every minute.
pub async fn run_serving_cert_renewal(
    mut feed: CaFeed,
    mut issuer: Arc<CertAuthority>,
    identity: ServiceIdentity,
    dir: PathBuf,
    current: ServingCert,
    shutdown: CancellationToken,
) {
    let mut renew_at = current.renew_at();
    let (mut ca_open, mut bundled_open) = (true, true);
    let mut waiting_said = false;
    loop {
        if let Some(newest) = feed.ready_switch(&issuer) {
            info!(propagation = ?feed.propagation, "the caBundle holds the new CA: serving from it after the API server saw it");
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(feed.propagation) => {}
            }
            issuer = newest;
            renew_at = SystemTime::now();
            waiting_said = false;
        }
        let wait = renew_at
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        if !wait.is_zero() {
            let ca_changed = async {
                if ca_open {
                    feed.ca.changed().await.is_ok()
                } else {
                    std::future::pending().await
                }
            };
            let bundled_changed = async {
                if bundled_open {
                    feed.bundled.changed().await.is_ok()
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait.min(MAX_SLEEP)) => {}
                open = ca_changed => {
                    // A closed channel: nobody changes the CA any more.
                    ca_open = open;
                    if open && !waiting_said && feed.ready_switch(&issuer).is_none() {
                        info!("new CA: serving from the current one until the caBundle holds it");
                        waiting_said = true;
                    }
                }
                open = bundled_changed => bundled_open = open,
            }
            continue;
        }
        let renewed = match issue_serving_cert(&issuer, &identity) {
            Ok(cert) => write_serving_cert(&dir, &cert).await.map(|()| cert),
            Err(e) => Err(e),
        };
        match renewed {
            Ok(cert) => {
                info!(dir = %dir.display(), not_after = ?cert.not_after, "serving certificate renewed");
                renew_at = cert.renew_at();
            }
            Err(error) => {
                warn!(error = %Report(&error), dir = %dir.display(), "serving certificate renewal failed; retrying");
                renew_at = SystemTime::now() + RETRY_AFTER;
            }
        }
        if shutdown.is_cancelled() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::{TLS_CERT_FILE, issue::verify_serving_cert};

    /// A feed whose CA never changes (both channels closed).
    fn fixed(ca: Arc<CertAuthority>) -> CaFeed {
        let (ca_tx, ca) = watch::channel(ca);
        let (bundled_tx, bundled) = watch::channel(None);
        drop((ca_tx, bundled_tx));
        CaFeed {
            ca,
            bundled,
            propagation: DEFAULT_PROPAGATION,
        }
    }

    #[tokio::test]
    async fn a_certificate_past_two_thirds_is_replaced_and_the_loop_stops_on_shutdown() {
        let ca = CertAuthority::generate().unwrap();
        let identity = ServiceIdentity::new("svc", "ns");
        let tmp = tempfile::tempdir().unwrap();
        let day = Duration::from_secs(24 * 60 * 60);
        let stale = ServingCert {
            cert_pem: "old".into(),
            key_pem: "old".into(),
            not_before: SystemTime::now() - 70 * day,
            not_after: SystemTime::now() + 20 * day,
        };
        let ca_pem = ca.cert_pem().to_owned();
        let shutdown = CancellationToken::new();
        let ca = Arc::new(ca);
        let task = tokio::spawn(run_serving_cert_renewal(
            fixed(ca.clone()),
            ca,
            identity,
            tmp.path().to_owned(),
            stale,
            shutdown.clone(),
        ));
        let cert_file = tmp.path().join(TLS_CERT_FILE);
        let cert = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Ok(c) = tokio::fs::read_to_string(&cert_file).await {
                    return c;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("renewed certificate written");
        verify_serving_cert(&ca_pem, &cert, "svc.ns.svc", SystemTime::now()).unwrap();
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .expect("loop stops on shutdown")
            .unwrap();
    }

    #[tokio::test]
    async fn a_new_ca_is_served_once_the_bundle_holds_it_and_the_api_server_saw_it() {
        let first = CertAuthority::generate().unwrap();
        let identity = ServiceIdentity::new("svc", "ns");
        let tmp = tempfile::tempdir().unwrap();
        let current = issue_serving_cert(&first, &identity).unwrap();
        write_serving_cert(tmp.path(), &current).await.unwrap();
        let first = Arc::new(first);
        let (ca_tx, ca) = watch::channel(first.clone());
        let (bundled_tx, bundled) = watch::channel(None);
        let propagation = Duration::from_millis(200);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run_serving_cert_renewal(
            CaFeed {
                ca,
                bundled,
                propagation,
            },
            first,
            identity,
            tmp.path().to_owned(),
            current.clone(),
            shutdown.clone(),
        ));
        let cert_file = tmp.path().join(TLS_CERT_FILE);
        let on_disk = || std::fs::read_to_string(&cert_file).unwrap();

        // A new CA the caBundle does not hold yet: the certificate stays.
        let second = CertAuthority::generate().unwrap();
        let second_pem = second.cert_pem().to_owned();
        ca_tx.send_replace(Arc::new(second));
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(
            on_disk(),
            current.cert_pem,
            "served from a CA the API server may not trust"
        );

        // The bundle holds it: a certificate from it, after the propagation pause.
        let held = std::time::Instant::now();
        bundled_tx.send_replace(Some(second_pem.clone()));
        let cert = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let c = on_disk();
                if c != current.cert_pem {
                    return c;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("a certificate from the new CA, without waiting for the renewal time");
        assert!(held.elapsed() >= propagation, "{:?}", held.elapsed());
        verify_serving_cert(&second_pem, &cert, "svc.ns.svc", SystemTime::now()).unwrap();
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .expect("loop stops on shutdown")
            .unwrap();
    }
}
