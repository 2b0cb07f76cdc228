//! Pinned memory that follows the streams' traffic (`docs/shim.md`, "Costs and bounds"): a
//! stream starts on its 64 KiB start rings, moves to its busy rings while it is busy and back
//! once it is idle, on the real stack.
//!
//! - One connection busy, idle, busy, idle: both processes' `VmPin` is large while it is busy
//!   and back to the start rings' after it idled, twice; every byte sha256-exact.
//! - PostgreSQL 15 as a pod without `CAP_IPC_LOCK` runs it: a non-root postmaster and
//!   `pgbench` under a 64 MiB `RLIMIT_MEMLOCK`, both under `libstreamshim.so`. The backends
//!   are fork children of the postmaster, so its engine holds every stream. With 64 clients at
//!   once every connection upgrades, where fixed 2 MiB rings (4168 KiB counted each) leave
//!   room for 15 under this limit. The pinned memory of the postmaster and of `pgbench` is reported
//!   before, at its largest during, and after the run.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use rdma_streams_softroce::{Ctx, Scenario, Topology};

use super::shim_faults::ECHO_SERVER;
use super::support::{WAIT_PORT, counts, expect_counts, file, footprint, python, shimmed, stats};

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "shim_busy_stream_moves_to_busy_rings_and_back_when_idle",
        topology: Topology::Loop,
        timeout: Duration::from_secs(300),
        run: phases,
    },
    Scenario {
        name: "shim_postgres_pgbench_64_clients_under_a_64_mib_memlock",
        topology: Topology::Loop,
        timeout: Duration::from_secs(900),
        run: pgbench,
    },
];

/// Pinned by a process with one busy stream (KiB): its busy receive ring and busy send ring
/// (2 MiB each) at least.
const BUSY_KIB: u64 = 4096;
/// Pinned by a process with one idle stream (KiB): its start rings and control slots (136 KiB
/// registered) and nothing else.
const IDLE_KIB: u64 = 200;

/// `scripts/ring_phases.py` against a shimmed echo server: busy, idle, busy, idle.
fn phases(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let py = python();
    let server = file(ctx, "echo_server.py", ECHO_SERVER)?;
    let client = file(
        ctx,
        "ring_phases.py",
        include_str!("scripts/ring_phases.py"),
    )?;
    let srv = ctx.spawn(&format!(
        "exec {} {py} {} {a} 9775 1 0",
        shimmed(ctx, "srv", "")?,
        server.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9775"))?;
    let out = ctx.sh(&format!(
        "{} {py} {} {a} 9775 {}",
        shimmed(ctx, "cli", "")?,
        client.display(),
        srv.pid()
    ))?;
    ensure!(ctx.wait("server", srv)?.success(), "the server failed");
    ensure!(out.stdout.contains("phases ok"), "{}", out.stdout);
    ctx.report(format_args!(
        "VmPin (KiB): {}",
        out.stdout
            .lines()
            .filter(|l| l.starts_with("busy") || l.starts_with("idle"))
            .collect::<Vec<_>>()
            .join("; ")
    ));
    for line in out.stdout.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let [phase, n, "client", client, "server", server] = words[..] else {
            continue;
        };
        let (client, server): (u64, u64) = (client.parse()?, server.parse()?);
        match phase {
            "busy" => ensure!(
                client >= BUSY_KIB && server >= BUSY_KIB,
                "busy phase {n}: VmPin client {client} KiB, server {server} KiB: no busy rings"
            ),
            _ => ensure!(
                client <= IDLE_KIB && server <= IDLE_KIB,
                "idle phase {n}: VmPin client {client} KiB, server {server} KiB: busy rings kept"
            ),
        }
    }
    expect_counts(ctx, "cli", "client", &[("rdma UPGRADED", 1)])?;
    expect_counts(ctx, "srv", "server", &[("rdma UPGRADED", 1)])?;
    // The stats files say the same: a busy stream's count (start part, allowance, both busy
    // rings: 4296 KiB).
    for tag in ["cli", "srv"] {
        let peaks: Vec<u64> = stats(ctx, tag)?
            .values()
            .map(|v| v["pinned_peak"].as_u64().unwrap_or(0))
            .collect();
        ensure!(
            peaks == [4296 << 10],
            "{tag}: pinned_peak {peaks:?}, not one busy stream's 4296 KiB"
        );
    }
    Ok(())
}

const PORT: u16 = 9770;
const CLIENTS: u64 = 64;
const TRANSACTIONS: u64 = 10;
/// The memlock limit of a pod without `CAP_IPC_LOCK` that was given 64 MiB.
const MEMLOCK: u64 = 64 << 20;
/// The most the postmaster may pin with 64 streams of a light load: 256 KiB each, and room
/// for two streams on their busy rings (`pgbench -i`'s load, or a busy moment).
const PINNED_BOUND: u64 = CLIENTS * (256 << 10) + 2 * (4296 << 10);

fn pgbench(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let t = ctx.tmp.display().to_string();
    let pg = "/usr/lib/postgresql/15/bin";
    // A pod's process: not root, no capabilities, a memlock limit.
    let pod = format!(
        "prlimit --memlock={MEMLOCK}:{MEMLOCK} setpriv --reuid=postgres --regid=postgres \
         --init-groups --inh-caps=-all --bounding-set=-all --"
    );
    ctx.sh(&format!(
        "chmod 1777 {t} && install -d -o postgres -g postgres {t}/pgdata && \
         {pod} {pg}/initdb -D {t}/pgdata -U postgres -A trust --no-sync >/dev/null && \
         echo 'host all all {a}/16 trust' >> {t}/pgdata/pg_hba.conf"
    ))?;
    let srv = ctx.spawn(&format!(
        "exec {pod} {} {pg}/postgres -D {t}/pgdata -k {t} -c listen_addresses={a} -p {PORT} \
         -c max_connections=100 -c fsync=off -c shared_buffers=16MB",
        shimmed(ctx, "pg", "")?
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port {PORT}"))?;
    let conn = format!("-h {a} -p {PORT} -U postgres postgres");
    ctx.sh(&format!(
        "{pod} {} {pg}/pgbench -i -q -s 1 {conn}",
        shimmed(ctx, "init", "")?
    ))?;
    let postmaster: u32 = std::fs::read_to_string(format!("{t}/pgdata/postmaster.pid"))?
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .context("no postmaster pid")?;
    let pinned = |pid| footprint(pid).map_or(0, |(pin, _)| pin);
    let before = pinned(postmaster);
    // The run, with the postmaster's and pgbench's VmPin sampled while it lasts (`prlimit`,
    // `setpriv` and `env` exec, so the pid is pgbench's).
    let mut bench = ctx.spawn(&format!(
        "exec {pod} {} {pg}/pgbench -c {CLIENTS} -j 2 -t {TRANSACTIONS} -n {conn}",
        shimmed(ctx, "bench", "")?
    ))?;
    let mut peaks = [0u64; 2];
    while bench.is_running() {
        peaks[0] = peaks[0].max(pinned(postmaster));
        peaks[1] = peaks[1].max(pinned(bench.pid()));
        std::thread::sleep(Duration::from_millis(200));
    }
    let text = ctx.wait("pgbench", bench)?.stdout;
    let processed = format!(
        "number of transactions actually processed: {0}/{0}",
        CLIENTS * TRANSACTIONS
    );
    ensure!(text.contains(&processed), "pgbench did not finish:\n{text}");
    ensure!(
        text.contains("number of failed transactions: 0"),
        "failed transactions:\n{text}"
    );
    // Idle for longer than the keepalive: busy rings are given back.
    std::thread::sleep(Duration::from_secs(7));
    let after = pinned(postmaster);
    let tps = text
        .lines()
        .find(|l| l.starts_with("tps"))
        .unwrap_or("tps ?");
    ctx.report(format_args!(
        "pgbench -c {CLIENTS} under a {} MiB memlock: {tps}; postmaster VmPin {} KiB before, \
         {} KiB at most during, {} KiB after; pgbench VmPin {} KiB at most",
        MEMLOCK >> 20,
        before >> 10,
        peaks[0] >> 10,
        after >> 10,
        peaks[1] >> 10
    ));
    ctx.sh(&format!("kill -INT {postmaster}"))?;
    ensure!(ctx.wait("postgres", srv)?.success(), "postgres failed");
    let client = counts(ctx, "bench", "client")?;
    ensure!(
        client.len() == 1 && client.get("rdma UPGRADED").is_some_and(|n| *n >= CLIENTS),
        "pgbench's connections: {client:?}"
    );
    let server = counts(ctx, "pg", "server")?;
    let init = counts(ctx, "init", "client")?;
    let all = client["rdma UPGRADED"] + init.get("rdma UPGRADED").copied().unwrap_or(0);
    ensure!(
        server.len() == 1 && server.get("rdma UPGRADED") == Some(&all),
        "the server's connections: {server:?}, its clients' {all}"
    );
    ensure!(
        peaks[0] <= PINNED_BOUND,
        "the postmaster pinned {} KiB with {CLIENTS} streams (bound {} KiB)",
        peaks[0] >> 10,
        PINNED_BOUND >> 10
    );
    Ok(())
}
