//! Keeping the caBundle of our own MutatingWebhookConfiguration equal to the CA PEM.
//!
//! Which webhooks: **all webhooks of the named MWC**. The MWC is ours (the chart renders it
//! under a name we are given and without caBundle), and every webhook in it is served by this
//! binary, whether its clientConfig names our Service or a URL (hostNetwork installs); matching
//! on `clientConfig.service` would miss the URL form and protect nothing, since no foreign
//! webhook lives in our MWC.
//!
//! How: a **strategic merge patch** that names only the drifted webhooks (the `webhooks` list
//! of an MWC merges by `name`) and sets only their `clientConfig.caBundle`, carrying the
//! `metadata.resourceVersion` we read. Other webhooks and every other field are left as they
//! are, and if the object changed since we read it the API server answers 409 Conflict instead
//! of applying the patch; we then read it again. (A JSON merge patch of the whole `webhooks`
//! list would replace the list and clobber concurrent edits of rules or selectors; a JSON
//! patch needs kube's `jsonpatch` feature and index-based paths.)

use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::{ByteString, api::admissionregistration::v1::MutatingWebhookConfiguration};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
    runtime::{
        utils::Backoff,
        watcher::{self, DefaultBackoff, Event},
    },
};
use rdma_streams_common::{kube::Watch, report::Report};
use serde_json::{Value, json};
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{CertError, bootstrap::FIELD_MANAGER, rotation::BundleTarget};

/// Longest pause between two attempts to repair a drifted caBundle.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);

/// What [`ensure_ca_bundle`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaBundleChange {
    /// Every webhook already carried the CA (or the MWC has no webhooks).
    Unchanged,
    /// These webhooks were patched.
    Patched {
        /// Names of the patched webhooks.
        webhooks: Vec<String>,
    },
}

/// The webhooks of `mwc` whose caBundle is not what `target` wants at `now`, each with the
/// bundle it should get (see [`BundleTarget::wanted`]).
pub fn stale_webhooks(
    mwc: &MutatingWebhookConfiguration,
    target: &BundleTarget,
    now: SystemTime,
) -> Vec<(String, String)> {
    mwc.webhooks
        .iter()
        .flatten()
        .filter_map(|w| {
            let current = w.client_config.ca_bundle.as_ref().map(|b| b.0.as_slice());
            target
                .wanted(current, now)
                .map(|bundle| (w.name.clone(), bundle))
        })
        .collect()
}

/// The strategic merge patch that gives every stale webhook of `mwc` the bundle `target`
/// wants, conditional on `mwc`'s resourceVersion; `None` if nothing is stale. (The controller
/// computes the stale list once and patches with [`patch_for`]; tests ask for the patch whole.)
#[cfg(test)]
pub fn ca_bundle_patch(
    mwc: &MutatingWebhookConfiguration,
    target: &BundleTarget,
    now: SystemTime,
) -> Option<Value> {
    patch_for(mwc, &stale_webhooks(mwc, target, now))
}

/// The patch that gives each of `stale` (name, bundle) its bundle; `None` for none.
fn patch_for(mwc: &MutatingWebhookConfiguration, stale: &[(String, String)]) -> Option<Value> {
    if stale.is_empty() {
        return None;
    }
    let webhooks: Vec<Value> = stale
        .iter()
        .map(|(name, bundle)| {
            let bundle = ByteString(bundle.as_bytes().to_vec());
            json!({ "name": name, "clientConfig": { "caBundle": bundle } })
        })
        .collect();
    let mut patch = json!({ "webhooks": webhooks });
    if let Some(rv) = &mwc.metadata.resource_version {
        patch["metadata"] = json!({ "resourceVersion": rv });
    }
    Some(patch)
}

/// GETs the MWC `mwc_name` and, if any of its webhooks' caBundle is not what `target` wants,
/// patches those webhooks (see the module docs for why a strategic merge patch).
pub async fn ensure_ca_bundle(
    client: &Client,
    mwc_name: &str,
    target: &BundleTarget,
) -> Result<CaBundleChange, CertError> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let mwc = api
        .get_opt(mwc_name)
        .await
        .map_err(|e| CertError::kube(format!("get MutatingWebhookConfiguration {mwc_name}"), e))?
        .ok_or_else(|| CertError::WebhookConfigNotFound {
            name: mwc_name.to_owned(),
        })?;
    patch_if_stale(&api, mwc_name, &mwc, target).await
}

async fn patch_if_stale(
    api: &Api<MutatingWebhookConfiguration>,
    mwc_name: &str,
    mwc: &MutatingWebhookConfiguration,
    target: &BundleTarget,
) -> Result<CaBundleChange, CertError> {
    let stale = stale_webhooks(mwc, target, SystemTime::now());
    let Some(patch) = patch_for(mwc, &stale) else {
        return Ok(CaBundleChange::Unchanged);
    };
    let webhooks: Vec<String> = stale.into_iter().map(|(name, _)| name).collect();
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    api.patch(mwc_name, &params, &Patch::Strategic(patch))
        .await
        .map_err(|e| {
            CertError::kube(
                format!("patch caBundle of MutatingWebhookConfiguration {mwc_name}"),
                e,
            )
        })?;
    info!(mwc = mwc_name, ?webhooks, "caBundle patched");
    Ok(CaBundleChange::Patched { webhooks })
}

/// Watches the MWC `mwc_name` (a watcher with field selector `metadata.name=<mwc_name>`) and
/// re-patches its caBundle whenever it is not what the current `target` wants (created without
/// one, overwritten by a re-apply or GitOps sync, a new CA from [`super::follow`], the end of a
/// new CA's overlap), until `shutdown` is cancelled. Never returns on API errors: the [`Watch`]
/// retries its errors with kube's default backoff, failed patches are retried (GET + patch)
/// with backoff until they succeed or the watch shows no drift. A missing MWC is waited for.
/// Whenever the bundle holds the target's CA (patched, or right already), that CA's PEM is
/// published on `bundled`.
pub async fn run_ca_bundle_controller(
    client: Client,
    mwc_name: String,
    mut target: watch::Receiver<BundleTarget>,
    bundled: watch::Sender<Option<String>>,
    shutdown: CancellationToken,
) {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let config = watcher::Config::default().fields(&format!("metadata.name={mwc_name}"));
    let mut events = Watch::new(api.clone(), config, shutdown.clone());
    let mut backoff = DefaultBackoff::default();
    let mut retry_at: Option<Instant> = None;
    let mut current = target.borrow_and_update().clone();
    let mut overlap_end = overlap_deadline(&current);
    let mut target_open = true;

    loop {
        let retry = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let overlap_over = async {
            match overlap_end {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let changed = async {
            if target_open {
                target.changed().await
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            biased;
            () = shutdown.cancelled() => {
                debug!(mwc = %mwc_name, "caBundle controller stopped");
                return;
            }
            result = changed => {
                if result.is_err() {
                    // Nobody changes the CA any more: keep the last one.
                    target_open = false;
                    continue;
                }
                current = target.borrow_and_update().clone();
                overlap_end = overlap_deadline(&current);
                info!(mwc = %mwc_name, overlap = overlap_end.is_some(), "new CA: updating the caBundle");
                backoff.reset();
                retry_at = Some(Instant::now());
            }
            () = overlap_over => {
                debug!(mwc = %mwc_name, "the CA's overlap is over: the caBundle becomes the CA alone");
                overlap_end = None;
                retry_at = Some(Instant::now());
            }
            () = retry => {
                let Some(result) = until_shutdown(&shutdown, ensure_ca_bundle(&client, &mwc_name, &current)).await else {
                    return;
                };
                retry_at = match result {
                    Ok(_) => {
                        backoff.reset();
                        bundled.send_replace(Some(current.ca_pem.clone()));
                        None
                    }
                    Err(CertError::WebhookConfigNotFound { .. }) => {
                        // Nothing to repair; the watch tells us when it appears.
                        backoff.reset();
                        None
                    }
                    Err(error) => {
                        let delay = next_delay(&mut backoff);
                        warn!(error = %Report(&error), mwc = %mwc_name, ?delay, "caBundle repair failed; retrying");
                        Some(Instant::now() + delay)
                    }
                };
            }
            event = events.next() => match event {
                Some(Event::Apply(mwc) | Event::InitApply(mwc)) => {
                    let Some(result) = until_shutdown(&shutdown, patch_if_stale(&api, &mwc_name, &mwc, &current)).await else {
                        return;
                    };
                    retry_at = match result {
                        Ok(_) => {
                            backoff.reset();
                            bundled.send_replace(Some(current.ca_pem.clone()));
                            None
                        }
                        Err(error) => {
                            let delay = next_delay(&mut backoff);
                            warn!(error = %Report(&error), mwc = %mwc_name, ?delay, "caBundle patch failed; retrying");
                            Some(Instant::now() + delay)
                        }
                    };
                }
                Some(Event::Delete(_)) => {
                    info!(mwc = %mwc_name, "MutatingWebhookConfiguration deleted; waiting for it to return");
                    retry_at = None;
                }
                Some(Event::Init | Event::InitDone) => {}
                // Shutdown.
                None => return,
            },
        }
    }
}

/// When `target`'s overlap ends (a moment after, so the check sees it over), if still ahead.
fn overlap_deadline(target: &BundleTarget) -> Option<Instant> {
    let left = target
        .overlap_until?
        .duration_since(SystemTime::now())
        .ok()?;
    Some(Instant::now() + left + Duration::from_secs(1))
}

/// Runs `call` unless `shutdown` is cancelled first (an API call may hang for minutes).
async fn until_shutdown<T>(
    shutdown: &CancellationToken,
    call: impl Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        biased;
        () = shutdown.cancelled() => None,
        result = call => Some(result),
    }
}

fn next_delay(backoff: &mut DefaultBackoff) -> Duration {
    backoff
        .next()
        .unwrap_or(MAX_RETRY_DELAY)
        .min(MAX_RETRY_DELAY)
}

#[cfg(test)]
mod tests {
    use http::Method;

    use super::*;
    use rdma_streams_testkit::mock_api::{
        ApiServerVerifier, body_json, mock_client, query, respond, status_failure, timeout_after,
        timeout_after_1s,
    };

    const MWC: &str = "rdma-stream-injector";
    const MWCS_PATH: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations";
    const MWC_PATH: &str =
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/rdma-stream-injector";
    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBnew\n-----END CERTIFICATE-----\n";
    const OLD_CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBold\n-----END CERTIFICATE-----\n";

    fn b64(pem: &str) -> Value {
        serde_json::to_value(ByteString(pem.as_bytes().to_vec())).unwrap()
    }

    /// An MWC with webhooks `(name, caBundle)`, an unknown field on each webhook and one
    /// at the top, as a newer API server might send.
    fn mwc(rv: &str, webhooks: &[(&str, Option<&str>)]) -> Value {
        let webhooks: Vec<Value> = webhooks
            .iter()
            .map(|(name, bundle)| {
                let mut client_config = json!({ "service": { "name": "rdma-stream-injector", "namespace": "rdma-streams", "path": "/mutate" } });
                if let Some(pem) = bundle {
                    client_config["caBundle"] = b64(pem);
                }
                json!({
                    "name": name,
                    "clientConfig": client_config,
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "futureField": true,
                })
            })
            .collect();
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": { "name": MWC, "resourceVersion": rv },
            "webhooks": webhooks,
        })
    }

    /// A LIST answer holding `item`.
    fn mwc_list(item: Value) -> Value {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfigurationList",
            "metadata": { "resourceVersion": "10" },
            "items": [item],
        })
    }

    /// The API calls a test expects, in order.
    enum Scenario {
        /// GET answered with `current`, then the strategic merge patch for `expect_patched`
        /// at resourceVersion `rv`, answered 200.
        GetThenPatch {
            current: Value,
            rv: &'static str,
            expect_patched: Vec<&'static str>,
        },
        /// GET answered with `current`; no patch may follow.
        GetOnly { current: Value },
        /// GET answered with `code`.
        GetFails { code: u16 },
        /// Controller: initial LIST answered with `current` (stale), PATCH answered with
        /// `patch_code`, then the WATCH, held open until the test ends; if the PATCH failed,
        /// a GET + PATCH retry answered 200.
        ControllerRepairs { current: Value, patch_code: u16 },
    }

    /// Answers the calls of `scenario`, in order, in a spawned task.
    fn run(mut api: ApiServerVerifier, scenario: Scenario) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            match scenario {
                Scenario::GetThenPatch {
                    current,
                    rv,
                    expect_patched,
                } => {
                    let (_, send) = api.expect(Method::GET, MWC_PATH).await;
                    respond(send, 200, &current);
                    handle_patch(&mut api, rv, &expect_patched, 200).await;
                }
                Scenario::GetOnly { current } => {
                    let (_, send) = api.expect(Method::GET, MWC_PATH).await;
                    respond(send, 200, &current);
                    api.expect_quiet(Duration::from_millis(100)).await;
                }
                Scenario::GetFails { code } => {
                    let (_, send) = api.expect(Method::GET, MWC_PATH).await;
                    let reason = if code == 404 {
                        "NotFound"
                    } else {
                        "InternalError"
                    };
                    respond(send, code, &status_failure(code, reason, "boom"));
                }
                Scenario::ControllerRepairs {
                    current,
                    patch_code,
                } => {
                    let (request, send) = api.expect(Method::GET, MWCS_PATH).await;
                    let q = query(&request);
                    assert!(
                        q.contains("fieldSelector=metadata.name%3Drdma-stream-injector"),
                        "{q}"
                    );
                    assert!(!q.contains("watch=true"), "{q}");
                    respond(send, 200, &mwc_list(current));
                    handle_patch(&mut api, "7", &["inject.rdma-streams.io"], patch_code).await;
                    let (request, watch) = api.expect(Method::GET, MWCS_PATH).await;
                    let q = query(&request);
                    assert!(q.contains("watch=true"), "{q}");
                    assert!(
                        q.contains("fieldSelector=metadata.name%3Drdma-stream-injector"),
                        "{q}"
                    );
                    if patch_code != 200 {
                        // The failed patch is retried with a fresh read.
                        let (_, send) = api.expect(Method::GET, MWC_PATH).await;
                        respond(
                            send,
                            200,
                            &mwc("11", &[("inject.rdma-streams.io", Some(OLD_CA))]),
                        );
                        handle_patch(&mut api, "11", &["inject.rdma-streams.io"], 200).await;
                    }
                    // The watch stays open and the controller stays quiet.
                    api.expect_quiet(Duration::from_millis(100)).await;
                    drop(watch);
                }
            }
        })
    }

    /// Expects the caBundle patch for `names` at `rv` and answers with `code`.
    async fn handle_patch(api: &mut ApiServerVerifier, rv: &str, names: &[&str], code: u16) {
        let (request, send) = api.expect(Method::PATCH, MWC_PATH).await;
        assert_eq!(
            request.headers()["content-type"],
            "application/strategic-merge-patch+json"
        );
        assert!(query(&request).contains("fieldManager=rdma-stream-injector"));
        let body = body_json(request).await;
        let webhooks: Vec<Value> = names
            .iter()
            .map(|n| json!({ "name": n, "clientConfig": { "caBundle": b64(CA) } }))
            .collect();
        assert_eq!(
            body,
            json!({ "metadata": { "resourceVersion": rv }, "webhooks": webhooks })
        );
        if code == 200 {
            let all: Vec<(&str, Option<&str>)> = names.iter().map(|n| (*n, Some(CA))).collect();
            respond(send, 200, &mwc("99", &all));
        } else {
            respond(
                send,
                code,
                &status_failure(code, "InternalError", "etcd down"),
            );
        }
    }

    #[test]
    fn only_drifted_webhooks_are_stale() {
        let m: MutatingWebhookConfiguration = serde_json::from_value(mwc(
            "1",
            &[("a", Some(CA)), ("b", Some(OLD_CA)), ("c", None)],
        ))
        .unwrap();
        let now = SystemTime::now();
        let stale: Vec<String> = stale_webhooks(&m, &BundleTarget::exact(CA), now)
            .into_iter()
            .map(|(name, bundle)| {
                assert_eq!(bundle, CA);
                name
            })
            .collect();
        assert_eq!(stale, ["b", "c"]);
        let none: MutatingWebhookConfiguration =
            serde_json::from_value(json!({ "metadata": { "name": "x" } })).unwrap();
        assert_eq!(ca_bundle_patch(&none, &BundleTarget::exact(CA), now), None);
    }

    #[tokio::test]
    async fn drift_is_patched_with_the_right_pem_and_nothing_else() {
        let (client, verifier) = mock_client();
        let scenario = run(
            verifier,
            Scenario::GetThenPatch {
                current: mwc(
                    "42",
                    &[
                        ("ok.rdma-streams.io", Some(CA)),
                        ("inject.rdma-streams.io", Some(OLD_CA)),
                        ("new.rdma-streams.io", None),
                    ],
                ),
                rv: "42",
                expect_patched: vec!["inject.rdma-streams.io", "new.rdma-streams.io"],
            },
        );
        let change = ensure_ca_bundle(&client, MWC, &BundleTarget::exact(CA))
            .await
            .unwrap();
        timeout_after_1s(scenario).await;
        assert_eq!(
            change,
            CaBundleChange::Patched {
                webhooks: vec![
                    "inject.rdma-streams.io".into(),
                    "new.rdma-streams.io".into()
                ]
            }
        );
    }

    #[tokio::test]
    async fn right_bundle_sends_no_patch() {
        let (client, verifier) = mock_client();
        let scenario = run(
            verifier,
            Scenario::GetOnly {
                current: mwc("5", &[("inject.rdma-streams.io", Some(CA))]),
            },
        );
        let change = ensure_ca_bundle(&client, MWC, &BundleTarget::exact(CA))
            .await
            .unwrap();
        assert_eq!(change, CaBundleChange::Unchanged);
        timeout_after_1s(scenario).await;
    }

    #[tokio::test]
    async fn api_error_is_returned_not_panicked() {
        let (client, verifier) = mock_client();
        let scenario = run(verifier, Scenario::GetFails { code: 500 });
        let err = ensure_ca_bundle(&client, MWC, &BundleTarget::exact(CA))
            .await
            .unwrap_err();
        timeout_after_1s(scenario).await;
        assert!(matches!(err, CertError::Kube { .. }), "{err}");
        assert!(err.is_transient());
    }

    #[tokio::test]
    async fn missing_configuration_is_its_own_error() {
        let (client, verifier) = mock_client();
        let scenario = run(verifier, Scenario::GetFails { code: 404 });
        let err = ensure_ca_bundle(&client, MWC, &BundleTarget::exact(CA))
            .await
            .unwrap_err();
        timeout_after_1s(scenario).await;
        assert!(
            matches!(err, CertError::WebhookConfigNotFound { .. }),
            "{err}"
        );
    }

    async fn controller_case(patch_code: u16, limit: Duration) {
        let (client, verifier) = mock_client();
        let scenario = run(
            verifier,
            Scenario::ControllerRepairs {
                current: mwc("7", &[("inject.rdma-streams.io", Some(OLD_CA))]),
                patch_code,
            },
        );
        let shutdown = CancellationToken::new();
        let controller = tokio::spawn(run_ca_bundle_controller(
            client,
            MWC.to_owned(),
            watch::channel(BundleTarget::exact(CA)).1,
            watch::channel(None).0,
            shutdown.clone(),
        ));
        timeout_after(limit, scenario).await;
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(1), controller)
            .await
            .expect("controller stops on shutdown")
            .unwrap();
    }

    #[tokio::test]
    async fn controller_repatches_drift_seen_by_the_watch() {
        controller_case(200, Duration::from_secs(1)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn controller_retries_a_failed_patch_and_keeps_running() {
        // Paused clock: the retry backoff elapses instantly.
        controller_case(500, Duration::from_secs(120)).await;
    }

    #[tokio::test]
    async fn controller_survives_a_dead_api_server_until_shutdown() {
        let (client, verifier) = mock_client();
        // Every call fails at the transport level.
        drop(verifier);
        let shutdown = CancellationToken::new();
        let controller = tokio::spawn(run_ca_bundle_controller(
            client,
            MWC.to_owned(),
            watch::channel(BundleTarget::exact(CA)).1,
            watch::channel(None).0,
            shutdown.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!controller.is_finished());
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(1), controller)
            .await
            .expect("controller stops on shutdown")
            .unwrap();
    }

    #[test]
    fn patch_body_is_keyed_by_name_and_conditional_on_the_resource_version() {
        let m: MutatingWebhookConfiguration =
            serde_json::from_value(mwc("3", &[("w", None)])).unwrap();
        assert_eq!(
            ca_bundle_patch(&m, &BundleTarget::exact(CA), SystemTime::now()).unwrap(),
            json!({ "metadata": { "resourceVersion": "3" }, "webhooks": [ { "name": "w", "clientConfig": { "caBundle": b64(CA) } } ] })
        );
    }

    /// Expects a GET of the MWC, answered with one webhook carrying `bundle` at `rv`.
    async fn expect_get(api: &mut ApiServerVerifier, rv: &str, bundle: &str) {
        let (_, send) = api.expect(Method::GET, MWC_PATH).await;
        respond(
            send,
            200,
            &mwc(rv, &[("inject.rdma-streams.io", Some(bundle))]),
        );
    }

    /// Expects the patch giving the webhook `bundle` at `rv`, answered 200.
    async fn expect_bundle_patch(api: &mut ApiServerVerifier, rv: &str, bundle: &str) {
        let (request, send) = api.expect(Method::PATCH, MWC_PATH).await;
        let body = body_json(request).await;
        assert_eq!(
            body,
            json!({
                "metadata": { "resourceVersion": rv },
                "webhooks": [{ "name": "inject.rdma-streams.io", "clientConfig": { "caBundle": b64(bundle) } }],
            })
        );
        respond(
            send,
            200,
            &mwc("99", &[("inject.rdma-streams.io", Some(bundle))]),
        );
    }

    #[tokio::test]
    async fn a_new_ca_joins_the_bundle_and_replaces_it_when_its_overlap_is_over() {
        const NEWER: &str = "-----BEGIN CERTIFICATE-----\nMIIBnewer\n-----END CERTIFICATE-----\n";
        let (client, mut api) = mock_client();
        let (target_tx, target_rx) = watch::channel(BundleTarget::exact(CA));
        let (bundled_tx, bundled) = watch::channel(None);
        let shutdown = CancellationToken::new();
        let controller = tokio::spawn(run_ca_bundle_controller(
            client,
            MWC.to_owned(),
            target_rx,
            bundled_tx,
            shutdown.clone(),
        ));
        let held = bundled.clone();
        let scenario = async move {
            // Start: the bundle is the CA already; the watch opens and nothing is patched.
            let (_, send) = api.expect(Method::GET, MWCS_PATH).await;
            respond(
                send,
                200,
                &mwc_list(mwc("7", &[("inject.rdma-streams.io", Some(CA))])),
            );
            let (_, watch) = api.expect(Method::GET, MWCS_PATH).await;
            api.expect_quiet(Duration::from_millis(50)).await;
            assert_eq!(
                held.borrow().as_deref(),
                Some(CA),
                "the bundle holds the CA"
            );
            // A new CA, young: it joins the bundle, in front of the one there.
            let overlap = Duration::from_millis(600);
            target_tx.send_replace(BundleTarget {
                ca_pem: NEWER.into(),
                overlap_until: Some(SystemTime::now() + overlap),
            });
            let joined = format!("{NEWER}{CA}");
            expect_get(&mut api, "8", CA).await;
            expect_bundle_patch(&mut api, "8", &joined).await;
            api.expect_quiet(Duration::from_millis(50)).await;
            assert_eq!(
                held.borrow().as_deref(),
                Some(NEWER),
                "the bundle holds the new CA"
            );
            // Its overlap over: the bundle becomes the new CA alone, with no other trigger.
            let started = std::time::Instant::now();
            expect_get(&mut api, "9", &joined).await;
            assert!(
                started.elapsed() >= overlap / 2,
                "pruned before the overlap ended"
            );
            expect_bundle_patch(&mut api, "9", NEWER).await;
            api.expect_quiet(Duration::from_millis(100)).await;
            drop(watch);
        };
        timeout_after(Duration::from_secs(5), tokio::spawn(scenario)).await;
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(1), controller)
            .await
            .expect("controller stops on shutdown")
            .unwrap();
    }
}
