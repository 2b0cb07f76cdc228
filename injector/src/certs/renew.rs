//! Renewing the serving certificate before it expires: at two thirds of its life a new one
//! is issued from the same CA and written over the old files. The HTTPS server reads the
//! files per handshake, so nothing else has to happen; the caBundle does not change. When the
//! CA changes ([`super::follow`]) a certificate from the new CA is issued at once.

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, SystemTime},
};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{CertAuthority, ServiceIdentity, ServingCert, issue_serving_cert, write_serving_cert};

/// Longest single sleep: the wake-up time is recomputed from the wall clock at least this
/// often, so suspend or clock jumps delay a renewal by at most this much.
const MAX_SLEEP: Duration = Duration::from_secs(60 * 60);
/// Pause after a failed renewal (the current certificate still has a third of its life).
const RETRY_AFTER: Duration = Duration::from_secs(60);

/// Keeps `<dir>/tls.crt` and `<dir>/tls.key` renewed until `shutdown` is cancelled, issued by
/// the CA on `ca` (a new CA there means a new certificate at once). `current` is the
/// certificate now on disk (from [`super::bootstrap()`]). Never returns on errors: a failed
/// renewal is logged and retried every minute.
pub async fn run_serving_cert_renewal(
    mut ca: watch::Receiver<Arc<CertAuthority>>,
    identity: ServiceIdentity,
    dir: PathBuf,
    current: ServingCert,
    shutdown: CancellationToken,
) {
    let mut renew_at = current.renew_at();
    let mut ca_open = true;
    loop {
        let wait = renew_at
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        if !wait.is_zero() {
            let changed = async {
                if ca_open {
                    ca.changed().await
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait.min(MAX_SLEEP)) => continue,
                result = changed => {
                    // A closed channel: nobody changes the CA any more, keep renewing from it.
                    ca_open = result.is_ok();
                    if ca_open {
                        info!("new CA: issuing a serving certificate from it");
                        renew_at = SystemTime::now();
                    }
                    continue;
                }
            }
        }
        let issuer = ca.borrow_and_update().clone();
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
                warn!(%error, dir = %dir.display(), "serving certificate renewal failed; retrying");
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
    use crate::certs::{TLS_CERT_FILE, verify_serving_cert};

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
        let (_ca_tx, ca_rx) = watch::channel(Arc::new(ca));
        let task = tokio::spawn(run_serving_cert_renewal(
            ca_rx,
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
    async fn a_new_ca_gets_a_certificate_from_it_at_once() {
        let first = CertAuthority::generate().unwrap();
        let identity = ServiceIdentity::new("svc", "ns");
        let tmp = tempfile::tempdir().unwrap();
        let current = issue_serving_cert(&first, &identity).unwrap();
        write_serving_cert(tmp.path(), &current).await.unwrap();
        let (ca_tx, ca_rx) = watch::channel(Arc::new(first));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run_serving_cert_renewal(
            ca_rx,
            identity,
            tmp.path().to_owned(),
            current.clone(),
            shutdown.clone(),
        ));
        let second = CertAuthority::generate().unwrap();
        let second_pem = second.cert_pem().to_owned();
        ca_tx.send_replace(Arc::new(second));
        let cert_file = tmp.path().join(TLS_CERT_FILE);
        let cert = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let c = tokio::fs::read_to_string(&cert_file).await.unwrap();
                if c != current.cert_pem {
                    return c;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("a certificate from the new CA, without waiting for the renewal time");
        verify_serving_cert(&second_pem, &cert, "svc.ns.svc", SystemTime::now()).unwrap();
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .expect("loop stops on shutdown")
            .unwrap();
    }
}
