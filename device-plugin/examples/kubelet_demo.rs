//! `make demo`, device-plugin part: the plugin on a simulated node, talking to a fake kubelet
//! over the real kubelet protos and unix sockets.
//!
//! The node is `examples/sysfs/two-hca-node` rebuilt in a temp dir (so a port can be flapped):
//! mlx5_0 InfiniBand on NUMA 0, mlx5_1 RoCE on NUMA 1, mlx5_2 a sub-function of mlx5_1.

#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use clap::Parser;
use rdma_device_plugin::cli::{Args, run_plugin};
use rdma_device_plugin_testkit::{fake_kubelet::FakeKubelet, fixture::example_two_hca_node};
use tokio_util::sync::CancellationToken;

const RESOURCE: &str = "rdma-streams.io/hca";
const WAIT: Duration = Duration::from_secs(10);

fn count(list: &[rdma_device_plugin::api::v1beta1::Device], hca: &str, health: &str) -> usize {
    list.iter()
        .filter(|d| d.id.starts_with(&format!("{hca}-")) && d.health == health)
        .count()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let tree = example_two_hca_node(&dir.path().join("node"))?;
    let kubelet_root = dir.path().join("kubelet");
    let mut kubelet = FakeKubelet::start(&kubelet_root).await?;
    let config = dir.path().join("pools.yaml");
    std::fs::write(
        &config,
        "pools:\n  - resourceName: rdma-streams.io/hca\n    slotsPerHca: 8\n",
    )?;
    let args = Args::try_parse_from([
        "rdma-device-plugin".as_ref(),
        "--sysfs-root".as_ref(),
        tree.sys_root().as_os_str(),
        "--dev-root".as_ref(),
        tree.dev_root().as_os_str(),
        "--kubelet-root-dir".as_ref(),
        kubelet_root.as_os_str(),
        "--config".as_ref(),
        config.as_os_str(),
        "--log-level".as_ref(),
        "error".as_ref(),
    ])?;
    let shutdown = CancellationToken::new();
    let plugin = tokio::spawn(run_plugin(args, shutdown.clone()));

    println!("  config: one pool {RESOURCE}, 8 slots per HCA");
    kubelet.wait_registered(RESOURCE, 1, WAIT).await?;
    let list = kubelet
        .wait_devices(RESOURCE, WAIT, |d| d.len() == 24)
        .await?;
    println!(
        "  registered with kubelet as {RESOURCE} via {}",
        kubelet.endpoint(RESOURCE).unwrap_or_default().display()
    );
    println!("  ListAndWatch: {} devices", list.len());
    for hca in ["mlx5_0", "mlx5_1", "mlx5_2"] {
        let d = list
            .iter()
            .find(|d| d.id.starts_with(hca))
            .ok_or("missing HCA")?;
        let numa = d
            .topology
            .as_ref()
            .and_then(|t| t.nodes.first())
            .map(|n| n.id);
        println!(
            "    {hca}-0000 .. {hca}-0007  NUMA {}  {}",
            numa.map_or("-".to_string(), |n| n.to_string()),
            d.health
        );
    }

    let all: Vec<String> = list.iter().map(|d| d.id.clone()).collect();
    let pref = kubelet
        .preferred(RESOURCE, &all, &["mlx5_1-0003".to_string()], 3)
        .await?;
    println!("  GetPreferredAllocation(size 3, must include mlx5_1-0003) -> {pref:?}");

    let resp = kubelet.allocate(RESOURCE, &["mlx5_0-0002"]).await?;
    println!("  Allocate([mlx5_0-0002]) -> only mlx5_0's char devices:");
    for d in &resp.devices {
        println!(
            "    {} ({}) <- {}",
            d.container_path, d.permissions, d.host_path
        );
    }
    for (k, v) in &resp.envs {
        println!("    env {k}={v}");
    }

    println!("  port 1 of mlx5_0 goes DOWN in sysfs ...");
    let t0 = Instant::now();
    tree.set_port_state("mlx5_0", 1, "DOWN", "Polling")?;
    let list = kubelet
        .wait_devices(RESOURCE, WAIT, |d| count(d, "mlx5_0", "Unhealthy") == 8)
        .await?;
    println!(
        "    kubelet sees {} Unhealthy after {:.0} ms (the devices stay listed)",
        count(&list, "mlx5_0", "Unhealthy"),
        t0.elapsed().as_secs_f64() * 1e3
    );
    tree.set_port_state("mlx5_0", 1, "ACTIVE", "LinkUp")?;
    kubelet
        .wait_devices(RESOURCE, WAIT, |d| count(d, "mlx5_0", "Healthy") == 8)
        .await?;
    println!("    ... and Healthy again when the port comes back");

    println!("  kubelet restarts (its sockets deleted, a new kubelet.sock created) ...");
    let t0 = Instant::now();
    kubelet.restart().await?;
    kubelet.wait_registered(RESOURCE, 2, WAIT).await?;
    let list = kubelet
        .wait_devices(RESOURCE, WAIT, |d| d.len() == 24)
        .await?;
    println!(
        "    re-registered with the full list of {} devices after {:.0} ms",
        list.len(),
        t0.elapsed().as_secs_f64() * 1e3
    );

    shutdown.cancel();
    plugin.await??;
    println!("  SIGTERM-style drain: streams ended, socket removed");
    Ok(())
}
