//! Connections handed to another process: a server whose primary accepts and sends each
//! connection to a worker over a unix socket (`SCM_RIGHTS`). The workers' sockets must answer
//! as the TCP connection, not as the socketpair the upgrade put under it.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use rdma_streams_softroce::{Ctx, Scenario, Topology};

use super::support::{WAIT_PORT, expect_counts, file, python, shimmed};

pub const SCENARIOS: &[Scenario] = &[Scenario {
    name: "shim_node_cluster_workers_see_the_tcp_connection",
    topology: Topology::Loop,
    timeout: Duration::from_secs(300),
    run: node_cluster,
}];

const NODE_CLUSTER: &str = include_str!("scripts/node_cluster.js");
const CLIENT: &str = include_str!("scripts/handed_client.py");

/// Requests, one connection each.
const REQUESTS: usize = 8;

/// Node.js's cluster (the primary accepts, two workers serve what it sends them) behind the
/// shim, a shimmed client: every connection upgrades, and each worker's socket names the
/// client's own address and port, the server's, and the IPv4 family (without the handed
/// connection's answers, Node makes a pipe of it: `remoteAddress` is `undefined`); a client's
/// reset reaches the worker as `ECONNRESET`.
fn node_cluster(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let server = file(ctx, "node_cluster.js", NODE_CLUSTER)?;
    let client = file(ctx, "handed_client.py", CLIENT)?;
    let srv = ctx.spawn(&format!(
        "{} node {} {a} 9100 {}",
        shimmed(ctx, "srv", "")?,
        server.display(),
        REQUESTS + 1
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9100"))?;
    let out = ctx.sh(&format!(
        "{} {} {} {a} 9100 {REQUESTS}",
        shimmed(ctx, "cli", "")?,
        python(),
        client.display()
    ))?;
    let served = ctx.wait("node cluster", srv)?;
    ensure!(served.success(), "the node cluster failed");
    // The client's reset reaches the worker as TCP's would, not as an orderly end.
    ensure!(
        served.stdout.contains("reset ECONNRESET"),
        "the worker did not see the client's reset: {:?}",
        served.stdout
    );
    let mut workers = BTreeSet::new();
    let lines: Vec<&str> = out.stdout.lines().collect();
    // REQUESTS answers; the reset connection has none.
    ensure!(
        lines.len() == REQUESTS,
        "{} answers of {REQUESTS}",
        lines.len()
    );
    for line in lines {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [me, worker, family, remote, local] = f[..] else {
            anyhow::bail!("an answer of another shape: {line:?}");
        };
        ensure!(
            family == "IPv4" && remote == me && local == format!("{a}:9100"),
            "a worker saw {family} {remote} -> {local}, the client was {me}: {line:?}"
        );
        workers.insert(worker.parse::<u32>().context(line.to_owned())?);
    }
    ensure!(
        workers.len() == 2,
        "served by {workers:?}, not by both workers"
    );
    let all = REQUESTS as u64 + 1;
    expect_counts(ctx, "cli", "client", &[("rdma UPGRADED", all)])?;
    expect_counts(ctx, "srv", "server", &[("rdma UPGRADED", all)])
}
