//! Command line: `rdma-device-plugin [serve]` and `rdma-device-plugin discover`.
//!
//! Every flag is also an environment variable `RDMA_DP_<FLAG>`.

use std::{
    io::Write,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use clap::{Parser, Subcommand, ValueEnum};
use prometheus_client::registry::Registry;
use rdma_streams_common::reload_metrics::ReloadStatsCollector;
use rdma_streams_common::report::Report;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::{
    admin,
    config::{self, Config},
    config_watch,
    hca::Inventory,
    inventory_watch::{self, InventorySettings},
    manager::Manager,
    metrics::Metrics,
    pool::PoolSnapshot,
    readiness::Readiness,
    registration::RegistrationMode,
    runner::RunnerSettings,
    telemetry::{self, LogFormat},
};

#[derive(Debug, Parser)]
#[command(
    name = "rdma-device-plugin",
    version,
    about = "Kubelet device plugin for RDMA HCAs"
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Pool config (YAML or JSON; the Mellanox `configList` format is accepted). Absent file:
    /// one pool of all RDMA devices as `rdma-streams.io/hca`.
    #[arg(long, env = "RDMA_DP_CONFIG", global = true)]
    pub config: Option<PathBuf>,

    /// Root of the sysfs tree to read.
    #[arg(
        long,
        env = "RDMA_DP_SYSFS_ROOT",
        default_value = "/sys",
        global = true
    )]
    pub sysfs_root: PathBuf,

    /// Root of the dev tree (char devices under `<dev-root>/infiniband/`).
    #[arg(long, env = "RDMA_DP_DEV_ROOT", default_value = "/dev", global = true)]
    pub dev_root: PathBuf,

    /// kubelet's `--root-dir`; sockets live in `device-plugins/` and `plugins_registry/`.
    #[arg(
        long,
        env = "RDMA_DP_KUBELET_ROOT_DIR",
        default_value = "/var/lib/kubelet",
        global = true
    )]
    pub kubelet_root_dir: PathBuf,

    /// How to register with kubelet.
    #[arg(
        long,
        env = "RDMA_DP_REGISTRATION",
        value_enum,
        default_value = "kubelet-sock",
        global = true
    )]
    pub registration: RegistrationMode,

    /// Write CDI specs to `--cdi-dir` and answer Allocate with `cdi_devices`.
    #[arg(long, env = "RDMA_DP_CDI", global = true)]
    pub cdi: bool,

    /// Where CDI specs are written.
    #[arg(
        long,
        env = "RDMA_DP_CDI_DIR",
        default_value = "/var/run/cdi",
        global = true
    )]
    pub cdi_dir: PathBuf,

    /// Admin endpoint (`/live`, `/ready`, `/metrics`), e.g. `0.0.0.0:9101`. Off when unset.
    #[arg(long, env = "RDMA_DP_ADMIN_LISTEN", global = true)]
    pub admin_listen: Option<SocketAddr>,

    /// How often sysfs is re-read for devices and port state, in milliseconds.
    #[arg(
        long,
        env = "RDMA_DP_DISCOVERY_INTERVAL_MS",
        default_value_t = 1000,
        global = true
    )]
    pub discovery_interval_ms: u64,

    /// How often each pool checks that its socket and kubelet's are still the ones it
    /// registered with (inotify reacts first; this is the fallback), in milliseconds.
    #[arg(
        long,
        env = "RDMA_DP_SOCKET_POLL_MS",
        default_value_t = 5000,
        global = true
    )]
    pub socket_poll_ms: u64,

    /// Log format.
    #[arg(
        long,
        env = "RDMA_DP_LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    pub log_format: LogFormat,

    /// Log filter (`info`, `debug`, `rdma_device_plugin=debug,info`, ...).
    #[arg(long, env = "RDMA_DP_LOG_LEVEL", default_value = "info", global = true)]
    pub log_level: String,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the device plugin (the default).
    Serve,
    /// Print the HCAs, ports, char devices, NUMA nodes and pools that would be advertised.
    Discover {
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value = "yaml")]
        output: OutputFormat,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Yaml,
    Json,
}

/// Failures that end the process, each with what to fix.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Discovery(#[from] crate::discovery::DiscoveryError),
    #[error(transparent)]
    Admin(#[from] admin::BindError),
    #[error("installing signal handlers")]
    Signal(#[source] std::io::Error),
    #[error("writing output: {0}")]
    Output(String),
}

impl Args {
    /// Parses the command line and runs it.
    pub fn parse_and_run() -> Result<(), RunError> {
        let args = Self::parse();
        telemetry::init(args.log_format, &args.log_level);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(RunError::Signal)?;
        rt.block_on(args.run())
    }

    pub async fn run(self) -> Result<(), RunError> {
        match self.command {
            Some(Command::Discover { output }) => {
                let report =
                    discover_report(&self.sysfs_root, &self.dev_root, self.config.as_deref())?;
                let mut out = std::io::stdout().lock();
                write_report(&mut out, &report, output)
            }
            None | Some(Command::Serve) => self.serve().await,
        }
    }

    async fn serve(self) -> Result<(), RunError> {
        let shutdown = CancellationToken::new();
        crate::shutdown::spawn_signal_handler(shutdown.clone()).map_err(RunError::Signal)?;
        run_plugin(self, shutdown).await
    }
}

/// Runs the plugin until `shutdown` is cancelled (tests cancel it themselves).
pub async fn run_plugin(args: Args, shutdown: CancellationToken) -> Result<(), RunError> {
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let readiness = Readiness::default();

    let config_watch = config_watch::spawn(args.config.clone(), config_watch::DEFAULT_POLL)?;
    registry.register_collector(Box::new(ReloadStatsCollector::new(
        "rdma_dp",
        config_watch.stats(),
    )));
    let config_rx = config_watch.subscribe();

    let admin_listener = match args.admin_listen {
        Some(addr) => Some(admin::bind(addr).await?),
        None => None,
    };
    let registry = Arc::new(registry);
    let admin_task = admin_listener.map(|l| {
        tokio::spawn(admin::serve(
            l,
            registry.clone(),
            readiness.clone(),
            shutdown.clone(),
        ))
    });

    // libibverbs reads the real /sys and /dev: its view only matches ours on the real roots.
    let verbs = cfg!(feature = "verbs")
        && args.sysfs_root == Path::new("/sys")
        && args.dev_root == Path::new("/dev");
    let (inventory_rx, inventory_task) = inventory_watch::spawn(
        InventorySettings {
            sys_root: args.sysfs_root.clone(),
            dev_root: args.dev_root.clone(),
            interval: Duration::from_millis(args.discovery_interval_ms.max(50)),
            verbs,
        },
        metrics.clone(),
        shutdown.clone(),
    )
    .await;

    info!(
        kubelet_root = %args.kubelet_root_dir.display(),
        registration = ?args.registration,
        cdi = args.cdi,
        verbs,
        "rdma-device-plugin starting"
    );
    let manager = Manager {
        settings: RunnerSettings {
            kubelet_root: args.kubelet_root_dir.clone(),
            mode: args.registration,
            dev_root: args.dev_root.clone(),
            poll: Duration::from_millis(args.socket_poll_ms.max(50)),
            cdi_dir: args.cdi.then(|| args.cdi_dir.clone()),
        },
        metrics,
        readiness,
        shutdown: shutdown.clone(),
    };
    manager.run(config_rx, inventory_rx).await;
    drop(config_watch);
    shutdown.cancel();
    let _ = inventory_task.await;
    if let Some(task) = admin_task
        && let Ok(Err(error)) = task.await
    {
        error!(error = %Report(&error), "admin endpoint failed");
    }
    info!("rdma-device-plugin stopped");
    Ok(())
}

/// What `discover` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoverReport {
    pub sysfs_root: String,
    pub dev_root: String,
    /// Plain-language notes (for example: no RDMA device found).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    #[serde(flatten)]
    pub inventory: Inventory,
    pub pools: Vec<PoolReport>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolReport {
    pub resource_name: String,
    pub slots_per_hca: u32,
    pub hcas: Vec<String>,
    pub healthy_devices: usize,
    pub unhealthy_devices: usize,
    /// The first and last device IDs, to show their shape.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sample_ids: Vec<String>,
}

/// Discovers and groups into pools, as the plugin would.
pub fn discover_report(
    sysfs_root: &Path,
    dev_root: &Path,
    config_path: Option<&Path>,
) -> Result<DiscoverReport, RunError> {
    let cfg: Config = config::load(config_path)?;
    let inventory = crate::discovery::discover(sysfs_root, dev_root)?;
    let mut notes = Vec::new();
    if inventory.hcas.is_empty() {
        notes.push(format!(
            "no RDMA device found under {} (no RDMA hardware, or its driver is not loaded yet); \
             the plugin would advertise zero devices and keep watching",
            sysfs_root.join("class/infiniband").display()
        ));
    } else if !inventory.rdma_cm.present {
        notes.push(format!(
            "{} is missing: every device is Unhealthy until rdma_ucm is loaded",
            dev_root.join("infiniband/rdma_cm").display()
        ));
    }
    if let Some(advice) = crate::netns_mode::advice(inventory.netns_mode) {
        notes.push(advice.to_string());
    }
    let pools = cfg
        .pools
        .iter()
        .map(|p| {
            let snap = PoolSnapshot::build(p, &inventory, cfg.resync);
            let (healthy, unhealthy) = snap.health_counts();
            let sample_ids = match (snap.slots.first(), snap.slots.last()) {
                (Some(a), Some(b)) if a.id != b.id => vec![a.id.clone(), b.id.clone()],
                (Some(a), _) => vec![a.id.clone()],
                _ => vec![],
            };
            PoolReport {
                resource_name: p.resource_name.clone(),
                slots_per_hca: p.slots_per_hca,
                hcas: snap.hcas.keys().cloned().collect(),
                healthy_devices: healthy,
                unhealthy_devices: unhealthy,
                sample_ids,
            }
        })
        .collect();
    Ok(DiscoverReport {
        sysfs_root: sysfs_root.display().to_string(),
        dev_root: dev_root.display().to_string(),
        notes,
        inventory,
        pools,
    })
}

/// Writes the report as YAML or JSON.
pub fn write_report(
    out: &mut dyn Write,
    report: &DiscoverReport,
    format: OutputFormat,
) -> Result<(), RunError> {
    let text = match format {
        OutputFormat::Yaml => {
            serde_yaml::to_string(report).map_err(|e| RunError::Output(e.to_string()))?
        }
        OutputFormat::Json => {
            let mut s = serde_json::to_string_pretty(report)
                .map_err(|e| RunError::Output(e.to_string()))?;
            s.push('\n');
            s
        }
    };
    out.write_all(text.as_bytes())
        .map_err(|e| RunError::Output(e.to_string()))
}
