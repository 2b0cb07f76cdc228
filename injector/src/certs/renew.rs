//! Renewing the serving certificate before it expires: at two thirds of its life a new one
//! is issued from the same CA and written over the old files. The HTTPS server reads the
//! files per handshake, so nothing else has to happen; the caBundle does not change.

use std::{
    path::PathBuf,
    time::{Duration, SystemTime},
};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{CertAuthority, ServiceIdentity, ServingCert, issue_serving_cert, write_serving_cert};

/// Longest single sleep: the wake-up time is recomputed from the wall clock at least this
/// often, so suspend or clock jumps delay a renewal by at most this much.
const MAX_SLEEP: Duration = Duration::from_secs(60 * 60);
/// Pause after a failed renewal (the current certificate still has a third of its life).
const RETRY_AFTER: Duration = Duration::from_secs(60);

/// Keeps `<dir>/tls.crt` and `<dir>/tls.key` renewed until `shutdown` is cancelled.
/// `current` is the certificate now on disk (from [`super::bootstrap()`]). Never returns on
/// errors: a failed renewal is logged and retried every minute.
pub async fn run_serving_cert_renewal(
    ca: CertAuthority,
    identity: ServiceIdentity,
    dir: PathBuf,
    current: ServingCert,
    shutdown: CancellationToken,
) {
    let mut renew_at = current.renew_at();
    loop {
        let wait = renew_at
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        if !wait.is_zero() {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait.min(MAX_SLEEP)) => continue,
            }
        }
        let renewed = match issue_serving_cert(&ca, &identity) {
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
        let task = tokio::spawn(run_serving_cert_renewal(
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
}
