//! The node hook server in-process, over a unix socket in a temporary directory, called with
//! the generated client as virt-handler would.

use std::{
    os::unix::fs::PermissionsExt,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use prost::Message;
use serde_json::Value;
use tokio::{sync::mpsc, task::JoinHandle};
use tonic::transport::Channel;

use super::*;
use crate::{
    events::Role,
    kube::hooks_api::{
        PRE_MIGRATION_SOURCE, PRE_MIGRATION_TARGET,
        v1alpha1::{NodeContext, node_hook_service_client::NodeHookServiceClient},
    },
    metrics::HookLabels,
    testing::{CountingLocator, core_with, migrating_vmi, migrating_vmi_started, within},
};

const LIMIT: Duration = Duration::from_secs(20);

/// A VMI as virt-handler sends it: migrating from node-a to node-b, target published.
fn vmi(opted_in: bool) -> Value {
    migrating_vmi(opted_in, Some("10.244.2.7"))
}

fn request(hook_point: &str, vmi: &[u8], node: &str) -> ExecuteNodeHookRequest {
    ExecuteNodeHookRequest {
        hook_point: hook_point.into(),
        vmi: vmi.to_vec(),
        node_context: Some(NodeContext {
            node_name: node.into(),
        }),
    }
}

/// A channel to the socket at `path`.
async fn channel(path: &Path) -> Channel {
    rdma_streams_common::uds::channel(path, Duration::from_secs(5), None)
        .await
        .expect("connect to the node hook socket")
}

/// A served node hook socket and what the core would receive.
struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
    events: mpsc::Receiver<EventDelivery>,
    metrics: Metrics,
    shutdown: CancellationToken,
    server: JoinHandle<Result<(), HookServerError>>,
    /// What the server told the peer directory.
    peers: NodePeerDirectory,
}

impl Fixture {
    async fn start(node_name: &str, timeout: Duration) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        // A parent that does not exist yet: bind creates it.
        let path = dir.path().join("plugins/rdma-migration-gateway/node.sock");
        let (tx, events) = mpsc::channel(8);
        let metrics = Metrics::default();
        let peers = NodePeerDirectory::detached();
        let server = NodeHookServer::new(node_name.into(), tx, metrics.clone())
            .with_timeout(timeout)
            .with_peers(Some(peers.clone()));
        let socket = bind(&path).expect("bind");
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(socket, server, shutdown.clone()));
        Fixture {
            _dir: dir,
            path,
            events,
            metrics,
            shutdown,
            server,
            peers,
        }
    }

    async fn client(&self) -> NodeHookServiceClient<Channel> {
        NodeHookServiceClient::new(channel(&self.path).await)
    }

    async fn call(&self, request: ExecuteNodeHookRequest) -> ExecuteNodeHookResponse {
        self.client()
            .await
            .execute_node_hook(request)
            .await
            .expect("the call never fails")
            .into_inner()
    }

    fn count(&self, hook: &str, outcome: HookOutcome) -> u64 {
        self.metrics
            .node_hook_calls
            .get_or_create(&HookLabels {
                hook: hook.into(),
                outcome: outcome.as_str().into(),
            })
            .get()
    }

    /// Stops the server; the socket file must be gone afterwards.
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.server)
            .await
            .expect("server stops on shutdown")
            .unwrap()
            .expect("server ran cleanly");
        assert!(!self.path.exists(), "socket removed at shutdown");
    }
}

/// A core stand-in: takes one delivery, records it, waits `delay`, records the
/// acknowledgement and sends `outcome`.
fn fake_core(
    mut events: mpsc::Receiver<EventDelivery>,
    delay: Duration,
    outcome: Handled,
    log: Arc<Mutex<Vec<String>>>,
) -> JoinHandle<(MigrationEvent, mpsc::Receiver<EventDelivery>)> {
    tokio::spawn(async move {
        let EventDelivery { event, handled } = events.recv().await.expect("a delivery");
        log.lock().unwrap().push("core received".into());
        tokio::time::sleep(delay).await;
        log.lock().unwrap().push("core acknowledged".into());
        handled
            .expect("the hook server asks for an acknowledgement")
            .send(outcome)
            .unwrap();
        (event, events)
    })
}

#[test]
fn pre_migration_source_is_answered_only_after_the_core_handled_it() {
    within(LIMIT, pre_migration_source_body);
}

async fn pre_migration_source_body() {
    let mut fx = Fixture::start("node-a", DEFAULT_CALL_TIMEOUT).await;
    let events = std::mem::replace(&mut fx.events, mpsc::channel(1).1);
    let log = Arc::new(Mutex::new(Vec::new()));
    let core = fake_core(
        events,
        Duration::from_millis(300),
        Handled::Started,
        log.clone(),
    );
    let bytes = serde_json::to_vec(&vmi(true)).unwrap();
    let response = fx
        .call(request(PRE_MIGRATION_SOURCE, &bytes, "node-a"))
        .await;
    log.lock().unwrap().push("virt-handler answered".into());
    assert!(response.success);
    assert!(response.message.contains("ns/vm"), "{}", response.message);
    let (event, _events) = core.await.unwrap();
    assert_eq!(event, migrating_vmi_started(Role::Source));
    // As the VMI watch does: the target's migration address is known to live on the target
    // node before the first connection is captured.
    assert_eq!(
        fx.peers
            .learned_node("10.244.2.7".parse().unwrap())
            .as_deref(),
        Some("node-b")
    );
    assert_eq!(
        *log.lock().unwrap(),
        [
            "core received",
            "core acknowledged",
            "virt-handler answered"
        ]
    );
    assert_eq!(fx.count(PRE_MIGRATION_SOURCE, HookOutcome::Started), 1);
    fx.stop().await;
}

#[test]
fn pre_migration_target_starts_the_target_role() {
    within(LIMIT, pre_migration_target_body);
}

async fn pre_migration_target_body() {
    let mut fx = Fixture::start("node-b", DEFAULT_CALL_TIMEOUT).await;
    let events = std::mem::replace(&mut fx.events, mpsc::channel(1).1);
    let log = Arc::new(Mutex::new(Vec::new()));
    let core = fake_core(events, Duration::ZERO, Handled::AlreadyStarted, log);
    let bytes = serde_json::to_vec(&vmi(true)).unwrap();
    let response = fx
        .call(request(PRE_MIGRATION_TARGET, &bytes, "node-b"))
        .await;
    assert!(response.success);
    let (event, _events) = core.await.unwrap();
    assert_eq!(event, migrating_vmi_started(Role::Target));
    assert_eq!(fx.peers.learned_node("10.244.2.7".parse().unwrap()), None);
    assert_eq!(
        fx.count(PRE_MIGRATION_TARGET, HookOutcome::AlreadyStarted),
        1
    );
    fx.stop().await;
}

#[test]
fn calls_without_a_migration_for_us_answer_success_and_send_nothing() {
    within(LIMIT, nothing_to_do_body);
}

async fn nothing_to_do_body() {
    let mut fx = Fixture::start("node-a", DEFAULT_CALL_TIMEOUT).await;
    let opted_in = serde_json::to_vec(&vmi(true)).unwrap();
    let opted_out = serde_json::to_vec(&vmi(false)).unwrap();
    let cases = [
        (
            "not opted in",
            request(PRE_MIGRATION_SOURCE, &opted_out, "node-a"),
        ),
        (
            "other hook point",
            request("PreVMStart", &opted_in, "node-a"),
        ),
        (
            "after the migration",
            request("PostMigrationSource", &opted_in, "node-a"),
        ),
        (
            "unknown hook point",
            request("SomethingNew", &opted_in, "node-a"),
        ),
        // node-a is the source: a target hook on node-a means nothing.
        (
            "wrong role for the node",
            request(PRE_MIGRATION_TARGET, &opted_in, "node-a"),
        ),
    ];
    for (name, request) in cases {
        let response = fx.call(request).await;
        assert!(response.success, "{name}");
        assert!(fx.events.try_recv().is_err(), "{name}: no event");
    }
    assert_eq!(fx.count(PRE_MIGRATION_SOURCE, HookOutcome::Ignored), 1);
    assert_eq!(fx.count("PreVMStart", HookOutcome::Ignored), 1);
    assert_eq!(fx.count("PostMigrationSource", HookOutcome::Ignored), 1);
    assert_eq!(fx.count("other", HookOutcome::Ignored), 1, "bounded label");
    assert_eq!(fx.count(PRE_MIGRATION_TARGET, HookOutcome::Ignored), 1);
    fx.stop().await;
}

#[test]
fn unreadable_vmis_answer_success() {
    within(LIMIT, unreadable_body);
}

async fn unreadable_body() {
    let mut fx = Fixture::start("node-a", DEFAULT_CALL_TIMEOUT).await;
    for garbage in [&b"not json"[..], b"", b"\xff\xfe{", b"[1,2,3]"] {
        let response = fx
            .call(request(PRE_MIGRATION_SOURCE, garbage, "node-a"))
            .await;
        assert!(response.success, "{garbage:?}");
        // The message carries serde_json's reason, after the gateway's own words.
        assert!(
            response
                .message
                .contains("VMI not readable (hook call carries no readable VMI: ")
                && response.message.contains(" at line "),
            "{}",
            response.message
        );
        assert!(fx.events.try_recv().is_err());
    }
    // No node context at all: still an answer, judged for our own node.
    let response = fx
        .call(ExecuteNodeHookRequest {
            hook_point: PRE_MIGRATION_SOURCE.into(),
            vmi: b"{".to_vec(),
            node_context: None,
        })
        .await;
    assert!(response.success);
    assert_eq!(fx.count(PRE_MIGRATION_SOURCE, HookOutcome::Error), 5);
    fx.stop().await;
}

#[test]
fn a_migration_already_over_is_answered_as_nothing_to_do() {
    within(LIMIT, stale_body);
}

async fn stale_body() {
    let mut fx = Fixture::start("node-a", DEFAULT_CALL_TIMEOUT).await;
    let events = std::mem::replace(&mut fx.events, mpsc::channel(1).1);
    let core = fake_core(events, Duration::ZERO, Handled::Stale, Arc::default());
    let bytes = serde_json::to_vec(&vmi(true)).unwrap();
    let response = fx
        .call(request(PRE_MIGRATION_SOURCE, &bytes, "node-a"))
        .await;
    assert!(response.success);
    assert!(
        response.message.contains("already over"),
        "{}",
        response.message
    );
    let _ = core.await.unwrap();
    assert_eq!(fx.count(PRE_MIGRATION_SOURCE, HookOutcome::Ignored), 1);
    assert_eq!(fx.count(PRE_MIGRATION_SOURCE, HookOutcome::Error), 0);
    fx.stop().await;
}

#[test]
fn a_core_that_fails_stalls_or_stops_still_gets_success() {
    within(LIMIT, core_failures_body);
}

async fn core_failures_body() {
    let bytes = serde_json::to_vec(&vmi(true)).unwrap();

    // Capture failed.
    let mut fx = Fixture::start("node-a", DEFAULT_CALL_TIMEOUT).await;
    let events = std::mem::replace(&mut fx.events, mpsc::channel(1).1);
    let core = fake_core(events, Duration::ZERO, Handled::Uncaptured, Arc::default());
    let response = fx
        .call(request(PRE_MIGRATION_SOURCE, &bytes, "node-a"))
        .await;
    assert!(response.success);
    assert!(
        response.message.contains("capture not installed"),
        "{}",
        response.message
    );
    let _ = core.await.unwrap();
    assert_eq!(fx.count(PRE_MIGRATION_SOURCE, HookOutcome::Error), 1);
    fx.stop().await;

    // The core takes the event but never answers: bounded by the timeout.
    let fx = Fixture::start("node-a", Duration::from_millis(300)).await;
    let started_at = Instant::now();
    let response = fx
        .call(request(PRE_MIGRATION_SOURCE, &bytes, "node-a"))
        .await;
    assert!(response.success);
    assert!(
        started_at.elapsed() >= Duration::from_millis(300),
        "answered before the timeout"
    );
    assert!(response.message.contains("in time"), "{}", response.message);
    assert_eq!(fx.count(PRE_MIGRATION_SOURCE, HookOutcome::Error), 1);
    fx.stop().await;

    // The core is gone (gateway stopping).
    let mut fx = Fixture::start("node-a", DEFAULT_CALL_TIMEOUT).await;
    drop(std::mem::replace(&mut fx.events, mpsc::channel(1).1));
    let response = fx
        .call(request(PRE_MIGRATION_SOURCE, &bytes, "node-a"))
        .await;
    assert!(response.success);
    assert!(
        response.message.contains("stopping"),
        "{}",
        response.message
    );
    fx.stop().await;
}

#[test]
fn with_the_real_core_the_answer_follows_the_capture_attempt() {
    within(LIMIT, real_core_body);
}

async fn real_core_body() {
    let mut fx = Fixture::start("node-a", DEFAULT_CALL_TIMEOUT).await;
    let events = std::mem::replace(&mut fx.events, mpsc::channel(1).1);
    let locator = CountingLocator {
        delay: Duration::from_millis(300),
        ..CountingLocator::default()
    };
    let core = core_with(locator.clone());
    let shared = core.shared().clone();
    let stop_core = CancellationToken::new();
    let core_task = tokio::spawn(core.run(events, stop_core.clone()));
    let bytes = serde_json::to_vec(&vmi(true)).unwrap();
    let response = fx
        .call(request(PRE_MIGRATION_SOURCE, &bytes, "node-a"))
        .await;
    // Answered only once the capture was attempted (and, without a namespace here, failed).
    assert_eq!(locator.calls(), 1);
    assert!(response.success);
    assert_eq!(shared.active(), 1);
    // The same call again (virt-handler retries): no second capture attempt.
    let response = fx
        .call(request(PRE_MIGRATION_SOURCE, &bytes, "node-a"))
        .await;
    assert!(response.success);
    assert_eq!(locator.calls(), 1);
    assert_eq!(
        fx.count(PRE_MIGRATION_SOURCE, HookOutcome::AlreadyStarted),
        1
    );
    stop_core.cancel();
    core_task.await.unwrap();
    fx.stop().await;
}

#[test]
fn the_gateways_own_node_name_decides_the_role() {
    within(LIMIT, node_name_body);
}

async fn node_name_body() {
    let bytes = serde_json::to_vec(&vmi(true)).unwrap();
    // virt-handler names node-b, but this gateway runs on node-a: judged for node-a.
    let mut fx = Fixture::start("node-a", DEFAULT_CALL_TIMEOUT).await;
    let events = std::mem::replace(&mut fx.events, mpsc::channel(1).1);
    let core = fake_core(events, Duration::ZERO, Handled::Started, Arc::default());
    let response = fx
        .call(request(PRE_MIGRATION_SOURCE, &bytes, "node-b"))
        .await;
    assert!(response.success);
    assert_eq!(core.await.unwrap().0, migrating_vmi_started(Role::Source));
    fx.stop().await;

    // Without --node-name, the call's node name is used.
    let mut fx = Fixture::start("", DEFAULT_CALL_TIMEOUT).await;
    let events = std::mem::replace(&mut fx.events, mpsc::channel(1).1);
    let core = fake_core(events, Duration::ZERO, Handled::Started, Arc::default());
    let response = fx
        .call(request(PRE_MIGRATION_TARGET, &bytes, "node-b"))
        .await;
    assert!(response.success);
    assert_eq!(core.await.unwrap().0, migrating_vmi_started(Role::Target));
    fx.stop().await;
}

/// The empty response message of the older stored API.
#[derive(Clone, PartialEq, prost::Message)]
struct EmptyResponse {}

#[test]
fn a_client_with_the_empty_response_message_decodes_our_answer() {
    within(LIMIT, old_client_body);
}

async fn old_client_body() {
    // The bytes of our answer decode as the empty message (unknown fields skipped).
    let ours = ExecuteNodeHookResponse {
        success: true,
        message: "rdma-migration-gateway: nothing to do".into(),
    };
    let bytes = ours.encode_to_vec();
    assert!(!bytes.is_empty());
    EmptyResponse::decode(bytes.as_slice()).expect("old decoder skips success and message");

    // And over the wire: a unary call whose response type is the empty message.
    let fx = Fixture::start("node-a", DEFAULT_CALL_TIMEOUT).await;
    let mut grpc = tonic::client::Grpc::new(channel(&fx.path).await);
    grpc.ready().await.expect("ready");
    let path = http::uri::PathAndQuery::from_static(
        "/kubevirt.hooks.plugins.v1alpha1.NodeHookService/ExecuteNodeHook",
    );
    let response: Response<EmptyResponse> = grpc
        .unary(
            Request::new(request("PreVMStart", b"{}", "node-a")),
            path,
            tonic_prost::ProstCodec::default(),
        )
        .await
        .expect("an old virt-handler reads our answer");
    assert_eq!(response.into_inner(), EmptyResponse {});
    fx.stop().await;
}

#[test]
fn clients_sending_the_socket_path_as_authority_are_answered() {
    within(LIMIT, path_authority_body);
}

/// virt-handler dials with grpc-go (`localhost`), but grpc-java, grpcurl and Python grpcio
/// send the socket path, grpcio percent-encoded: all of them get an answer.
async fn path_authority_body() {
    use rdma_streams_testkit::h2_raw::{Conn, Outcome, grpc_request};

    let fx = Fixture::start("node-a", DEFAULT_CALL_TIMEOUT).await;
    let method = "/kubevirt.hooks.plugins.v1alpha1.NodeHookService/ExecuteNodeHook";
    let message = request("PreVMStart", b"{}", "node-a").encode_to_vec();
    let socket = fx.path.to_str().unwrap().to_string();
    let grpcio = socket.trim_start_matches('/').replace('/', "%2F");
    for authority in ["localhost", &socket, &grpcio] {
        let mut conn = Conn::connect(&fx.path).await.unwrap();
        let outcome = conn
            .unary(1, &grpc_request(authority, method), &message)
            .await;
        let reply = match outcome.unwrap() {
            Outcome::Reply(reply) => reply,
            other => panic!("{authority}: {other:?}"),
        };
        assert_eq!(reply.grpc_status(), Some("0"), "{authority}: {reply:?}");
        let response = ExecuteNodeHookResponse::decode(reply.message().unwrap()).unwrap();
        assert!(response.success, "{authority}");
    }
    assert_eq!(fx.count("PreVMStart", HookOutcome::Ignored), 3);
    fx.stop().await;
}

#[test]
fn the_socket_replaces_a_stale_one_keeps_its_mode_and_refuses_other_files() {
    within(LIMIT, socket_body);
}

async fn socket_body() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.sock");
    // A stale socket left by a crashed gateway.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let socket = bind(&path).expect("stale socket replaced");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, SOCKET_MODE);
    assert_eq!(socket.path(), path);
    drop(socket);

    // A socket replaced by someone else meanwhile is not removed at shutdown.
    let socket = bind(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let other = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let (tx, _rx) = mpsc::channel(1);
    let shutdown = CancellationToken::new();
    shutdown.cancel();
    serve(
        socket,
        NodeHookServer::new("node-a".into(), tx, Metrics::default()),
        shutdown,
    )
    .await
    .unwrap();
    assert!(path.exists(), "someone else's socket stays");
    drop(other);
    std::fs::remove_file(&path).unwrap();

    // Anything but a socket is left alone.
    std::fs::write(&path, b"not a socket").unwrap();
    match bind(&path) {
        Err(HookServerError::NotASocket { .. }) => {}
        other => panic!("expected NotASocket, got {other:?}"),
    }
    assert_eq!(std::fs::read(&path).unwrap(), b"not a socket");
}
