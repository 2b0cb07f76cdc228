//! Connections that cross processes: a server whose primary accepts and sends each connection
//! to a worker over a unix socket (`SCM_RIGHTS`), whose workers' sockets must answer as the TCP
//! connection, not as the socketpair the upgrade put under it; and an `SO_REUSEPORT` group of
//! separately started servers, of which one holds the port's RDMA listener.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use rdma_streams_softroce::{Ctx, Scenario, Topology};

use super::support::{WAIT_PORT, expect_counts, file, python, shimmed, wait_line};

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "shim_node_cluster_workers_see_the_tcp_connection",
        topology: Topology::Loop,
        timeout: Duration::from_secs(300),
        run: node_cluster,
    },
    Scenario {
        name: "shim_reuseport_group_of_separate_processes_upgrades_in_each",
        topology: Topology::Loop,
        timeout: Duration::from_secs(300),
        run: reuseport_group,
    },
];

const NODE_CLUSTER: &str = include_str!("scripts/node_cluster.js");
const CLIENT: &str = include_str!("scripts/handed_client.py");
/// An `SO_REUSEPORT` echo server that stops on a file (attacks.rs starts one too).
pub const REUSEPORT_SERVER: &str = include_str!("scripts/reuseport_server.py");
/// A client of N one-line connections.
pub const LINE_CLIENT: &str = include_str!("scripts/line_client.py");

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

/// Connections of the `SO_REUSEPORT` group scenario, while both servers run.
const GROUP_CONNECTIONS: usize = 16;
/// How long the first server may take to close its listener once told.
const LINE_WAIT: Duration = Duration::from_secs(20);
/// Connections once the first server (the holder) closed its listener.
const AFTER_HOLDER: usize = 8;

/// Two echo servers started one after the other, each with its own `SO_REUSEPORT` socket on
/// one port: the first holds the RDMA listener, the kernel hands each connection to either.
/// Every client connection upgrades, both servers serve some, and each names its client as
/// the client names itself. Then the first closes its listener and lives on (a seamless
/// reload's old instance draining): the second takes the RDMA listener over, and every new
/// connection upgrades there.
fn reuseport_group(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let server = file(ctx, "reuseport_server.py", REUSEPORT_SERVER)?;
    let client = file(ctx, "line_client.py", LINE_CLIENT)?;
    let py = python();
    let start = |stop: &std::path::Path| -> anyhow::Result<_> {
        ctx.spawn(&format!(
            "{} {py} {} {a} 9200 {}",
            shimmed(ctx, "srv", "")?,
            server.display(),
            stop.display()
        ))
    };
    let connect = |n: usize| -> anyhow::Result<Vec<u32>> {
        let out = ctx.sh(&format!(
            "{} {py} {} {a} 9200 {n}",
            shimmed(ctx, "cli", "")?,
            client.display()
        ))?;
        let lines: Vec<&str> = out.stdout.lines().collect();
        ensure!(lines.len() == n, "{} answers of {n}", lines.len());
        let mut pids = Vec::new();
        for (i, line) in lines.iter().enumerate() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [me, pid, peer, hello, count] = f[..] else {
                anyhow::bail!("an answer of another shape: {line:?}");
            };
            ensure!(
                peer == me && hello == "hello" && count == i.to_string(),
                "connection {i}: the server saw {peer} and {hello} {count}, the client was {me}"
            );
            pids.push(pid.parse::<u32>().context(line.to_string())?);
        }
        Ok(pids)
    };
    let first = start(&ctx.tmp.join("first.stop"))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9200"))?;
    let second = start(&ctx.tmp.join("second.stop"))?;
    ctx.sh(
        "for _ in $(seq 1 400); do [ \"$(ss -ltnH | grep -c ':9200 ')\" = 2 ] && exit 0; \
         sleep 0.05; done; echo 'the second server never listened' >&2; exit 1",
    )?;
    let mut by_pid = std::collections::BTreeMap::new();
    for pid in connect(GROUP_CONNECTIONS)? {
        *by_pid.entry(pid).or_insert(0u32) += 1;
    }
    ctx.report(format_args!("connections by server pid: {by_pid:?}"));
    // The first stops listening and lives on (a seamless reload's old instance draining).
    std::fs::write(ctx.tmp.join("first.stop"), b"")?;
    let served = wait_line(ctx, &ctx.tmp.join("first.stop.served"), "served", LINE_WAIT)?;
    ensure!(
        !served.contains("served 0"),
        "the first server served nothing: {served:?} (served by {by_pid:?})"
    );
    // The second process takes the RDMA listener over once the first closed it.
    ctx.sh(
        "for _ in $(seq 1 200); do rdma resource show cm_id 2>/dev/null | \
         grep -q 'state LISTEN.*:9200 ' && exit 0; sleep 0.05; done; \
         echo 'nobody took the RDMA listener over' >&2; exit 1",
    )?;
    let after = connect(AFTER_HOLDER)?;
    let second_pid = by_pid.keys().copied().max().context("no server pids")?;
    ensure!(
        after.iter().all(|p| *p == second_pid),
        "after the first server stopped: served by {after:?}, not by {second_pid} alone"
    );
    for stop in ["second.stop", "first.stop.exit", "second.stop.exit"] {
        std::fs::write(ctx.tmp.join(stop), b"")?;
    }
    for (what, run) in [("first", first), ("second", second)] {
        let done = ctx.wait(&format!("the {what} server"), run)?;
        ensure!(done.success(), "the {what} server failed");
        ensure!(
            !done.stdout.contains("served 0"),
            "the {what} server served nothing: {:?} (served by {by_pid:?})",
            done.stdout
        );
    }
    let all = (GROUP_CONNECTIONS + AFTER_HOLDER) as u64;
    expect_counts(ctx, "cli", "client", &[("rdma UPGRADED", all)])?;
    expect_counts(ctx, "srv", "server", &[("rdma UPGRADED", all)])
}
