//! Command line: every flag is also an environment variable `RDMA_GW_<FLAG>` (the chart's
//! DaemonSet sets `RDMA_GW_NODE_NAME`, `RDMA_GW_LISTEN`, `RDMA_GW_ADMIN_LISTEN`,
//! `RDMA_GW_PROVIDER`, `RDMA_GW_LOG_FORMAT`, `RDMA_GW_LOG_LEVEL`, and
//! `RDMA_GW_NODE_HOOKS_SOCKET` when `gateway.nodeHooks.enabled`).

use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use clap::Parser;
use prometheus_client::registry::Registry;
use rdma_streams_common::{
    args::{AdminArgs, LogArgs},
    reload_metrics::ReloadStatsCollector,
    report::Report,
    runtime::{self, Runtime, Tasks},
    watched_file::{self, Watchable, WatchedFile},
};
use rdma_streams_transport::{
    Engine, EngineConfig, Unusable,
    engine::PinLimits,
    probe::probe_with,
    rdma::{DEFAULT_PROVIDER, Lib, PortSpace},
};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::{
    capture::netns::{NetnsLocator, NoNamespace, PathLocator, ProcessLocator},
    events::{EventDelivery, EventSource},
    kube::hooks_server::{self, NodeHookServer},
    metrics::Metrics,
    migration::{DEFAULT_MARK, GatewayCore, Shared, target},
    streams::{
        ChainedPeers, PeerLookup, StaticPeers,
        keys::{KeyRing, KeysError, PeerKeys},
    },
};
pub use crate::{
    migration::{RdmaState, Settings},
    streams::{Fallback, PeerEntry},
};

/// Depth of the event channel: events are rare (a few per migration).
pub const EVENT_QUEUE: usize = 64;

/// How long shutdown waits for the aborted streams to be torn down (their peers then see a
/// reset at once instead of noticing the silence).
const STREAMS_STOP_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug, Parser)]
#[command(
    name = "rdma-migration-gateway",
    version,
    about = "Carries KubeVirt live migrations over RDMA streams"
)]
pub struct Args {
    /// This node's name (logs; the kube side publishes the gateway's address on it).
    #[arg(long, env = "RDMA_GW_NODE_NAME", default_value = "")]
    pub node_name: String,

    /// Address peer gateways open RDMA streams to (rdma_cm, IB port space); when it names an
    /// address, this gateway's own streams are opened from it too.
    #[arg(long, env = "RDMA_GW_LISTEN", default_value = "0.0.0.0:7471")]
    pub listen: SocketAddr,

    /// `--admin-listen` (default `0.0.0.0:9103`).
    #[command(flatten)]
    pub admin: AdminArgs<Env>,

    /// librdmacm to load (dlopen: a soname or a path); libibverbs is the copy beside a path,
    /// else the system's.
    #[arg(long, env = "RDMA_GW_PROVIDER", default_value = DEFAULT_PROVIDER)]
    pub provider: String,

    /// `--log-format`, `--log-level`.
    #[command(flatten)]
    pub log: LogArgs<Env>,

    /// The network namespace to capture in (virt-handler's): `/proc/<pid>/ns/net` or
    /// `/run/netns/<name>`. Overrides `--capture-process`.
    #[arg(long, env = "RDMA_GW_CAPTURE_NETNS")]
    pub capture_netns: Option<PathBuf>,

    /// Find the namespace to capture in as that of the process with this name (hostPID),
    /// looked up again at every migration start. `--capture-netns` wins; an empty value
    /// turns capture off (target role only).
    #[arg(long, env = "RDMA_GW_CAPTURE_PROCESS", default_value = "virt-handler")]
    pub capture_process: String,

    /// Static peer gateways, `TARGET_IP=GATEWAY_IP:PORT` (repeat, or comma list in the env).
    #[arg(long = "peer", env = "RDMA_GW_PEERS", value_delimiter = ',')]
    pub peers: Vec<PeerEntry>,

    /// Bound on opening a stream (the RDMA connect and the peer's answer, which comes after it
    /// dialed the destination), in ms.
    #[arg(long, env = "RDMA_GW_STREAM_TIMEOUT_MS", default_value_t = 2000)]
    pub stream_timeout_ms: u64,

    /// `SO_MARK` of the gateway's own sockets; capture rules skip it.
    #[arg(long, env = "RDMA_GW_MARK", default_value_t = DEFAULT_MARK)]
    pub mark: u32,

    /// Serve KubeVirt's node hooks (`NodeHookService`, Plugins feature gate) on this unix
    /// socket: `PreMigrationSource`/`PreMigrationTarget` start the migration before its first
    /// connect, and are answered once the capture is in place. Default: off (the VMI watch
    /// alone starts migrations).
    #[arg(long, env = "RDMA_GW_NODE_HOOKS_SOCKET")]
    pub node_hooks_socket: Option<PathBuf>,

    /// Watch the cluster (VirtualMachineInstances, node annotations): `auto` is on inside a
    /// pod (KUBERNETES_SERVICE_HOST set), unless the program feeds the gateway events of its
    /// own.
    #[arg(long, env = "RDMA_GW_KUBE", value_enum, default_value = "auto")]
    pub kube: KubeMode,
    /// The address peers reach this gateway's stream listener at, published as the node
    /// annotation `rdma-streams.io/gateway-address` (default: `--listen` when it names an
    /// address; the chart sets the node's IP). A target gateway also dials it (a virt-handler
    /// on the host network), besides virt-handler's own addresses.
    #[arg(long, env = "RDMA_GW_ADVERTISE_ADDRESS")]
    pub advertise_address: Option<IpAddr>,

    /// The pre-shared keys gateways authenticate each other with: one per line, standard
    /// base64 of at least 32 bytes, `#` comments; the first signs, every one verifies; re-read
    /// when it changes (a bad file keeps the last good keys). Without keys no RDMA stream is
    /// opened or accepted: every connection goes over TCP (`NO_PEER_KEY`).
    #[arg(long, env = "RDMA_GW_PEER_KEYS_FILE")]
    pub peer_keys_file: Option<PathBuf>,
}

rdma_streams_common::flag_env! {
    /// The environment variables of the shared flags: `RDMA_GW_<FLAG>`, like every other flag.
    pub enum Env = "RDMA_GW";
    const ADMIN_LISTEN_DEFAULT: Option<&'static str> = Some("0.0.0.0:9103");
    const GLOBAL: bool = false;
}

/// Whether the gateway talks to the Kubernetes API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KubeMode {
    Auto,
    On,
    Off,
}

/// Where migrations are captured (source role).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Capture {
    /// In this network namespace (`--capture-netns`).
    Netns(PathBuf),
    /// In the namespace of the process with this name (`--capture-process`).
    Process(String),
    /// Nowhere: target role only.
    Off,
}

/// What the gateway runs, decided from the flags alone.
#[derive(Debug, Clone)]
pub struct Plan {
    pub node_name: String,
    /// The stream listener.
    pub listen: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub provider: String,
    pub capture: Capture,
    pub peers: Vec<PeerEntry>,
    pub settings: Settings,
    pub node_hooks_socket: Option<PathBuf>,
    /// Watch the cluster.
    pub kube: bool,
    /// Published on the node for peers (none: `--listen` has no address and no
    /// `--advertise-address`).
    pub advertise: Option<SocketAddr>,
    /// The peer keys file (none: no stream is opened or accepted).
    pub peer_keys_file: Option<PathBuf>,
}

impl Args {
    pub fn parse_and_run() -> Result<(), RunError> {
        Args::parse().run()
    }

    /// What to run; `in_pod`: whether `KUBERNETES_SERVICE_HOST` is set; `own_sources`: whether
    /// the program adds event sources of its own ([`EventSource`]), which then stand in for
    /// the cluster (`--kube auto` stays off).
    pub fn plan(self, in_pod: bool, own_sources: bool) -> Plan {
        let Args {
            node_name,
            listen,
            admin,
            provider,
            log: _,
            capture_netns,
            capture_process,
            peers,
            stream_timeout_ms,
            mark,
            node_hooks_socket,
            kube,
            advertise_address,
            peer_keys_file,
        } = self;
        let kube = match kube {
            KubeMode::On => true,
            KubeMode::Off => false,
            KubeMode::Auto => in_pod && !own_sources,
        };
        let capture_process = capture_process.trim();
        let capture = match capture_netns {
            Some(path) => Capture::Netns(path),
            None if !capture_process.is_empty() => Capture::Process(capture_process.to_owned()),
            None => Capture::Off,
        };
        let listen_ip = (!listen.ip().is_unspecified()).then(|| listen.ip());
        let advertise = advertise_address.or(listen_ip);
        Plan {
            node_name,
            listen,
            admin: admin.listen,
            provider,
            capture,
            peers,
            settings: Settings {
                stream_timeout: Duration::from_millis(stream_timeout_ms),
                mark,
                stream_source: listen_ip,
                advertised: advertise,
                ..Settings::default()
            },
            node_hooks_socket,
            kube,
            advertise: advertise.map(|ip| SocketAddr::new(ip, listen.port())),
            peer_keys_file,
        }
    }

    /// Runs the gateway until SIGTERM or SIGINT.
    pub fn run(self) -> Result<(), RunError> {
        self.run_with(Vec::new())
    }

    /// [`Args::run`], with `sources` feeding the core besides the cluster's and the node
    /// hooks' events.
    pub fn run_with(self, sources: Vec<EventSource>) -> Result<(), RunError> {
        self.log.init();
        let in_pod = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
        let plan = self.plan(in_pod, !sources.is_empty());
        let tokio = runtime::executor(runtime::Threads::PerCpu).map_err(RunError::Runtime)?;
        let rdma = start_engine(&plan.provider, &plan.settings);
        tokio.block_on(serve(
            plan,
            rdma,
            Runtime::builder().with_signals(),
            sources,
        ))
    }
}

/// Runs the gateway in the runtime `runtime` builds, with the stream engine `rdma`, until
/// shutdown: the event sources (the plan's, and `sources`) feed the core, which owns every
/// migration.
pub async fn serve(
    plan: Plan,
    rdma: RdmaState,
    runtime: runtime::Builder,
    sources: Vec<EventSource>,
) -> Result<(), RunError> {
    let rt = runtime.admin(plan.admin).build().await?;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let peer_keys = watch_peer_keys(plan.peer_keys_file.clone(), &metrics)?;
    if let Some(keys) = &peer_keys {
        registry.register_collector(Box::new(ReloadStatsCollector::new(
            "rdma_gw_peer_keys",
            keys.stats(),
        )));
    }
    let key_ring = peer_keys.as_ref().map_or_else(
        || KeyRing::fixed(PeerKeys::default()),
        |w| KeyRing::new(w.subscribe()),
    );
    let _ = rt.metrics().publish(registry);
    let started = rt.readiness().gate("event sources");
    let tasks = rt.tasks().clone();
    rt.run(async move {
        let Plan {
            node_name,
            listen,
            capture,
            peers,
            settings,
            node_hooks_socket,
            kube,
            advertise,
            ..
        } = plan;
        let capturing = capture != Capture::Off;
        let locator: Arc<dyn NetnsLocator> = match capture {
            Capture::Netns(path) => Arc::new(PathLocator(path)),
            Capture::Process(name) => Arc::new(ProcessLocator::new(name)),
            Capture::Off => Arc::new(NoNamespace),
        };
        let cluster = if kube {
            match ::kube::Client::try_default().await {
                Ok(client) => Some(client),
                Err(error) => {
                    warn!(error = %Report(&error), "no Kubernetes client: no VMI watch, no peer directory");
                    None
                }
            }
        } else {
            None
        };
        let mut directories: Vec<Arc<dyn PeerLookup>> = vec![Arc::new(StaticPeers::new(peers))];
        let cluster_peers = cluster.as_ref().map(|client| {
            let (directory, task) =
                crate::kube::node::NodePeerDirectory::spawn(client.clone(), tasks.shutdown().clone());
            tasks.adopt("peer directory", task);
            directories.push(Arc::new(directory.clone()));
            directory
        });
        metrics.rdma_usable.set(i64::from(rdma.is_ok()));
        let shared = Arc::new(
            Shared::new(
                rdma,
                Arc::new(ChainedPeers(directories)),
                locator.clone(),
                metrics,
                settings,
            )
            .with_keys(key_ring),
        );
        let engine = shared.rdma.as_ref().ok().cloned();
        let listener = match &engine {
            Some(engine) => match target::listen(shared.clone(), engine, listen) {
                Ok(listener) => Some(listener),
                Err(error) => {
                    warn!(error = %Report(&error), %listen, "no stream listener: this node accepts no streams");
                    None
                }
            },
            None => None,
        };
        let hook_metrics = shared.metrics.clone();
        let core = GatewayCore::new(shared.clone());
        if capturing {
            core.cleanup_stale().await;
        }
        let (events_tx, events_rx) = mpsc::channel::<EventDelivery>(EVENT_QUEUE);
        // Bound before any event is handled: a socket that cannot be made is a startup error.
        if let Some(path) = node_hooks_socket {
            let socket = hooks_server::bind(&path)?;
            if node_name.is_empty() {
                warn!("node hooks without --node-name (RDMA_GW_NODE_NAME): each call is judged for the node virt-handler names");
            }
            let server = NodeHookServer::new(node_name.clone(), events_tx.clone(), hook_metrics)
                .with_peers(cluster_peers.clone());
            // Calls in flight fail fast once the core is gone; then the socket is removed.
            tasks.spawn(
                "node hooks",
                hooks_server::serve(socket, server, tasks.shutdown().clone()),
            );
        }
        for source in sources {
            let (name, task) = source.start(events_tx.clone(), tasks.shutdown().clone());
            tasks.spawn(name, task);
        }
        if let Some(client) = cluster {
            spawn_cluster_tasks(
                &tasks,
                client,
                &node_name,
                &events_tx,
                cluster_peers,
                capturing.then_some(locator),
                advertise,
                listen,
            );
        }
        info!(node = %node_name, kube, "gateway running");
        started.set(true);
        core.run(events_rx, tasks.shutdown().clone()).await;
        drop(events_tx);
        started.set(false);
        drop(listener);
        // Every migration was aborted: its connections end, its streams are being reset.
        if !shared.connections_closed(STREAMS_STOP_GRACE).await {
            warn!("connections still being carried at exit");
        }
        if let Some(engine) = engine {
            let deadline = Instant::now() + STREAMS_STOP_GRACE;
            while engine.connections() > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if engine.connections() > 0 {
                warn!(streams = engine.connections(), "streams still open at exit");
            }
        }
        drop(peer_keys);
        info!("gateway stopped");
        Ok(())
    })
    .await
}

/// Starts watching the peer keys file (none: no keys, said once here); keeps
/// `rdma_gw_peer_keys` current. A file that exists but does not parse at startup is an error
/// (there are no last good keys to keep).
fn watch_peer_keys(
    path: Option<PathBuf>,
    metrics: &Metrics,
) -> Result<Option<WatchedFile<PeerKeys>>, RunError> {
    let Some(path) = path else {
        warn!(
            "no --peer-keys-file (RDMA_GW_PEER_KEYS_FILE): this gateway opens and accepts no RDMA stream; every connection goes over TCP (NO_PEER_KEY)"
        );
        return Ok(None);
    };
    let watched = watched_file::spawn::<PeerKeys>(Some(path.clone()), watched_file::DEFAULT_POLL)
        .map_err(RunError::PeerKeys)?;
    let current = watched.current();
    metrics
        .peer_keys
        .set(i64::try_from(current.len()).unwrap_or(i64::MAX));
    if current.is_empty() {
        warn!(path = %path.display(), "the peer keys file does not exist (yet): no RDMA stream is opened or accepted until it does (NO_PEER_KEY)");
    } else {
        info!(path = %path.display(), keys = %current.summary(), "peer keys loaded");
    }
    let mut changes = watched.subscribe();
    let gauge = metrics.peer_keys.clone();
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            let keys = changes.borrow_and_update().clone();
            gauge.set(i64::try_from(keys.len()).unwrap_or(i64::MAX));
        }
    });
    Ok(Some(watched))
}

/// The cluster's part: migrations from the VMI watch, and this gateway's address published on
/// its node (removed again at shutdown).
#[allow(clippy::too_many_arguments)]
fn spawn_cluster_tasks(
    tasks: &Tasks,
    client: ::kube::Client,
    node_name: &str,
    events_tx: &mpsc::Sender<EventDelivery>,
    cluster_peers: Option<crate::kube::node::NodePeerDirectory>,
    capture_locator: Option<Arc<dyn NetnsLocator>>,
    advertise: Option<SocketAddr>,
    listen: SocketAddr,
) {
    if node_name.is_empty() {
        warn!("no --node-name (RDMA_GW_NODE_NAME): no VMI watch, nothing published");
        return;
    }
    tasks.spawn(
        "vmi watch",
        crate::kube::vmi::watch_migrations(
            client.clone(),
            node_name.to_owned(),
            events_tx.clone(),
            cluster_peers,
            tasks.shutdown().clone(),
        ),
    );
    let Some(advertise) = advertise else {
        warn!(
            %listen,
            "no --advertise-address and --listen has no address: peers cannot find this gateway (their connections go over TCP)"
        );
        return;
    };
    // Peers find this node by the VMI's targetNode (learned), the node's own addresses, and
    // the virt-handler addresses read here.
    let (vh_tx, vh_rx) = tokio::sync::watch::channel(Vec::new());
    if let Some(locator) = capture_locator {
        tasks.spawn(
            "virt-handler addresses",
            crate::kube::virt_handler::watch_addresses(
                locator,
                vh_tx.clone(),
                crate::kube::virt_handler::REFRESH,
                tasks.shutdown().clone(),
            ),
        );
    }
    let publisher = crate::kube::node::run_node_publisher(
        client,
        node_name.to_owned(),
        advertise,
        vh_rx,
        tasks.shutdown().clone(),
    );
    tasks.spawn("node publisher", async move {
        // Removes the node annotation (bounded) before it ends; the addresses stay open
        // until then.
        let _addresses = vh_tx;
        publisher.await;
    });
}

/// Loads the RDMA libraries, probes them and starts the process's stream engine, once; the
/// answer holds for the process (a node without RDMA relays every connection over TCP with
/// the reason given here).
fn start_engine(provider: &str, settings: &Settings) -> RdmaState {
    let lib = match Lib::load_static(provider) {
        Ok(lib) => lib,
        Err(error) => {
            warn!(error = %Report(&error), provider, "RDMA libraries not loaded: every connection goes over TCP");
            return Err(Fallback::NoProvider);
        }
    };
    let usable = match probe_with(lib) {
        Ok(usable) => usable,
        Err(why) => {
            warn!(why = %Report(&why), provider, "no usable RDMA device: every connection goes over TCP");
            return Err(match why {
                Unusable::NoLibrary(_) => Fallback::NoProvider,
                _ => Fallback::NoDevice,
            });
        }
    };
    // Pinned memory is bounded like the shim's: RLIMIT_MEMLOCK where it binds, and a share of
    // the memory the gateway may use in any case (a stream past it goes over TCP).
    let pin_budget = PinLimits::of_this_process().budget();
    let config = EngineConfig {
        ring_bytes: settings.ring_bytes,
        port_space: PortSpace::Ib,
        thread_name: String::from("gw-streams"),
        memlock_limit: Some(pin_budget),
        ..EngineConfig::default()
    };
    match Engine::start(usable.lib, config) {
        Ok(engine) => {
            info!(provider, devices = ?usable.devices, ring_bytes = engine.config().ring(), pin_budget, "RDMA stream engine started");
            Ok(engine)
        }
        Err(error) => {
            warn!(error = %Report(&error), provider, "the RDMA stream engine did not start: every connection goes over TCP");
            Err(Fallback::RdmaError)
        }
    }
}

/// Why the gateway could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    #[error("building the runtime")]
    Runtime(#[source] std::io::Error),
    /// The admin endpoint, the signal handlers, or a drain that did not finish.
    #[error(transparent)]
    Process(#[from] runtime::Error),
    #[error(transparent)]
    NodeHooks(#[from] crate::kube::hooks_server::HookServerError),
    #[error("the peer keys file")]
    PeerKeys(#[source] KeysError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(argv: &[&str], in_pod: bool) -> Plan {
        let argv = std::iter::once("rdma-migration-gateway").chain(argv.iter().copied());
        Args::try_parse_from(argv).unwrap().plan(in_pod, false)
    }

    #[test]
    fn defaults() {
        let p = plan(&[], false);
        assert_eq!(p.admin, Some(([0, 0, 0, 0], 9103).into()));
        assert_eq!(p.listen, SocketAddr::from(([0, 0, 0, 0], 7471)));
        assert_eq!(p.capture, Capture::Process("virt-handler".into()));
        assert!(!p.kube, "outside a pod");
        // An unspecified --listen: streams from the kernel's choice, nothing to advertise.
        assert_eq!(p.settings.stream_source, None);
        assert_eq!(p.advertise, None);
        assert_eq!(p.settings.stream_timeout, Duration::from_secs(2));
        assert_eq!(p.settings.mark, DEFAULT_MARK);
        assert_eq!(p.peer_keys_file, None);
    }

    #[test]
    fn the_peer_keys_file_and_the_advertised_address_reach_the_plan() {
        let p = plan(
            &[
                "--peer-keys-file",
                "/etc/gw/keys",
                "--advertise-address",
                "10.0.0.6",
            ],
            false,
        );
        assert_eq!(p.peer_keys_file, Some("/etc/gw/keys".into()));
        assert_eq!(p.settings.advertised, Some([10, 0, 0, 6].into()));
    }

    #[test]
    fn kube_auto_is_on_in_a_pod_unless_the_program_feeds_its_own_events() {
        assert!(plan(&[], true).kube);
        let args = Args::try_parse_from(["rdma-migration-gateway"]).unwrap();
        assert!(!args.plan(true, true).kube);
        let args = Args::try_parse_from(["rdma-migration-gateway", "--kube", "on"]).unwrap();
        assert!(args.plan(true, true).kube);
        assert!(plan(&["--kube", "on"], false).kube);
        assert!(!plan(&["--kube", "off"], true).kube);
    }

    #[test]
    fn capture_netns_wins_and_an_empty_process_turns_capture_off() {
        assert_eq!(
            plan(
                &["--capture-netns", "/run/netns/vh", "--capture-process", "x"],
                false
            )
            .capture,
            Capture::Netns("/run/netns/vh".into())
        );
        assert_eq!(
            plan(&["--capture-process", "  "], false).capture,
            Capture::Off
        );
        assert_eq!(
            plan(&["--capture-process", " virt-handler "], false).capture,
            Capture::Process("virt-handler".into())
        );
    }

    #[test]
    fn the_advertised_address_takes_the_listen_port() {
        let p = plan(&["--listen", "10.0.0.5:7000"], false);
        assert_eq!(p.settings.stream_source, Some([10, 0, 0, 5].into()));
        assert_eq!(p.advertise, Some(([10, 0, 0, 5], 7000).into()));
        let p = plan(
            &[
                "--listen",
                "0.0.0.0:7000",
                "--advertise-address",
                "10.0.0.6",
            ],
            false,
        );
        assert_eq!(p.settings.stream_source, None);
        assert_eq!(p.advertise, Some(([10, 0, 0, 6], 7000).into()));
    }

    #[test]
    fn flags_reach_the_plan() {
        let p = plan(
            &[
                "--admin-listen",
                "127.0.0.1:9999",
                "--stream-timeout-ms",
                "500",
                "--peer",
                "10.1.0.2=10.2.0.2:7471",
                "--node-hooks-socket",
                "/hooks.sock",
                "--log-format",
                "json",
            ],
            false,
        );
        assert_eq!(p.admin, Some(([127, 0, 0, 1], 9999).into()));
        assert_eq!(p.settings.stream_timeout, Duration::from_millis(500));
        assert_eq!(p.peers, ["10.1.0.2=10.2.0.2:7471".parse().unwrap()]);
        assert_eq!(p.node_hooks_socket, Some("/hooks.sock".into()));
    }
}
