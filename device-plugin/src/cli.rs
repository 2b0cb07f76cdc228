//! Command line: `rdma-device-plugin [serve]` and `rdma-device-plugin discover`.
//!
//! Every flag is also an environment variable `RDMA_DP_<FLAG>`.

use std::{
    io::Write,
    path::{Path, PathBuf},
    time::Duration,
};

use clap::{Parser, Subcommand, ValueEnum};
use prometheus_client::registry::Registry;
use rdma_streams_common::{
    args::{AdminArgs, LogArgs},
    reload_metrics::ReloadStatsCollector,
    runtime::{self, Runtime},
};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::{
    allocation::pool::PoolSnapshot,
    config::{self, Config, watch as config_watch},
    inventory::{
        hca::Inventory,
        watch::{self as inventory_watch, InventorySettings},
    },
    kubelet::{manager::Manager, registration::RegistrationMode, runner::RunnerSettings},
    metrics::Metrics,
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

    /// `--admin-listen`: off when unset.
    #[command(flatten)]
    pub admin: AdminArgs<Env>,

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

    /// `--log-format`, `--log-level`.
    #[command(flatten)]
    pub log: LogArgs<Env>,
}

rdma_streams_common::flag_env! {
    /// The environment variables of the shared flags: `RDMA_DP_<FLAG>`, like every other flag.
    pub enum Env = "RDMA_DP";
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
    Discovery(#[from] crate::inventory::discovery::DiscoveryError),
    #[error(transparent)]
    Runtime(#[from] runtime::Error),
    #[error("building the tokio runtime")]
    Tokio(#[source] std::io::Error),
    #[error("writing output: {0}")]
    Output(String),
}

/// What the command line asks for, decided from the flags alone.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// Print what would be advertised.
    Discover {
        sysfs_root: PathBuf,
        dev_root: PathBuf,
        config: Option<PathBuf>,
        output: OutputFormat,
    },
    /// Run the plugin.
    Serve(ServePlan),
}

/// What `serve` runs.
#[derive(Clone, Debug, PartialEq)]
pub struct ServePlan {
    /// `--config`, watched.
    pub config: Option<PathBuf>,
    /// `--admin-listen`.
    pub admin: Option<std::net::SocketAddr>,
    /// Rediscovery of the HCAs.
    pub inventory: InventorySettings,
    /// Every pool's runner.
    pub runner: RunnerSettings,
}

/// Shortest interval the plugin polls at, whatever the flags say.
const MIN_INTERVAL: Duration = Duration::from_millis(50);

impl Args {
    /// Parses the command line and runs it.
    pub fn parse_and_run() -> Result<(), RunError> {
        let args = Self::parse();
        args.log.init();
        let rt = runtime::executor(runtime::Threads::Workers(2)).map_err(RunError::Tokio)?;
        rt.block_on(args.run())
    }

    /// What to do, from the flags alone.
    pub fn plan(&self) -> Plan {
        match self.command {
            Some(Command::Discover { output }) => Plan::Discover {
                sysfs_root: self.sysfs_root.clone(),
                dev_root: self.dev_root.clone(),
                config: self.config.clone(),
                output,
            },
            None | Some(Command::Serve) => Plan::Serve(ServePlan {
                config: self.config.clone(),
                admin: self.admin.listen,
                inventory: InventorySettings {
                    sys_root: self.sysfs_root.clone(),
                    dev_root: self.dev_root.clone(),
                    interval: Duration::from_millis(self.discovery_interval_ms).max(MIN_INTERVAL),
                    // libibverbs reads the real /sys and /dev: its view only matches ours on
                    // the real roots.
                    verbs: cfg!(feature = "verbs")
                        && self.sysfs_root == Path::new("/sys")
                        && self.dev_root == Path::new("/dev"),
                },
                runner: RunnerSettings {
                    kubelet_root: self.kubelet_root_dir.clone(),
                    mode: self.registration,
                    dev_root: self.dev_root.clone(),
                    poll: Duration::from_millis(self.socket_poll_ms).max(MIN_INTERVAL),
                    cdi_dir: self.cdi.then(|| self.cdi_dir.clone()),
                },
            }),
        }
    }

    /// Runs the plan; `serve` drains on SIGTERM or SIGINT.
    pub async fn run(self) -> Result<(), RunError> {
        match self.plan() {
            Plan::Discover {
                sysfs_root,
                dev_root,
                config,
                output,
            } => {
                let report = discover_report(&sysfs_root, &dev_root, config.as_deref())?;
                let mut out = std::io::stdout().lock();
                write_report(&mut out, &report, output)
            }
            Plan::Serve(plan) => serve(plan, Runtime::builder().with_signals()).await,
        }
    }
}

/// Runs the plugin until `shutdown` is cancelled (tests cancel it themselves).
pub async fn run_plugin(args: Args, shutdown: CancellationToken) -> Result<(), RunError> {
    match args.plan() {
        Plan::Serve(plan) => serve(plan, Runtime::builder().with_shutdown(shutdown)).await,
        Plan::Discover { .. } => args.run().await,
    }
}

/// Runs the plugin in the runtime `runtime` builds: the config watch, the inventory watch and
/// one runner per pool, until shutdown drains them.
pub async fn serve(plan: ServePlan, runtime: runtime::Builder) -> Result<(), RunError> {
    let ServePlan {
        config,
        admin,
        inventory,
        runner,
    } = plan;
    let config_watch = config_watch::spawn(config, config_watch::DEFAULT_POLL)?;
    let rt = runtime.admin(admin).build().await?;

    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    registry.register_collector(Box::new(ReloadStatsCollector::new(
        "rdma_dp",
        config_watch.stats(),
    )));
    let _ = rt.metrics().publish(registry);
    let readiness = rt.readiness().clone();
    let tasks = rt.tasks().clone();

    rt.run(async move {
        let verbs = inventory.verbs;
        let inventory_rx = inventory_watch::spawn(inventory, metrics.clone(), &tasks).await;
        info!(
            kubelet_root = %runner.kubelet_root.display(),
            registration = ?runner.mode,
            cdi = runner.cdi_dir.is_some(),
            verbs,
            "rdma-device-plugin starting"
        );
        let manager = Manager::new(runner, metrics, &readiness, tasks);
        manager.run(config_watch.subscribe(), inventory_rx).await;
        drop(config_watch);
        info!("rdma-device-plugin stopped");
        Ok(())
    })
    .await
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
    let inventory = crate::inventory::discovery::discover(sysfs_root, dev_root)?;
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
    if let Some(advice) = crate::inventory::netns_mode::advice(inventory.netns_mode) {
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
            rdma_streams_yaml::to_string(report).map_err(|e| RunError::Output(e.to_string()))?
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

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(argv: &[&str]) -> Plan {
        let argv = std::iter::once("rdma-device-plugin").chain(argv.iter().copied());
        Args::try_parse_from(argv).unwrap().plan()
    }

    #[test]
    fn serve_is_the_default_and_uses_the_defaults() {
        let Plan::Serve(p) = plan(&[]) else {
            panic!("not serve")
        };
        assert_eq!(
            p,
            match plan(&["serve"]) {
                Plan::Serve(p) => p,
                Plan::Discover { .. } => panic!("not serve"),
            }
        );
        assert_eq!(p.admin, None);
        assert_eq!(p.config, None);
        assert_eq!(p.inventory.sys_root, Path::new("/sys"));
        assert_eq!(p.inventory.interval, Duration::from_secs(1));
        assert_eq!(p.inventory.verbs, cfg!(feature = "verbs"));
        assert_eq!(p.runner.kubelet_root, Path::new("/var/lib/kubelet"));
        assert_eq!(p.runner.mode, RegistrationMode::KubeletSock);
        assert_eq!(p.runner.poll, Duration::from_secs(5));
        assert_eq!(p.runner.cdi_dir, None);
    }

    #[test]
    fn serve_plan_follows_the_flags() {
        let Plan::Serve(p) = plan(&[
            "--sysfs-root",
            "/fixture/sys",
            "--dev-root",
            "/fixture/dev",
            "--admin-listen",
            "0.0.0.0:9101",
            "--cdi",
            "--cdi-dir",
            "/cdi",
            "--registration",
            "plugin-watcher",
            "--discovery-interval-ms",
            "1",
            "--socket-poll-ms",
            "200",
        ]) else {
            panic!("not serve")
        };
        assert_eq!(p.admin, Some(([0, 0, 0, 0], 9101).into()));
        // Fixture roots: libibverbs would read the real ones, so no verbs probe.
        assert!(!p.inventory.verbs);
        assert_eq!(p.inventory.dev_root, Path::new("/fixture/dev"));
        assert_eq!(p.inventory.interval, MIN_INTERVAL);
        assert_eq!(p.runner.dev_root, Path::new("/fixture/dev"));
        assert_eq!(p.runner.mode, RegistrationMode::PluginWatcher);
        assert_eq!(p.runner.poll, Duration::from_millis(200));
        assert_eq!(p.runner.cdi_dir.as_deref(), Some(Path::new("/cdi")));
    }

    #[test]
    fn discover_takes_the_global_flags_after_it() {
        assert_eq!(
            plan(&[
                "discover",
                "-o",
                "json",
                "--sysfs-root",
                "/s",
                "--log-level",
                "debug"
            ]),
            Plan::Discover {
                sysfs_root: "/s".into(),
                dev_root: "/dev".into(),
                config: None,
                output: OutputFormat::Json,
            }
        );
    }
}
