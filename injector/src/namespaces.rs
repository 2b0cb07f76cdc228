//! Namespace facts for admission decisions, from a watch cache: the webhook never calls the
//! API server per request.
//!
//! [`NamespaceCache::spawn`] starts a [`Cache`] of all Namespaces (a `kube::runtime`
//! reflector with kube's default backoff, so API errors are retried, never fatal) and keeps
//! only names and labels in memory. [`NamespaceCache::disabled`] is the `--cluster-access off`
//! form: no API server, every lookup answers `None`, and it counts as synced.

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client,
    runtime::{reflector::ObjectRef, watcher},
};
use rdma_streams_common::kube::Cache;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Read side of the Namespace cache; cheap to clone.
#[derive(Clone)]
pub struct NamespaceCache {
    /// `None` without cluster access.
    inner: Option<Cache<Namespace>>,
}

impl NamespaceCache {
    /// Starts watching Namespaces through `client`. The returned task runs until `shutdown` is
    /// cancelled; the cache is synced once the first full list has been stored.
    pub fn spawn(client: Client, shutdown: CancellationToken) -> (Self, JoinHandle<()>) {
        let (cache, watch) =
            Cache::new(Api::all(client), watcher::Config::default(), slim, shutdown);
        (Self { inner: Some(cache) }, tokio::spawn(watch.run()))
    }

    /// The cache for `--cluster-access off`: knows no namespace, and is synced.
    pub fn disabled() -> Self {
        Self { inner: None }
    }

    /// Whether this cache watches the API server (false for [`NamespaceCache::disabled`]).
    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Labels of namespace `name` from the cache: `None` if the namespace is not (yet) known
    /// or the cache is disabled, `Some` (possibly empty) otherwise. Never calls the API.
    pub fn labels(&self, name: &str) -> Option<BTreeMap<String, String>> {
        let inner = self.inner.as_ref()?;
        let ns: Arc<Namespace> = inner.store().get(&ObjectRef::new(name))?;
        Some(ns.metadata.labels.clone().unwrap_or_default())
    }

    /// Whether the first full list of Namespaces has been stored (always true when disabled).
    pub fn is_synced(&self) -> bool {
        self.inner.as_ref().is_none_or(|i| i.synced().is_synced())
    }

    /// Waits until [`NamespaceCache::is_synced`]. Returns `true` once synced, or `false` if
    /// the cache task stopped (shutdown) before it ever synced.
    pub async fn wait_synced(&self) -> bool {
        match &self.inner {
            None => true,
            Some(inner) => inner.synced().wait().await,
        }
    }
}

impl std::fmt::Debug for NamespaceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespaceCache")
            .field("enabled", &self.is_enabled())
            .field("synced", &self.is_synced())
            .field("namespaces", &self.inner.as_ref().map(|i| i.store().len()))
            .finish()
    }
}

/// Keeps what decisions need: the name (already in the key) and the labels.
fn slim(ns: &mut Namespace) {
    ns.metadata.managed_fields = None;
    ns.metadata.annotations = None;
    ns.spec = None;
    ns.status = None;
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::Method;
    use serde_json::{Value, json};

    use super::*;
    use rdma_streams_testkit::mock_api::{
        ApiServerVerifier, Responder, mock_client, query, respond, send_bytes, status_failure,
        timeout_after_1s,
    };

    const NAMESPACES: &str = "/api/v1/namespaces";

    fn namespace(name: &str, rv: &str, labels: Value) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": name,
                "resourceVersion": rv,
                "labels": labels,
                "annotations": { "big": "x".repeat(64) },
                "managedFields": [{ "manager": "kubectl", "operation": "Apply" }],
            },
            "spec": { "finalizers": ["kubernetes"] },
            "status": { "phase": "Active" },
        })
    }

    fn list(rv: &str, items: Vec<Value>) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "NamespaceList",
            "metadata": { "resourceVersion": rv },
            "items": items,
        })
    }

    /// The API calls a test expects, in order.
    enum Scenario {
        /// LIST answered with two labelled namespaces, then a WATCH held open.
        ListThenHoldWatch,
        /// LIST answered 500, LIST again answered with the namespaces, WATCH answered with a
        /// MODIFIED and a DELETED event, then the re-WATCH held open.
        ListFailsThenWatchEvents,
    }

    /// Answers the calls of `scenario`, in order, in a spawned task; held watches are handed
    /// back through `held` so they stay open until the test ends.
    fn run(
        mut api: ApiServerVerifier,
        scenario: Scenario,
        held: tokio::sync::oneshot::Sender<Responder>,
    ) -> JoinHandle<()> {
        tokio::spawn(async move {
            match scenario {
                Scenario::ListThenHoldWatch => {
                    handle_list(&mut api).await;
                    let watch = expect_watch(&mut api, "100").await;
                    let _ = held.send(watch);
                }
                Scenario::ListFailsThenWatchEvents => {
                    let (_, send) = api.expect(Method::GET, NAMESPACES).await;
                    respond(
                        send,
                        500,
                        &status_failure(500, "InternalError", "etcd down"),
                    );
                    handle_list(&mut api).await;
                    let watch = expect_watch(&mut api, "100").await;
                    let modified = json!({
                        "type": "MODIFIED",
                        "object": namespace("team-a", "101", json!({ "pod-security.kubernetes.io/enforce": "restricted" })),
                    });
                    let deleted = json!({
                        "type": "DELETED",
                        "object": namespace("team-b", "102", json!({})),
                    });
                    let body = format!("{modified}\n{deleted}\n").into_bytes();
                    send_bytes(watch, 200, body);
                    let watch = expect_watch(&mut api, "102").await;
                    let _ = held.send(watch);
                }
            }
        })
    }

    async fn handle_list(api: &mut ApiServerVerifier) {
        let (request, send) = api.expect(Method::GET, NAMESPACES).await;
        let q = query(&request);
        assert!(!q.contains("watch=true"), "initial call is a LIST: {q}");
        respond(
            send,
            200,
            &list(
                "100",
                vec![
                    namespace(
                        "team-a",
                        "10",
                        json!({ "pod-security.kubernetes.io/enforce": "baseline", "rdma-streams.io/inject": "enabled" }),
                    ),
                    namespace(
                        "team-b",
                        "11",
                        json!({ "kubernetes.io/metadata.name": "team-b" }),
                    ),
                ],
            ),
        );
    }

    async fn expect_watch(api: &mut ApiServerVerifier, rv: &str) -> Responder {
        let (request, send) = api.expect(Method::GET, NAMESPACES).await;
        let q = query(&request);
        assert!(q.contains("watch=true"), "{q}");
        assert!(q.contains(&format!("resourceVersion={rv}")), "{q}");
        send
    }

    async fn synced_within_1s(cache: &NamespaceCache) {
        assert!(
            tokio::time::timeout(Duration::from_secs(1), cache.wait_synced())
                .await
                .expect("synced within 1s")
        );
    }

    #[tokio::test]
    async fn labels_come_from_the_initial_list() {
        let (client, verifier) = mock_client();
        let (held_tx, held_rx) = tokio::sync::oneshot::channel();
        let scenario = run(verifier, Scenario::ListThenHoldWatch, held_tx);
        let shutdown = CancellationToken::new();
        let (cache, task) = NamespaceCache::spawn(client, shutdown.clone());
        synced_within_1s(&cache).await;
        timeout_after_1s(scenario).await;

        assert!(cache.is_synced());
        let a = cache.labels("team-a").expect("team-a cached");
        assert_eq!(a["pod-security.kubernetes.io/enforce"], "baseline");
        assert_eq!(a["rdma-streams.io/inject"], "enabled");
        assert_eq!(
            cache.labels("team-b").unwrap()["kubernetes.io/metadata.name"],
            "team-b"
        );
        assert_eq!(cache.labels("missing"), None);
        // Only what decisions need is kept.
        let stored = cache
            .inner
            .as_ref()
            .unwrap()
            .store()
            .get(&ObjectRef::new("team-a"))
            .unwrap();
        assert!(stored.metadata.annotations.is_none() && stored.metadata.managed_fields.is_none());
        assert!(stored.spec.is_none() && stored.status.is_none());

        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .expect("cache task stops on shutdown")
            .unwrap();
        drop(held_rx);
    }

    #[tokio::test(start_paused = true)]
    async fn list_errors_are_retried_and_watch_events_update_the_cache() {
        let (client, verifier) = mock_client();
        let (held_tx, held_rx) = tokio::sync::oneshot::channel();
        let scenario = run(verifier, Scenario::ListFailsThenWatchEvents, held_tx);
        let shutdown = CancellationToken::new();
        let (cache, task) = NamespaceCache::spawn(client, shutdown.clone());
        assert!(!cache.is_synced());
        // Paused clock: the backoff after the failed LIST elapses instantly.
        assert!(
            tokio::time::timeout(Duration::from_secs(60), cache.wait_synced())
                .await
                .unwrap()
        );
        let _watch = tokio::time::timeout(Duration::from_secs(60), held_rx)
            .await
            .expect("re-watch after the events")
            .unwrap();
        timeout_after_1s(scenario).await;

        assert_eq!(
            cache.labels("team-a").unwrap()["pod-security.kubernetes.io/enforce"],
            "restricted"
        );
        assert_eq!(cache.labels("team-b"), None, "deleted namespace forgotten");
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn disabled_cache_is_synced_and_knows_nothing() {
        let cache = NamespaceCache::disabled();
        assert!(!cache.is_enabled());
        assert!(cache.is_synced());
        assert!(cache.wait_synced().await);
        assert_eq!(cache.labels("default"), None);
        assert!(format!("{cache:?}").contains("enabled: false"));
    }

    #[tokio::test]
    async fn shutdown_before_sync_ends_wait_synced() {
        let (client, verifier) = mock_client();
        let shutdown = CancellationToken::new();
        let (cache, task) = NamespaceCache::spawn(client, shutdown.clone());
        shutdown.cancel();
        task.await.unwrap();
        assert!(!cache.wait_synced().await);
        assert!(!cache.is_synced());
        drop(verifier);
    }
}
