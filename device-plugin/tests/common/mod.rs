//! Shared harness: a fixture node, a fake kubelet and the plugin running in-process.

// Test support: a panic is how a helper fails the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)]

use std::{path::PathBuf, time::Duration};

use clap::Parser;
use rdma_device_plugin::api::v1beta1::Device;
use rdma_device_plugin::cli::{Args, RunError, run_plugin};
use rdma_device_plugin_testkit::{
    fake_kubelet::FakeKubelet,
    fixture::{FixtureTree, HcaSpec},
};
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const RESOURCE: &str = "rdma-streams.io/hca";
/// Generous bound for anything the plugin should do "at once" (CI machines are slow).
pub const SOON: Duration = Duration::from_secs(10);

use rdma_streams_testkit::within_async;

/// What one test may take at most, unless it says otherwise.
pub const LIMIT: Duration = Duration::from_secs(60);
/// Slots of [`Harness::two_hcas`] in the default pool: 64 per HCA.
pub const TWO_HCA_SLOTS: usize = 128;

pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            std::env::var("RUST_LOG").unwrap_or_else(|_| "rdma_device_plugin=debug,warn".into()),
        )
        .with_test_writer()
        .try_init();
}

pub struct Harness {
    pub dir: TempDir,
    pub tree: FixtureTree,
    pub kubelet: FakeKubelet,
    pub shutdown: CancellationToken,
    pub plugin: Option<JoinHandle<Result<(), RunError>>>,
}

impl Harness {
    /// A node with two ConnectX HCAs (IB on NUMA 0, RoCE on NUMA 1) unless `hcas` says else.
    pub async fn new(hcas: Vec<HcaSpec>) -> Self {
        init_logs();
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = FixtureTree::new(dir.path().join("node")).expect("fixture");
        for spec in hcas {
            tree.add_hca(spec).expect("add hca");
        }
        let kubelet = FakeKubelet::start(&dir.path().join("kubelet"))
            .await
            .expect("fake kubelet");
        Self {
            dir,
            tree,
            kubelet,
            shutdown: CancellationToken::new(),
            plugin: None,
        }
    }

    /// The two-HCA node with the plugin started (default flags) and registered once.
    pub async fn registered() -> Self {
        Self::started(None, &[]).await
    }

    /// The two-HCA node with the plugin registered and its full list delivered.
    pub async fn listed() -> (Self, Vec<Device>) {
        let h = Self::registered().await;
        let list = h.devices(TWO_HCA_SLOTS).await;
        (h, list)
    }

    /// The two-HCA node with `config` in its config file (none: no file), the plugin started
    /// with `extra` flags and registered once.
    pub async fn started(config: Option<&str>, extra: &[&str]) -> Self {
        let mut h = Self::new(Self::two_hcas()).await;
        if let Some(config) = config {
            std::fs::write(h.config_path(), config).expect("write the config");
        }
        h.start_plugin(extra);
        h.registrations(1).await;
        h
    }

    /// Waits until the kubelet holds `n` devices of [`RESOURCE`]; returns them.
    pub async fn devices(&self, n: usize) -> Vec<Device> {
        self.devices_where(|d| d.len() == n).await
    }

    /// Waits until `pred` holds for the kubelet's list of [`RESOURCE`]; returns the list.
    pub async fn devices_where(&self, pred: impl Fn(&[Device]) -> bool) -> Vec<Device> {
        self.kubelet
            .wait_devices(RESOURCE, SOON, pred)
            .await
            .expect("the device list")
    }

    /// Waits until the plugin has registered [`RESOURCE`] `n` times in all.
    pub async fn registrations(&self, n: usize) {
        self.kubelet
            .wait_registered(RESOURCE, n, SOON)
            .await
            .unwrap_or_else(|e| panic!("registration {n}: {e}"));
    }

    pub fn two_hcas() -> Vec<HcaSpec> {
        vec![
            HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0").numa(0),
            HcaSpec::connectx_eth("mlx5_1", "0000:af:00.0")
                .numa(1)
                .netdev("ens2f0np0"),
        ]
    }

    pub fn kubelet_root(&self) -> PathBuf {
        self.dir.path().join("kubelet")
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.yaml")
    }

    /// The plugin's arguments (fast intervals) plus `extra`.
    pub fn args(&self, extra: &[&str]) -> Args {
        let sys = self.tree.sys_root();
        let dev = self.tree.dev_root();
        let root = self.kubelet_root();
        let config = self.config_path();
        let mut argv: Vec<String> = [
            "rdma-device-plugin",
            "--sysfs-root",
            &sys.to_string_lossy(),
            "--dev-root",
            &dev.to_string_lossy(),
            "--kubelet-root-dir",
            &root.to_string_lossy(),
            "--config",
            &config.to_string_lossy(),
            "--discovery-interval-ms",
            "100",
            "--socket-poll-ms",
            "200",
        ]
        .iter()
        .map(|s| (*s).to_string())
        .collect();
        argv.extend(extra.iter().map(|s| (*s).to_string()));
        Args::try_parse_from(argv).expect("args")
    }

    /// The real plugin binary `bin` pointed at this node and kubelet (stdout discarded, no
    /// config from the environment); callers add flags and stderr handling.
    pub fn plugin_command(&self, bin: &str) -> std::process::Command {
        let mut cmd = std::process::Command::new(bin);
        cmd.arg("--sysfs-root")
            .arg(self.tree.sys_root())
            .arg("--dev-root")
            .arg(self.tree.dev_root())
            .arg("--kubelet-root-dir")
            .arg(self.kubelet_root())
            .env_remove("RDMA_DP_CONFIG")
            .stdout(std::process::Stdio::null());
        cmd
    }

    pub fn start_plugin(&mut self, extra: &[&str]) {
        let args = self.args(extra);
        self.plugin = Some(tokio::spawn(run_plugin(args, self.shutdown.clone())));
    }

    /// Drains the plugin and checks it ended cleanly.
    pub async fn stop_plugin(&mut self) {
        self.shutdown.cancel();
        if let Some(p) = self.plugin.take() {
            within_async(Duration::from_secs(15), p)
                .await
                .expect("plugin task")
                .expect("plugin result");
        }
    }

    pub fn ids(&self, hca: &str) -> Vec<String> {
        self.kubelet
            .devices(RESOURCE)
            .unwrap_or_default()
            .into_iter()
            .filter(|d| d.id.starts_with(&format!("{hca}-")))
            .map(|d| d.id)
            .collect()
    }
}

/// All devices of `hca` in `list` have `health`, and there is at least one.
pub fn all_of(list: &[Device], hca: &str, health: &str) -> bool {
    let mine: Vec<_> = list
        .iter()
        .filter(|d| d.id.starts_with(&format!("{hca}-")))
        .collect();
    !mine.is_empty() && mine.iter().all(|d| d.health == health)
}
