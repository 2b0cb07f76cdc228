//! Unit-test fixtures shared by the modules' tests: a runtime under a hard timeout, a core
//! without capture namespace or RDMA, a namespace lookup that counts its calls, and the
//! migrating VMI a node hook call carries with the event it means.

use std::{
    future::Future,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use serde_json::{Value, json};
use tokio::{sync::mpsc, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::{
    capture::netns::{NetnsError, NetnsLocator},
    events::{EventDelivery, Handled, Migration, MigrationEvent, Role},
    metrics::Metrics,
    migration::{GatewayCore, Settings, Shared},
    streams::{Fallback, StaticPeers},
};

/// Runs an async test body on its own runtime, failing after `limit`.
pub fn within<F>(limit: Duration, body: impl FnOnce() -> F + Send + 'static)
where
    F: Future<Output = ()>,
{
    rdma_streams_testkit::within(limit, move || {
        tokio::runtime::Runtime::new()
            .expect("runtime")
            .block_on(body())
    });
}

/// A capture namespace lookup that takes `delay`, then fails, counting its calls: every source
/// `Started` the core acts on calls it once (the capture attempt), so the count tells how
/// often the capture was programmed.
#[derive(Debug, Clone, Default)]
pub struct CountingLocator {
    pub delay: Duration,
    pub calls: Arc<AtomicUsize>,
}

impl CountingLocator {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl NetnsLocator for CountingLocator {
    fn locate(&self) -> Result<PathBuf, NetnsError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        Err(NetnsError::Locate("test: no capture namespace".into()))
    }
}

/// A core with no RDMA, no peers and `locator` for capture.
pub fn core_with(locator: impl NetnsLocator) -> GatewayCore {
    core_with_settings(locator, Settings::default())
}

/// [`core_with`] and `settings`.
pub fn core_with_settings(locator: impl NetnsLocator, settings: Settings) -> GatewayCore {
    GatewayCore::new(Arc::new(Shared::new(
        Err(Fallback::NoProvider),
        Arc::new(StaticPeers::default()),
        Arc::new(locator),
        Metrics::default(),
        settings,
    )))
}

/// A core running on its own task, fed with acknowledged deliveries.
pub struct RunningCore {
    pub shared: Arc<Shared>,
    tx: mpsc::Sender<EventDelivery>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl RunningCore {
    pub fn start(core: GatewayCore) -> RunningCore {
        let shared = core.shared().clone();
        let (tx, shutdown, task) = spawn_core(core);
        RunningCore {
            shared,
            tx,
            shutdown,
            task,
        }
    }

    /// Sends `event` and waits until the core has handled it.
    pub async fn send(&self, event: MigrationEvent) -> Handled {
        let (delivery, handled) = EventDelivery::acknowledged(event);
        self.tx.send(delivery).await.expect("core running");
        handled.await.expect("core answered")
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.expect("core task");
    }
}

/// Runs `core` on a task fed through the returned sender, until the token is cancelled.
pub fn spawn_core(
    core: GatewayCore,
) -> (
    mpsc::Sender<EventDelivery>,
    CancellationToken,
    JoinHandle<()>,
) {
    let (tx, rx) = mpsc::channel(4);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(core.run(rx, shutdown.clone()));
    (tx, shutdown, task)
}

/// VMI `ns/vm` (uid `u1`) in migration `m1` from node-a to node-b, as virt-handler sends it to
/// a node hook; `address`: the target's published address (ports 40000 and 40001), or none
/// published yet.
pub fn migrating_vmi(opted_in: bool, address: Option<&str>) -> Value {
    let labels = if opted_in {
        json!({ "rdma-streams.io/migration": "rdma", "kubevirt.io/nodeName": "node-a" })
    } else {
        json!({ "kubevirt.io/nodeName": "node-a" })
    };
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": { "name": "vm", "namespace": "ns", "uid": "u1", "labels": labels },
        "spec": { "domain": { "devices": {} } },
        "status": {
            "phase": "Running",
            "nodeName": "node-a",
            "migrationState": {
                "migrationUid": "m1",
                "sourceNode": "node-a",
                "targetNode": "node-b",
                "targetNodeAddress": address,
                "targetDirectMigrationNodePorts":
                    if address.is_some() { json!({ "40001": 0, "40000": 49152 }) } else { json!(null) },
            },
        },
    })
}

/// The `Started` of [`migrating_vmi`] (target 10.244.2.7) for the node in `role`.
pub fn migrating_vmi_started(role: Role) -> MigrationEvent {
    MigrationEvent::Started(migrating_vmi_migration(role))
}

/// The migration inside [`migrating_vmi_started`].
pub fn migrating_vmi_migration(role: Role) -> Migration {
    Migration {
        uid: "u1".into(),
        id: "m1".into(),
        vmi: "ns/vm".into(),
        role,
        target: "10.244.2.7".parse().expect("address"),
        ports: vec![40000, 40001],
        started: None,
    }
}

/// A process in a fresh network namespace with lo up and a veth pair, one end holding
/// 10.9.0.5/24 and fd00:9::5/64 (so also an fe80:: address); killed on drop. Needs root.
pub struct TestNetns(std::process::Child);

impl TestNetns {
    pub fn start() -> TestNetns {
        use std::io::{BufRead, BufReader};
        use std::process::{Command, Stdio};
        let mut child = Command::new("unshare")
            .args([
                "-n",
                "sh",
                "-c",
                "ip link set lo up && ip link add d0 type veth peer name d1 && \
                 ip addr add 10.9.0.5/24 dev d0 && ip addr add fd00:9::5/64 dev d0 nodad && \
                 ip link set d0 up && ip link set d1 up && echo ready && exec sleep 60",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read");
        assert_eq!(line.trim(), "ready", "namespace setup failed");
        TestNetns(child)
    }

    /// The nsfs file.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/net", self.0.id()))
    }

    /// `nft ARGS` inside, its stdout (panics on failure).
    pub fn nft(&self, args: &str) -> String {
        let out = std::process::Command::new("nsenter")
            .arg(format!("--net={}", self.path().display()))
            .arg("nft")
            .args(args.split_whitespace())
            .output()
            .expect("nsenter nft");
        assert!(
            out.status.success(),
            "nft {args}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
