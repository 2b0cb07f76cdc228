//! Many connections: 1,000 short ones in a row (every one upgraded, nearly every one on the
//! queue pair of the one before it; open fds, threads and pinned memory of both processes back
//! where they were), and 64 at once, each checked with
//! sha256, with part of their bytes read straight from the rings (direct reads), then 8 with
//! direct reads off.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use rdma_streams_softroce::{Ctx, Scenario, Topology};
use serde_json::Value;

use super::support::{
    WAIT_PORT, direct_bytes, expect_counts, file, python, sent_before_move, shimmed, stats,
};

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "shim_1000_short_connections_leave_nothing_behind",
        topology: Topology::Loop,
        timeout: Duration::from_secs(1200),
        run: churn,
    },
    Scenario {
        name: "shim_64_concurrent_connections_sha256",
        topology: Topology::Loop,
        timeout: Duration::from_secs(600),
        run: concurrent,
    },
];

/// A single-threaded (selectors) echo server: echoes each connection until its EOF, then
/// closes it; exits after `n` connections. Its own resources are read by the client through
/// /proc.
const SERVER: &str = include_str!("scripts/churn_server.py");

/// Makes `n` connections one after the other (each: a line out, the same line back, close),
/// after one warm-up connection and before a last one that ends the server; prints the
/// resources of itself and of the server before the run and after it, as JSON.
const CLIENT: &str = include_str!("scripts/churn_client.py");

fn churn(ctx: &Ctx) -> anyhow::Result<()> {
    const N: u32 = 1000;
    let a = ctx.addr_a;
    let py = python();
    let server = file(ctx, "server.py", SERVER)?;
    let client = file(ctx, "client.py", CLIENT)?;
    let srv = ctx.spawn(&format!(
        "exec {} {py} {} {a} 9400 {}",
        shimmed(ctx, "srv", "")?,
        server.display(),
        N + 2
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9400"))?;
    let pid = srv.pid();
    let out = ctx.sh(&format!(
        "{} {py} {} {a} 9400 {N} {pid}",
        shimmed(ctx, "cli", "")?,
        client.display()
    ))?;
    ensure!(ctx.wait("server", srv)?.success(), "the echo server failed");
    let line = out.stdout.lines().last().unwrap_or_default();
    let r: Value = serde_json::from_str(line).with_context(|| format!("client said {line}"))?;
    ctx.report(format_args!(
        "{N} connections in {:.1} s: {}",
        r["seconds"].as_f64().unwrap_or(0.0),
        r
    ));
    for who in ["client", "server"] {
        let (before, after) = (&r["before"][who], &r["after"][who]);
        ensure!(
            before["fds"] == after["fds"],
            "{who}: open fds {} before, {} after {N} connections",
            before["fds"],
            after["fds"]
        );
        ensure!(
            before["threads"] == after["threads"],
            "{who}: threads {} before, {} after",
            before["threads"],
            after["threads"]
        );
        ensure!(
            after["vmpin_kib"] == r["start"][who]["vmpin_kib"],
            "{who}: pinned {} KiB after, {} KiB at the start",
            after["vmpin_kib"],
            r["start"][who]["vmpin_kib"]
        );
    }
    expect_counts(ctx, "cli", "client", &[("rdma UPGRADED", u64::from(N) + 2)])?;
    // Connections in a row take the spare the one before made (the first of the run finds
    // the warm-up's spare aged out while the counts settled).
    let taken: u64 = stats(ctx, "cli")?
        .values()
        .map(|v| v["spare_connects"].as_u64().unwrap_or(0))
        .sum();
    ctx.report(format_args!("{taken} of {N} connects took a spare"));
    ensure!(
        taken >= u64::from(N) * 9 / 10,
        "only {taken} of {N} connects took a spare connection"
    );
    // And those spares are the finished connections' queue pairs, not connect requests of
    // their own (docs/shim-protocol.md, "Reused connections"): each side counts them.
    for (prefix, who) in [("cli", "client"), ("srv", "server")] {
        let reused: u64 = stats(ctx, prefix)?
            .values()
            .map(|v| v["reused_links"].as_u64().unwrap_or(0))
            .sum();
        ctx.report(format_args!(
            "{who}: {reused} connections reused a queue pair"
        ));
        ensure!(
            reused >= u64::from(N) * 9 / 10,
            "{who}: only {reused} of {N} connections reused a finished one's queue pair"
        );
    }
    expect_counts(ctx, "srv", "server", &[("rdma UPGRADED", u64::from(N) + 2)])
}

/// 64 threads, each its own connection to a thread-per-connection echo server, 2 MiB of random
/// bytes each way, checked with sha256 on arrival. The server reads with `MSG_WAITALL` when its
/// fifth argument says `waitall` (64 KiB at a time: 2 MiB is 32 of them), the client with plain
/// `recv`.
const CONCURRENT: &str = include_str!("scripts/concurrent.py");

/// 64 echo connections at once from one threaded client to one threaded server (reading with
/// MSG_WAITALL), 2 MiB each way each, sha256-checked; then 8 with the client's direct reads and
/// writes off; then 8 whose client sends from the connect on with `sendmsg` and `writev`.
fn concurrent(ctx: &Ctx) -> anyhow::Result<()> {
    const N: u64 = 64;
    // The client connects one after another (see the program), each within the largest
    // negotiation bound the shim takes, then moves all 64 streams at once.
    let run = EchoRun {
        tags: ("srv", "cli"),
        port: 9500,
        n: N,
        modes: ("waitall", ""),
        ..EchoRun::default()
    };
    run.run(ctx)?;
    expect_counts(ctx, "srv", "server", &[("rdma UPGRADED", N)])?;
    // 128 MiB each way over 64 streams read 64 KiB at a time (the server's with MSG_WAITALL)
    // and written with sendall: both sides' reads took part of it straight from the receive
    // rings and their writes put part of it straight into the send rings, and the sha256s above
    // say in order.
    let (cli, srv) = (direct_bytes(ctx, "cli")?, direct_bytes(ctx, "srv")?);
    ctx.report(format_args!(
        "direct reads: client {} bytes, server {} bytes; direct writes: client {} bytes, \
         server {} bytes; of {} each",
        cli.0,
        srv.0,
        cli.1,
        srv.1,
        N * (2 << 20)
    ));
    ensure!(
        cli.0 > 0 && srv.0 > 0,
        "no direct read: client {}, server {} bytes",
        cli.0,
        srv.0
    );
    ensure!(
        cli.1 > 0 && srv.1 > 0,
        "no direct write: client {}, server {} bytes",
        cli.1,
        srv.1
    );

    // The same with direct reads and writes off on the client: every byte through its
    // socketpairs.
    let off = EchoRun {
        tags: ("srvoff", "clioff"),
        port: 9501,
        n: 8,
        client_env: "STREAMSHIM_DIRECT_READ=0 STREAMSHIM_DIRECT_WRITE=0",
        ..EchoRun::default()
    };
    off.run(ctx)?;
    let off = direct_bytes(ctx, "clioff")?;
    ensure!(
        off == (0, 0),
        "STREAMSHIM_DIRECT_READ=0 STREAMSHIM_DIRECT_WRITE=0, yet {} bytes were read and {} \
         written directly",
        off.0,
        off.1
    );

    // Each client thread connects and sends at once, with sendmsg and writev of three buffers
    // in turn: its first bytes go on the TCP connection from its own thread (the kept socket
    // takes what fits, the socketpair the rest), then on the stream; the sha256s say every
    // byte came once and in order.
    let vectored = EchoRun {
        tags: ("srvvec", "clivec"),
        port: 9502,
        n: 8,
        modes: ("", "vectored"),
        ..EchoRun::default()
    };
    vectored.run(ctx)?;
    let early = sent_before_move(ctx, "clivec")?;
    ctx.report(format_args!(
        "vectored sends: {} bytes before the move, {} of them sent by the app's threads",
        early.0, early.1
    ));
    ensure!(
        early.1 > 0,
        "no byte of a sendmsg or writev went on the TCP connection from the app's thread"
    );
    Ok(())
}

/// One run of concurrent.py: its echo server and client, both shimmed, `n` connections on
/// `port`; the client's connections must all upgrade.
#[derive(Default)]
struct EchoRun {
    /// The server's and the client's stats tags.
    tags: (&'static str, &'static str),
    port: u16,
    n: u64,
    /// The server's and the client's last argument (`waitall`, `vectored` or none).
    modes: (&'static str, &'static str),
    /// Settings for the client's shim beside its 10 s negotiation bound.
    client_env: &'static str,
}

impl EchoRun {
    fn run(&self, ctx: &Ctx) -> anyhow::Result<()> {
        let (a, py) = (ctx.addr_a, python());
        let prog = file(ctx, "concurrent.py", CONCURRENT)?;
        let (port, n) = (self.port, self.n);
        let srv = ctx.spawn(&format!(
            "{} {py} {} server {a} {port} {n} {}",
            shimmed(ctx, self.tags.0, "")?,
            prog.display(),
            self.modes.0
        ))?;
        ctx.sh(&format!("{WAIT_PORT} wait_port {port}"))?;
        let env = format!("STREAMSHIM_NEGOTIATE_MS=10000 {}", self.client_env);
        ctx.sh(&format!(
            "{} {py} {} client {a} {port} {n} {}",
            shimmed(ctx, self.tags.1, env.trim_end())?,
            prog.display(),
            self.modes.1
        ))?;
        ensure!(ctx.wait("server", srv)?.success(), "the echo server failed");
        expect_counts(ctx, self.tags.1, "client", &[("rdma UPGRADED", n)])
    }
}
