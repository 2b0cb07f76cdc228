//! Following the CA Secret: every replica serves from the CA that is in the Secret now.
//!
//! The Secret is watched (field selector `metadata.name=<name>`). When it holds a different,
//! usable CA (an admin replaced it, or another replica re-created it after a delete), the new
//! CA is published on a `watch` channel: the renewal loop re-issues the serving certificate
//! from it at once and the caBundle controller moves the bundle to it, keeping the previous
//! certificates in the bundle for the CA's first minutes ([`super::rotation`]). When the
//! Secret is deleted, the replica races the others to create a new one ([`get_or_create_ca`]:
//! one CREATE wins, the rest read it), so all replicas converge on one CA without a restart.
//! A Secret that is broken (missing keys, a key that is not the certificate's) is logged and
//! ignored: the last good CA stays in use and nothing is written over the Secret. Where RBAC
//! grants no list and watch on the Secret (a chart from before the follower), the watch warns
//! once and keeps trying; until the rules are fixed a new CA reaches this replica only at its
//! next restart.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client,
    runtime::watcher::{self, Event},
};
use rdma_streams_common::{backoff::Backoff, kube::Watch, report::Report};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{CaMetrics, CertAuthority, CertError, bootstrap::ca_from_secret, get_or_create_ca};

/// Longest pause between attempts to re-create a deleted CA Secret.
const MAX_RECREATE_DELAY: Duration = Duration::from_secs(10);

/// What one state of the Secret means for a replica serving from `current`.
#[derive(Debug)]
pub enum SecretChange {
    /// The Secret holds the CA in use.
    Same,
    /// The Secret holds another usable CA: serve from it.
    Adopt(Box<CertAuthority>),
    /// The Secret cannot be used: keep the CA in use.
    Broken(CertError),
}

/// Judges the Secret `namespace/name` against the CA in use.
pub fn judge(
    namespace: &str,
    name: &str,
    secret: &Secret,
    current: &CertAuthority,
) -> SecretChange {
    match ca_from_secret(namespace, name, secret) {
        Ok(ca) if ca.cert_pem() == current.cert_pem() => SecretChange::Same,
        Ok(ca) => SecretChange::Adopt(Box::new(ca)),
        Err(error) => SecretChange::Broken(error),
    }
}

/// Watches the CA Secret `namespace/name` and publishes every new CA on `ca`, until `shutdown`
/// is cancelled; see the module docs. Never returns on API errors (the [`Watch`] retries
/// them with kube's default backoff).
pub async fn run_ca_follower(
    client: Client,
    namespace: String,
    name: String,
    ca: watch::Sender<Arc<CertAuthority>>,
    metrics: CaMetrics,
    shutdown: CancellationToken,
) {
    let api: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = Watch::new(api, config, shutdown.clone());
    let secret = format!("{namespace}/{name}");
    while let Some(event) = events.next().await {
        match event {
            Event::Apply(s) | Event::InitApply(s) => {
                let current = ca.borrow().clone();
                match judge(&namespace, &name, &s, &current) {
                    SecretChange::Same => {}
                    SecretChange::Adopt(new) => {
                        info!(%secret, "the CA Secret holds a new CA; serving from it");
                        metrics.changed(&new);
                        ca.send_replace(Arc::from(new));
                    }
                    SecretChange::Broken(error) => {
                        warn!(%secret, error = %Report(&error), "the CA Secret is unusable; keeping the CA in use");
                    }
                }
            }
            Event::Delete(_) => {
                warn!(%secret, "the CA Secret was deleted; creating a new CA (or reading the one another replica created)");
                let Some(new) = recreate(&client, &namespace, &name, &shutdown).await else {
                    return;
                };
                if new.cert_pem() != ca.borrow().cert_pem() {
                    metrics.changed(&new);
                    ca.send_replace(Arc::new(new));
                }
            }
            Event::Init | Event::InitDone => {}
        }
    }
}

/// [`get_or_create_ca`] until it succeeds; `None` on shutdown.
async fn recreate(
    client: &Client,
    namespace: &str,
    name: &str,
    shutdown: &CancellationToken,
) -> Option<CertAuthority> {
    let mut backoff = Backoff::new(Duration::from_millis(200), MAX_RECREATE_DELAY);
    loop {
        let attempt = tokio::select! {
            biased;
            () = shutdown.cancelled() => return None,
            attempt = get_or_create_ca(client, namespace, name) => attempt,
        };
        match attempt {
            Ok((ca, origin)) => {
                info!(secret = %format!("{namespace}/{name}"), ?origin, "CA Secret back");
                return Some(ca);
            }
            Err(error) => {
                let delay = backoff.next_delay();
                warn!(error = %Report(&error), retry_in = ?delay, "re-creating the CA Secret failed; retrying");
                tokio::select! {
                    () = shutdown.cancelled() => return None,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use http::Method;
    use serde_json::{Value, json};

    use super::*;
    use crate::certs::bootstrap::{CA_CERT_KEY, CA_KEY_KEY};
    use rdma_streams_testkit::mock_api::{
        ApiServerVerifier, Responder, mock_client, query, respond, send_bytes, status_failure,
        timeout_after,
    };

    const NS: &str = "rdma-streams";
    const SECRET: &str = "rdma-stream-injector-ca";
    const SECRETS_PATH: &str = "/api/v1/namespaces/rdma-streams/secrets";
    const SECRET_PATH: &str = "/api/v1/namespaces/rdma-streams/secrets/rdma-stream-injector-ca";

    fn secret_json(ca: &CertAuthority, rv: &str) -> Value {
        let b64 = |pem: &str| serde_json::to_value(k8s_openapi::ByteString(pem.into())).unwrap();
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": { "name": SECRET, "namespace": NS, "resourceVersion": rv },
            "type": "Opaque",
            "data": { CA_CERT_KEY: b64(ca.cert_pem()), CA_KEY_KEY: b64(ca.key_pem()) },
        })
    }

    /// A LIST answer at `rv` holding `item`.
    fn secret_list(rv: &str, item: Value) -> Value {
        json!({
            "apiVersion": "v1", "kind": "SecretList",
            "metadata": { "resourceVersion": rv },
            "items": [item],
        })
    }

    fn secret(value: Value) -> Secret {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_secret_is_judged_against_the_ca_in_use() {
        let in_use = CertAuthority::generate().unwrap();
        let other = CertAuthority::generate().unwrap();
        let same = secret(secret_json(&in_use, "1"));
        assert!(matches!(
            judge(NS, SECRET, &same, &in_use),
            SecretChange::Same
        ));
        let changed = secret(secret_json(&other, "2"));
        match judge(NS, SECRET, &changed, &in_use) {
            SecretChange::Adopt(ca) => assert_eq!(ca.cert_pem(), other.cert_pem()),
            change => panic!("{change:?}"),
        }
        // One CA's certificate with another's key, or a key missing: never adopted.
        let mut mixed = secret_json(&other, "3");
        mixed["data"][CA_KEY_KEY] = secret_json(&in_use, "3")["data"][CA_KEY_KEY].clone();
        assert!(matches!(
            judge(NS, SECRET, &secret(mixed), &in_use),
            SecretChange::Broken(_)
        ));
        let mut keyless = secret_json(&other, "4");
        keyless["data"].as_object_mut().unwrap().remove(CA_KEY_KEY);
        assert!(matches!(
            judge(NS, SECRET, &secret(keyless), &in_use),
            SecretChange::Broken(_)
        ));
    }

    /// The follower of the test Secret on its own task, starting from `ca`.
    fn spawn_follower(
        client: Client,
        ca: CertAuthority,
    ) -> (
        watch::Receiver<Arc<CertAuthority>>,
        CaMetrics,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let (ca_tx, ca_rx) = watch::channel(Arc::new(ca));
        let metrics = CaMetrics::default();
        let shutdown = CancellationToken::new();
        let follower = tokio::spawn(run_ca_follower(
            client,
            NS.into(),
            SECRET.into(),
            ca_tx,
            metrics.clone(),
            shutdown.clone(),
        ));
        (ca_rx, metrics, shutdown, follower)
    }

    /// Expects a LIST or WATCH of the CA Secret (by field selector); returns the responder.
    async fn expect_list(api: &mut ApiServerVerifier, watch: bool) -> Responder {
        let (request, send) = api.expect(Method::GET, SECRETS_PATH).await;
        let q = query(&request);
        assert!(
            q.contains("fieldSelector=metadata.name%3Drdma-stream-injector-ca"),
            "{q}"
        );
        assert_eq!(q.contains("watch=true"), watch, "{q}");
        send
    }

    #[tokio::test]
    async fn a_replaced_broken_or_deleted_secret_reaches_the_replica_without_a_restart() {
        let first = CertAuthority::generate().unwrap();
        let replaced = CertAuthority::generate().unwrap();
        let recreated = CertAuthority::generate().unwrap();
        let (client, mut api) = mock_client();
        let (mut ca_rx, metrics, shutdown, follower) = spawn_follower(
            client,
            CertAuthority::from_pem(first.cert_pem(), first.key_pem()).unwrap(),
        );
        let (replaced_pem, recreated_pem) = (
            replaced.cert_pem().to_owned(),
            recreated.cert_pem().to_owned(),
        );
        let in_use = ca_rx.clone();
        let scenario = tokio::spawn(async move {
            // The list shows the CA in use: nothing happens.
            let send = expect_list(&mut api, false).await;
            respond(send, 200, &secret_list("10", secret_json(&first, "5")));
            // The watch: replaced by an admin, then broken, then deleted.
            let send = expect_list(&mut api, true).await;
            let mut broken = secret_json(&replaced, "12");
            broken["data"].as_object_mut().unwrap().remove(CA_KEY_KEY);
            let events = [
                json!({ "type": "MODIFIED", "object": secret_json(&replaced, "11") }),
                json!({ "type": "MODIFIED", "object": broken }),
                json!({ "type": "DELETED", "object": secret_json(&replaced, "13") }),
            ];
            let body: Vec<u8> = events
                .iter()
                .flat_map(|e| {
                    let mut line = serde_json::to_vec(e).unwrap();
                    line.push(b'\n');
                    line
                })
                .collect();
            send_bytes(send, 200, body);
            // The delete: our CREATE loses to another replica's, whose CA we then read.
            let (_, send) = api.expect(Method::POST, SECRETS_PATH).await;
            assert_eq!(
                in_use.borrow().cert_pem(),
                replaced.cert_pem(),
                "the replaced CA was adopted and the broken Secret left it in use"
            );
            respond(
                send,
                409,
                &status_failure(409, "AlreadyExists", "secrets \"x\" already exists"),
            );
            let (_, send) = api.expect(Method::GET, SECRET_PATH).await;
            respond(send, 200, &secret_json(&recreated, "14"));
            // The watch goes on from where it was.
            let _watch = expect_list(&mut api, true).await;
            api.expect_quiet(Duration::from_millis(100)).await;
        });
        timeout_after(Duration::from_secs(5), scenario).await;
        assert_eq!(ca_rx.borrow_and_update().cert_pem(), recreated_pem);
        assert_ne!(replaced_pem, recreated_pem);
        assert_eq!(metrics.changes(), 2, "replaced, then re-created");
        assert!(metrics.not_after() > 0);
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(1), follower)
            .await
            .expect("follower stops on shutdown")
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_forbidden_watch_keeps_the_ca_and_is_retried() {
        let first = CertAuthority::generate().unwrap();
        let later = CertAuthority::generate().unwrap();
        let later_pem = later.cert_pem().to_owned();
        let (client, mut api) = mock_client();
        let (ca_rx, metrics, shutdown, follower) = spawn_follower(client, first);
        let first_pem = ca_rx.borrow().cert_pem().to_owned();
        let in_use = ca_rx.clone();
        let scenario = tokio::spawn(async move {
            // Old RBAC: the list is forbidden, twice. The CA in use stays.
            for _ in 0..2 {
                let send = expect_list(&mut api, false).await;
                respond(
                    send,
                    403,
                    &status_failure(403, "Forbidden", "secrets is forbidden"),
                );
            }
            assert_eq!(in_use.borrow().cert_pem(), first_pem);
            // RBAC fixed: the next attempt lists a new CA, which is adopted.
            let send = expect_list(&mut api, false).await;
            respond(send, 200, &secret_list("20", secret_json(&later, "19")));
            let _watch = expect_list(&mut api, true).await;
            api.expect_quiet(Duration::from_millis(100)).await;
        });
        timeout_after(Duration::from_secs(600), scenario).await;
        assert_eq!(ca_rx.borrow().cert_pem(), later_pem);
        assert_eq!(metrics.changes(), 1);
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(1), follower)
            .await
            .expect("follower stops on shutdown")
            .unwrap();
    }
}
