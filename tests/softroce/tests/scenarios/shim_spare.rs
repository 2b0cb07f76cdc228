//! Spare connections (`shim/core/src/upgrade/spare.rs`): a client's next RDMA connect to a
//! peer made ahead of its `connect()`. On the real stack: a spare that aged out is not used,
//! the next connect takes a fresh one, a spare whose server went away leaves the next
//! connection plain TCP and byte-exact, and the server counts only the connections its app
//! accepted (an unclaimed spare is nobody's connection).

use std::time::Duration;

use anyhow::{Context as _, ensure};
use rdma_streams_softroce::{Ctx, Scenario, Topology};
use serde_json::Value;

use super::shim_faults::ECHO_SERVER;
use super::support::{WAIT_PORT, expect_counts, file, python, shimmed, stats, wait_line};

pub const SCENARIOS: &[Scenario] = &[Scenario {
    name: "shim_spare_connections_age_out_and_outlive_no_server",
    topology: Topology::Loop,
    timeout: Duration::from_secs(300),
    run: spares,
}];

/// See its header.
const CLIENT: &str = include_str!("scripts/spare_client.py");

fn spares(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let py = python();
    let server = file(ctx, "server.py", ECHO_SERVER)?;
    let client = file(ctx, "client.py", CLIENT)?;
    let go = ctx.tmp.join("go");
    let out = ctx.tmp.join("client.out");
    let srv = ctx.spawn(&format!(
        "exec {} {py} {} {a} 9750 3 0",
        shimmed(ctx, "srv", "")?,
        server.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9750"))?;
    let cli = ctx.spawn(&format!(
        "exec {} {py} {} {a} 9750 {} >{}",
        shimmed(ctx, "cli", "")?,
        client.display(),
        go.display(),
        out.display()
    ))?;
    wait_line(ctx, &out, "ready", Duration::from_secs(120))?;
    // The shimmed server ends after its third connection; its RDMA connections, the spare's
    // among them, end with it. A plain server takes the port.
    ensure!(
        ctx.wait("shimmed server", srv)?.success(),
        "shimmed server failed"
    );
    let plain = ctx.spawn(&format!("exec {py} {} {a} 9750 1 0", server.display()))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9750"))?;
    std::fs::write(&go, b"go").context("writing the go file")?;
    ensure!(ctx.wait("client", cli)?.success(), "client failed");
    ensure!(
        ctx.wait("plain server", plain)?.success(),
        "plain server failed"
    );
    let text = std::fs::read_to_string(&out)?;
    let line = text.lines().last().unwrap_or_default();
    let r: Value = serde_json::from_str(line).with_context(|| format!("client said {text}"))?;
    ctx.report(format_args!("connect seconds and fds: {r}"));
    // 1 and 2 upgraded without a spare (2's had aged out), 3 took the spare made when 2
    // closed, 4 found the spare's server gone and stayed TCP.
    expect_counts(
        ctx,
        "cli",
        "client",
        &[("rdma UPGRADED", 3), ("tcp PEER_NOT_SHIMMED", 1)],
    )?;
    let taken: u64 = stats(ctx, "cli")?
        .values()
        .map(|v| v["spare_connects"].as_u64().unwrap_or(0))
        .sum();
    ensure!(
        taken == 1,
        "the client took {taken} spares, expected 1 (the third connect)"
    );
    // The spare made after the third connection was never accepted: not counted.
    expect_counts(ctx, "srv", "server", &[("rdma UPGRADED", 3)])
}
