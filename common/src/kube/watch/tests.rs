use std::{
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use futures::StreamExt;
use http::Method;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Client, runtime::reflector::ObjectRef};
use serde_json::{Value, json};
use tokio::{task::JoinHandle, time::Instant};

use super::*;
use rdma_streams_testkit::mock_api::{
    self, ApiServerVerifier, Responder, mock_client, query, respond, send_bytes, status_failure,
    watch_events,
};

const NS: &str = "team-a";
const CONFIG_MAPS: &str = "/api/v1/namespaces/team-a/configmaps";

fn config_map(name: &str, rv: &str, data: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": NS,
            "resourceVersion": rv,
            "labels": { "app": "x" },
            "managedFields": [{ "manager": "kubectl", "operation": "Apply" }],
        },
        "data": data,
    })
}

fn list(rv: &str, items: Vec<Value>) -> Value {
    mock_api::list("v1", "ConfigMapList", rv, items)
}

fn gone_410() -> (&'static str, Value) {
    (
        "ERROR",
        status_failure(410, "Expired", "too old resource version: 1 (200)"),
    )
}

fn api(client: Client) -> Api<ConfigMap> {
    Api::namespaced(client, NS)
}

fn config() -> watcher::Config {
    watcher::Config::default().labels("app=x")
}

/// Answers the next LIST with `items` at `rv`; returns the WATCH from `rv` that follows it.
async fn listed(api: &mut ApiServerVerifier, rv: &str, items: Vec<Value>) -> Responder {
    let send = expect(api, false, None).await;
    respond(send, 200, &list(rv, items));
    expect(api, true, Some(rv)).await
}

/// Expects a LIST (`watch == false`) or a WATCH from resource version `rv`, with the
/// selector of [`config`].
async fn expect(api: &mut ApiServerVerifier, watch: bool, rv: Option<&str>) -> Responder {
    let (request, send) = api.expect(Method::GET, CONFIG_MAPS).await;
    let q = query(&request);
    assert_eq!(q.contains("watch=true"), watch, "{q}");
    assert!(q.contains("labelSelector=app%3Dx"), "{q}");
    if let Some(rv) = rv {
        assert!(q.contains(&format!("resourceVersion={rv}")), "{q}");
    }
    send
}

/// The next event, within `limit`.
async fn next_within(watch: &mut Watch<ConfigMap>, limit: Duration) -> Event<ConfigMap> {
    tokio::time::timeout(limit, watch.next())
        .await
        .expect("an event in time")
        .expect("the watch goes on")
}

/// Names the event: `Init`, `InitApply a`, `Apply a`, `Delete a`, `InitDone`.
fn name(event: &Event<ConfigMap>) -> String {
    let of = |cm: &ConfigMap| cm.metadata.name.clone().unwrap_or_default();
    match event {
        Event::Init => "Init".into(),
        Event::InitApply(cm) => format!("InitApply {}", of(cm)),
        Event::Apply(cm) => format!("Apply {}", of(cm)),
        Event::Delete(cm) => format!("Delete {}", of(cm)),
        Event::InitDone => "InitDone".into(),
    }
}

/// Every log line of this test binary at DEBUG and up, without colours, each with the name
/// of its thread (a test's name).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

/// The log lines, collected from the first call on. Every test here calls it first: tracing
/// caches, per call site, whether any subscriber listens, so a line first logged before the
/// subscriber exists (by a test running alongside) could stay unseen.
fn logs() -> &'static Logs {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_thread_names(true)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        logs
    })
}

impl Logs {
    /// The lines of the calling test that come from a watch and contain `text`.
    fn lines_with(&self, text: &str) -> Vec<String> {
        let test = std::thread::current().name().unwrap().to_owned();
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .filter(|l| l.contains(&test) && l.contains("watch{") && l.contains(text))
            .map(str::to_owned)
            .collect()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_watch_yields_the_events_syncs_at_the_first_list_and_ends_at_shutdown() {
    logs();
    let (client, mut api) = mock_client();
    let shutdown = CancellationToken::new();
    let mut watch = Watch::new(self::api(client), config(), shutdown.clone());
    let synced = watch.synced();
    assert!(!synced.is_synced());
    let scenario: JoinHandle<Responder> = tokio::spawn(async move {
        let send = listed(
            &mut api,
            "10",
            vec![
                config_map("a", "1", json!({})),
                config_map("b", "2", json!({})),
            ],
        )
        .await;
        send_bytes(
            send,
            200,
            watch_events(&[("MODIFIED", config_map("a", "11", json!({ "k": "v" })))]),
        );
        // The WATCH again, from the last event's version, held open.
        expect(&mut api, true, Some("11")).await
    });

    let limit = Duration::from_secs(1);
    let mut seen = Vec::new();
    for _ in 0..4 {
        let event = next_within(&mut watch, limit).await;
        assert_eq!(
            synced.is_synced(),
            matches!(event, Event::InitDone),
            "synced from the first InitDone on"
        );
        seen.push(name(&event));
    }
    assert_eq!(seen, ["Init", "InitApply a", "InitApply b", "InitDone"]);
    assert!(synced.wait().await);
    match next_within(&mut watch, limit).await {
        Event::Apply(cm) => assert_eq!(cm.data.unwrap()["k"], "v"),
        event => panic!("{}", name(&event)),
    }
    // Polled on, the watch opens the WATCH again, which stays silent.
    let _held = tokio::time::timeout(limit, async {
        tokio::select! {
            event = watch.next() => panic!("no more events: {:?}", event.as_ref().map(name)),
            held = scenario => held.unwrap(),
        }
    })
    .await
    .expect("the WATCH again");

    // The WATCH is open and silent: shutdown ends the stream anyway.
    shutdown.cancel();
    let end = tokio::time::timeout(limit, watch.next()).await;
    assert!(matches!(end, Ok(None)), "ended at shutdown");
    assert!(watch.next().await.is_none(), "and stays ended");
    assert!(synced.is_synced() && synced.wait().await);
}

#[tokio::test(start_paused = true)]
async fn errors_are_retried_with_backoff_and_logged_with_their_cause_a_403_once() {
    let logs = logs();
    let (client, mut api) = mock_client();
    let shutdown = CancellationToken::new();
    let mut watch = Watch::new(self::api(client), config(), shutdown.clone());
    let scenario = tokio::spawn(async move {
        let send = expect(&mut api, false, None).await;
        let mut failed_lists = vec![Instant::now()];
        respond(
            send,
            500,
            &status_failure(500, "InternalError", "etcd down"),
        );
        for _ in 0..3 {
            let send = expect(&mut api, false, None).await;
            failed_lists.push(Instant::now());
            respond(
                send,
                403,
                &status_failure(403, "Forbidden", "configmaps is forbidden"),
            );
        }
        // The backoff grew: 0.8 s doubling, each delay up to twice that (jitter).
        let gaps: Vec<Duration> = failed_lists.windows(2).map(|w| w[1] - w[0]).collect();
        for (n, gap) in gaps.iter().enumerate() {
            let least = Duration::from_millis(800) * 2u32.pow(n as u32);
            assert!(*gap >= least && *gap <= least * 2, "{gaps:?}");
        }
        let send = listed(&mut api, "10", vec![config_map("a", "1", json!({}))]).await;
        // Forbidden again, once the watch has worked: warned again.
        let forbidden = status_failure(403, "Forbidden", "configmaps is forbidden");
        send_bytes(send, 200, watch_events(&[("ERROR", forbidden)]));
        let send = expect(&mut api, true, Some("10")).await;
        send_bytes(send, 200, watch_events(&[gone_410()]));
        // 410 Gone: a relist, then the WATCH held.
        listed(&mut api, "20", vec![config_map("a", "1", json!({}))]).await
    });

    // Paused clock: each backoff elapses as soon as nothing else can run.
    let limit = Duration::from_secs(600);
    let mut seen = Vec::new();
    for _ in 0..6 {
        seen.push(name(&next_within(&mut watch, limit).await));
    }
    #[rustfmt::skip]
    assert_eq!(
        seen,
        [
            "Init", "InitApply a", "InitDone",
            "Init", "InitApply a", "InitDone", // after the 410
        ],
        "errors are not events; a failed LIST began no list; the 410 relists"
    );
    let _held = tokio::time::timeout(limit, async {
        tokio::select! {
            event = watch.next() => panic!("no more events: {:?}", event.as_ref().map(name)),
            held = scenario => held.unwrap(),
        }
    })
    .await
    .expect("the WATCH after the relist");

    let failed = logs.lines_with("watch failed; retrying with backoff");
    assert_eq!(failed.len(), 2, "the 500 and the 410: {failed:#?}");
    assert!(failed[0].contains(" WARN "), "{}", failed[0]);
    assert!(
        failed[0].contains("watch{kind=ConfigMap namespace=\"team-a\" labels=\"app=x\"}"),
        "the span names the watch: {}",
        failed[0]
    );
    assert!(
        failed[0].contains("failed to perform initial object list")
            && failed[0].contains("etcd down"),
        "the error and its cause: {}",
        failed[0]
    );
    assert!(
        failed[1].contains("too old resource version"),
        "{}",
        failed[1]
    );
    let forbidden = logs.lines_with("not allowed to list or watch (RBAC)");
    assert_eq!(
        forbidden.len(),
        2,
        "a run of 403s warns once: {forbidden:#?}"
    );
    assert!(forbidden.iter().all(|l| l.contains(" WARN ")));
    assert!(forbidden[0].contains("configmaps is forbidden"));
    assert_eq!(logs.lines_with("still not allowed").len(), 2, "at DEBUG");
    assert_eq!(logs.lines_with("watch synced").len(), 1);
    assert_eq!(logs.lines_with("watch relisted").len(), 1);

    shutdown.cancel();
    assert!(watch.next().await.is_none());
    assert_eq!(logs.lines_with("watch stopped").len(), 1);
}

#[tokio::test]
async fn shutdown_before_the_first_list_ends_the_watch_unsynced() {
    logs();
    let (client, mut api) = mock_client();
    let shutdown = CancellationToken::new();
    let watch = Watch::new(self::api(client), config(), shutdown.clone());
    let synced = watch.synced();
    let run = tokio::spawn(watch.run());
    // The LIST is never answered.
    let _list = expect(&mut api, false, None).await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(1), run)
        .await
        .expect("run ends at shutdown, without the API's answer")
        .unwrap();
    assert!(!synced.is_synced());
    assert!(!synced.wait().await, "never synced");
}

#[tokio::test(start_paused = true)]
async fn a_cache_stores_slimmed_objects_follows_events_and_relists() {
    logs();
    let (client, mut api) = mock_client();
    let shutdown = CancellationToken::new();
    let (cache, watch) = Cache::new(
        self::api(client),
        config(),
        |cm: &mut ConfigMap| cm.metadata.managed_fields = None,
        shutdown.clone(),
    );
    assert!(!cache.synced().is_synced());
    let task = tokio::spawn(watch.run());
    let (step_tx, mut step_rx) = tokio::sync::mpsc::channel::<()>(1);
    let scenario = tokio::spawn(async move {
        let send = listed(
            &mut api,
            "10",
            vec![
                config_map("a", "1", json!({ "k": "1" })),
                config_map("b", "2", json!({})),
            ],
        )
        .await;
        // The test looks at the store after the LIST, then lets the WATCH go on.
        step_rx.recv().await;
        send_bytes(
            send,
            200,
            watch_events(&[
                ("MODIFIED", config_map("a", "11", json!({ "k": "2" }))),
                ("DELETED", config_map("b", "12", json!({}))),
                ("ADDED", config_map("c", "13", json!({}))),
                gone_410(),
            ]),
        );
        // The relist shows d alone: what vanished meanwhile leaves the store.
        listed(&mut api, "20", vec![config_map("d", "19", json!({}))]).await
    });

    let limit = Duration::from_secs(60);
    assert!(
        tokio::time::timeout(limit, cache.synced().wait())
            .await
            .unwrap()
    );
    let get = |name: &str| cache.store().get(&ObjectRef::new(name).within(NS));
    let a = get("a").expect("a listed");
    assert_eq!(a.data.as_ref().unwrap()["k"], "1");
    assert!(a.metadata.managed_fields.is_none(), "slimmed");
    assert!(a.metadata.labels.is_some(), "the rest kept");
    assert!(get("b").is_some());
    assert!(format!("{cache:?}").contains("objects: 2"), "{cache:?}");

    step_tx.send(()).await.unwrap();
    let _held = tokio::time::timeout(limit, scenario)
        .await
        .unwrap()
        .unwrap();
    tokio::task::yield_now().await;
    let names = |cache: &Cache<ConfigMap>| {
        let mut names: Vec<String> = cache
            .store()
            .state()
            .iter()
            .filter_map(|cm| cm.metadata.name.clone())
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(&cache), ["d"], "the relist replaced the store");
    assert!(cache.synced().is_synced(), "a relist keeps it synced");

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(1), task)
        .await
        .expect("the cache's task ends at shutdown")
        .unwrap();
    assert_eq!(names(&cache.clone()), ["d"], "the store outlives its task");
}

#[tokio::test]
async fn a_ready_signal_is_synced() {
    logs();
    let synced = Synced::ready();
    assert!(synced.is_synced());
    assert!(synced.wait().await);
    assert_eq!(format!("{synced:?}"), "Synced(true)");
}
