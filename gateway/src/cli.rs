//! Command line: every flag is also an environment variable `RDMA_GW_<FLAG>` (the chart's
//! DaemonSet sets `RDMA_GW_NODE_NAME`, `RDMA_GW_LISTEN`, `RDMA_GW_ADMIN_LISTEN`,
//! `RDMA_GW_PROVIDER`, `RDMA_GW_LOG_FORMAT`, `RDMA_GW_LOG_LEVEL`, and
//! `RDMA_GW_NODE_HOOKS_SOCKET` when `gateway.nodeHooks.enabled`).

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use clap::Parser;
use prometheus_client::registry::Registry;
use rdma_streams_common::{
    report::Report,
    shutdown::spawn_signal_handler,
    telemetry::{self, LogFormat},
};
use rdma_streams_transport::{
    Engine, EngineConfig, Unusable,
    probe::probe_with,
    rdma::{Lib, PortSpace},
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    admin::{self, Readiness},
    core::{DEFAULT_MARK, GatewayCore, RdmaState, Settings, Shared},
    events::Delivery,
    fallback::Fallback,
    inbound,
    kube::hooks_server::{self, NodeHookServer},
    metrics::Metrics,
    netns::{NetnsLocator, NoNamespace, PathLocator, ProcessLocator},
    peers::{ChainedPeers, PeerDirectory, PeerEntry, StaticPeers},
    test_events,
};

/// Depth of the event channel: events are rare (a few per migration).
pub const EVENT_QUEUE: usize = 64;

/// How long shutdown waits for the node hook server to close its connections.
const HOOKS_STOP_GRACE: Duration = Duration::from_secs(5);

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

    /// Admin endpoint (`/live`, `/ready`, `/metrics`).
    #[arg(long, env = "RDMA_GW_ADMIN_LISTEN", default_value = "0.0.0.0:9103")]
    pub admin_listen: SocketAddr,

    /// librdmacm to load (dlopen: a soname or a path); libibverbs is the copy beside a path,
    /// else the system's.
    #[arg(long, env = "RDMA_GW_PROVIDER", default_value = "librdmacm.so.1")]
    pub provider: String,

    #[arg(long, env = "RDMA_GW_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Log filter (`info`, `rdma_migration_gateway=debug,info`, ...).
    #[arg(long, env = "RDMA_GW_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

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

    /// TEST HOOK: read migration events from this unix socket (see `test_events`).
    #[arg(long, env = "RDMA_GW_TEST_EVENTS_SOCKET")]
    pub test_events_socket: Option<PathBuf>,
    /// Watch the cluster (VirtualMachineInstances, node annotations): `auto` is on inside a
    /// pod (KUBERNETES_SERVICE_HOST set) unless the test events socket is given.
    #[arg(long, env = "RDMA_GW_KUBE", value_enum, default_value = "auto")]
    pub kube: KubeMode,
    /// The address peers reach this gateway's stream listener at, published as the node
    /// annotation `rdma-streams.io/gateway-address` (default: `--listen` when it names an
    /// address; the chart sets the node's IP).
    #[arg(long, env = "RDMA_GW_ADVERTISE_ADDRESS")]
    pub advertise_address: Option<std::net::IpAddr>,
}

/// Whether the gateway talks to the Kubernetes API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KubeMode {
    Auto,
    On,
    Off,
}

impl Args {
    pub fn parse_and_run() -> Result<(), RunError> {
        Args::parse().run()
    }

    pub fn run(self) -> Result<(), RunError> {
        let Args {
            node_name,
            listen,
            admin_listen,
            provider,
            log_format,
            log_level,
            capture_netns,
            capture_process,
            peers,
            stream_timeout_ms,
            mark,
            node_hooks_socket,
            test_events_socket,
            kube,
            advertise_address,
        } = self;
        let use_kube = match kube {
            KubeMode::On => true,
            KubeMode::Off => false,
            KubeMode::Auto => {
                test_events_socket.is_none()
                    && std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
            }
        };
        telemetry::init(log_format, &log_level);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            // Blocking threads (waits for streams to open) leave soon after.
            .thread_keep_alive(Duration::from_secs(1))
            .build()
            .map_err(RunError::Runtime)?;
        let settings = Settings {
            stream_timeout: Duration::from_millis(stream_timeout_ms),
            mark,
            stream_source: (!listen.ip().is_unspecified()).then(|| listen.ip()),
            ..Settings::default()
        };
        let rdma = start_engine(&provider, &settings);
        runtime.block_on(async move {
            let mut registry = Registry::default();
            let metrics = Metrics::register(&mut registry);
            let registry = Arc::new(registry);
            let readiness = Readiness::default();
            let shutdown = CancellationToken::new();
            spawn_signal_handler(shutdown.clone()).map_err(RunError::Signals)?;
            let admin = admin::bind(admin_listen).await?;
            tokio::spawn(admin::serve(
                admin,
                registry.clone(),
                readiness.clone(),
                shutdown.clone(),
            ));
            let capture_process = capture_process.trim().to_owned();
            let capturing = capture_netns.is_some() || !capture_process.is_empty();
            let locator: Arc<dyn NetnsLocator> = match capture_netns {
                Some(path) => Arc::new(PathLocator(path)),
                None if !capture_process.is_empty() => {
                    Arc::new(ProcessLocator::new(capture_process))
                }
                None => Arc::new(NoNamespace),
            };
            let cluster = if use_kube {
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
            let mut directories: Vec<Arc<dyn PeerDirectory>> =
                vec![Arc::new(StaticPeers::new(peers))];
            let cluster_peers = cluster.as_ref().map(|client| {
                let (directory, _task) =
                    crate::kube::node::PeerDirectory::spawn(client.clone(), shutdown.clone());
                directories.push(Arc::new(directory.clone()));
                directory
            });
            metrics.rdma_usable.set(i64::from(rdma.is_ok()));
            let shared = Arc::new(Shared::new(
                rdma,
                Arc::new(ChainedPeers(directories)),
                locator.clone(),
                metrics,
                settings,
            ));
            let engine = shared.rdma.as_ref().ok().cloned();
            let listener = match &engine {
                Some(engine) => match inbound::listen(shared.clone(), engine, listen) {
                    Ok(listener) => Some(listener),
                    Err(error) => {
                        warn!(error = %Report(&error), %listen, "no stream listener: this node accepts no streams");
                        None
                    }
                },
                None => None,
            };
            let hook_metrics = shared.metrics.clone();
            let core = GatewayCore::new(shared);
            if capturing {
                core.cleanup_stale().await;
            }
            let (events_tx, events_rx) = mpsc::channel::<Delivery>(EVENT_QUEUE);
            // Bound before any event is handled: a socket that cannot be made is a startup error.
            let hooks = match node_hooks_socket {
                Some(path) => {
                    let socket = hooks_server::bind(&path)?;
                    if node_name.is_empty() {
                        warn!("node hooks without --node-name (RDMA_GW_NODE_NAME): each call is judged for the node virt-handler names");
                    }
                    let server =
                        NodeHookServer::new(node_name.clone(), events_tx.clone(), hook_metrics)
                            .with_peers(cluster_peers.clone());
                    let stop = shutdown.clone();
                    Some(tokio::spawn(async move {
                        if let Err(error) = hooks_server::serve(socket, server, stop).await {
                            warn!(error = %Report(&error), "node hook server failed: migrations start from the VMI watch only");
                        }
                    }))
                }
                None => None,
            };
            if let Some(path) = test_events_socket {
                let tx = events_tx.clone();
                let stop = shutdown.clone();
                tokio::spawn(async move {
                    if let Err(error) = test_events::serve(&path, tx, stop).await {
                        warn!(error = %Report(&error), "test events socket failed");
                    }
                });
            }
            // The cluster: migrations from the VMI watch, this gateway's address on its node.
            let mut publisher = None;
            if let Some(client) = cluster {
                if node_name.is_empty() {
                    warn!("no --node-name (RDMA_GW_NODE_NAME): no VMI watch, nothing published");
                } else {
                    tokio::spawn(crate::kube::vmi::watch_migrations(
                        client.clone(),
                        node_name.clone(),
                        events_tx.clone(),
                        cluster_peers,
                        shutdown.clone(),
                    ));
                    let ip = advertise_address
                        .or_else(|| (!listen.ip().is_unspecified()).then(|| listen.ip()));
                    match ip {
                        Some(ip) => {
                            // Peers find this node by the VMI's targetNode (learned), the
                            // node's own addresses, and the virt-handler addresses read here.
                            let (vh_tx, vh_rx) = tokio::sync::watch::channel(Vec::new());
                            if capturing {
                                tokio::spawn(crate::kube::virt_handler::watch_addresses(
                                    locator.clone(),
                                    vh_tx.clone(),
                                    crate::kube::virt_handler::REFRESH,
                                    shutdown.clone(),
                                ));
                            }
                            publisher = Some((
                                vh_tx,
                                tokio::spawn(crate::kube::node::run_node_publisher(
                                    client,
                                    node_name.clone(),
                                    SocketAddr::new(ip, listen.port()),
                                    vh_rx,
                                    shutdown.clone(),
                                )),
                            ));
                        }
                        None => warn!(
                            %listen,
                            "no --advertise-address and --listen has no address: peers cannot find this gateway (their connections go over TCP)"
                        ),
                    }
                }
            }
            info!(node = %node_name, kube = use_kube, "gateway running");
            readiness.set(true);
            core.run(events_rx, shutdown.clone()).await;
            drop(events_tx);
            readiness.set(false);
            if let Some(task) = hooks {
                // Calls in flight fail fast now that the core is gone; then the socket is
                // removed. Bounded: a stuck client connection only leaves a stale socket, which
                // the next start replaces.
                if tokio::time::timeout(HOOKS_STOP_GRACE, task).await.is_err() {
                    warn!("node hook server did not stop in time; leaving its socket behind");
                }
            }
            drop(listener);
            if let Some(engine) = engine {
                // Every migration was aborted: its streams are being reset.
                let deadline = Instant::now() + STREAMS_STOP_GRACE;
                while engine.connections() > 0 && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                if engine.connections() > 0 {
                    warn!(streams = engine.connections(), "streams still open at exit");
                }
            }
            if let Some((vh_tx, task)) = publisher {
                // Removes the node annotation (bounded) before the process exits.
                let _ = task.await;
                drop(vh_tx);
            }
            info!("gateway stopped");
            Ok(())
        })
    }
}

/// Loads the RDMA libraries, probes them and starts the process's stream engine, once; the
/// answer holds for the process (a node without RDMA relays every connection over TCP with
/// the reason given here).
fn start_engine(provider: &str, settings: &Settings) -> RdmaState {
    let lib = match Lib::load(provider) {
        Ok(lib) => &*Box::leak(Box::new(lib)),
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
    let config = EngineConfig {
        ring_bytes: settings.ring_bytes,
        port_space: PortSpace::Ib,
        thread_name: String::from("gw-streams"),
        ..EngineConfig::default()
    };
    match Engine::start(usable.lib, config) {
        Ok(engine) => {
            info!(provider, devices = ?usable.devices, ring_bytes = engine.config().ring(), "RDMA stream engine started");
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
    #[error("installing signal handlers")]
    Signals(#[source] std::io::Error),
    #[error(transparent)]
    Admin(#[from] crate::admin::BindError),
    #[error(transparent)]
    NodeHooks(#[from] crate::kube::hooks_server::HookServerError),
}
