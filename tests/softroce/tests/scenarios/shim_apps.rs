//! Unmodified programs under `libstreamshim.so` on real RDMA streams (the loop guest: the
//! server on rxea's address, the client's packets leave from rxeb across the veth): every byte
//! arrives, both ends count the connection `rdma UPGRADED`.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use rdma_streams_softroce::locate::workspace_root;
use rdma_streams_softroce::{Ctx, Scenario, Topology};

use super::support::{WAIT_PORT, expect_carried, expect_counts, file, python, shim, shimmed};

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "shim_app_signals_are_handled_on_the_apps_threads_only",
        topology: Topology::Loop,
        timeout: Duration::from_secs(120),
        run: signals,
    },
    Scenario {
        name: "shim_curl_python_http_100mb_both_ways",
        topology: Topology::Loop,
        timeout: Duration::from_secs(600),
        run: curl_http,
    },
    Scenario {
        name: "shim_iperf3_four_streams_and_reverse",
        topology: Topology::Loop,
        timeout: Duration::from_secs(300),
        run: iperf3,
    },
    Scenario {
        name: "shim_python_asyncio_echo",
        topology: Topology::Loop,
        timeout: Duration::from_secs(300),
        run: asyncio_echo,
    },
    Scenario {
        name: "shim_socat_file_transfer",
        topology: Topology::Loop,
        timeout: Duration::from_secs(300),
        run: socat,
    },
    Scenario {
        name: "shim_fortify_c_client_modes_and_fork_per_connection_server",
        topology: Topology::Loop,
        timeout: Duration::from_secs(600),
        run: c_client_modes,
    },
    Scenario {
        name: "shim_bytes_written_just_before_exit_arrive",
        topology: Topology::Loop,
        timeout: Duration::from_secs(300),
        run: exit_flush,
    },
    Scenario {
        name: "shim_qemu_live_migration_single_stream",
        topology: Topology::Loop,
        timeout: Duration::from_secs(600),
        run: qemu_single,
    },
    Scenario {
        name: "shim_qemu_live_migration_multifd",
        topology: Topology::Loop,
        timeout: Duration::from_secs(600),
        run: qemu_multifd,
    },
];

/// A file of `mib` MiB of random bytes in the scenario's tmpfs.
fn random_file(ctx: &Ctx, name: &str, mib: u32) -> anyhow::Result<String> {
    let p = ctx.tmp.join(name);
    ctx.sh(&format!(
        "head -c {} /dev/urandom > {}",
        u64::from(mib) << 20,
        p.display()
    ))?;
    Ok(p.display().to_string())
}

fn same(ctx: &Ctx, a: &str, b: &str) -> anyhow::Result<()> {
    ctx.sh(&format!("cmp {a} {b}")).map(drop)
}

pub const HTTP_SERVER: &str = include_str!("scripts/http_server.py");

/// `python3 -m http.server`'s handler serving 100 MB to curl, then curl uploading 100 MB.
fn curl_http(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let data = random_file(ctx, "data.bin", 100)?;
    let server = file(ctx, "server.py", HTTP_SERVER)?;
    let t = ctx.tmp.display();
    let srv = ctx.spawn(&format!(
        "{} {} {} {t} {a} 8000 2",
        shimmed(ctx, "srv", "")?,
        python(),
        server.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 8000"))?;
    let curl = shimmed(ctx, "cli", "")?;
    ctx.sh(&format!(
        "{curl} curl -sS --fail --max-time 240 -o {t}/got.bin http://{a}:8000/data.bin"
    ))?;
    same(ctx, &data, &format!("{t}/got.bin"))?;
    ctx.sh(&format!(
        "{curl} curl -sS --fail --max-time 240 -H 'Expect:' -T {data} http://{a}:8000/up.bin"
    ))?;
    ensure!(ctx.wait("server", srv)?.success(), "the HTTP server failed");
    same(ctx, &data, &format!("{t}/up.bin"))?;
    expect_counts(ctx, "cli", "client", &[("rdma UPGRADED", 2)])?;
    expect_counts(ctx, "srv", "server", &[("rdma UPGRADED", 2)])?;
    expect_carried(ctx, "srv", 100_000_000, true)
}

/// iperf3 with 4 parallel streams, then reversed: a control connection and 4 data connections
/// each time, all upgraded on both ends.
fn iperf3(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    for (tag, flags) in [("fwd", "-P 4"), ("rev", "-P 4 -R")] {
        let srv = ctx.spawn(&format!(
            "{} iperf3 -s -1 -B {a} -p 5201",
            shimmed(ctx, &format!("{tag}srv"), "")?
        ))?;
        ctx.sh(&format!("{WAIT_PORT} wait_port 5201"))?;
        let out = ctx.sh(&format!(
            "{} iperf3 -c {a} -p 5201 -t 3 {flags}",
            shimmed(ctx, &format!("{tag}cli"), "")?
        ))?;
        ensure!(out.stdout.contains("iperf Done."), "iperf3 did not finish");
        ensure!(
            ctx.wait("iperf3 server", srv)?.success(),
            "iperf3 server failed"
        );
        expect_counts(ctx, &format!("{tag}cli"), "client", &[("rdma UPGRADED", 5)])?;
        expect_counts(ctx, &format!("{tag}srv"), "server", &[("rdma UPGRADED", 5)])?;
    }
    Ok(())
}

const ECHO: &str = include_str!("scripts/asyncio_echo.py");

/// A Python asyncio echo of 16 MiB, both directions at once, `getpeername` as TCP's.
fn asyncio_echo(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let echo = file(ctx, "echo.py", ECHO)?;
    let py = python();
    let srv = ctx.spawn(&format!(
        "{} {py} {} server {a} 9000",
        shimmed(ctx, "srv", "")?,
        echo.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9000"))?;
    let out = ctx.sh(&format!(
        "{} {py} {} client {a} 9000",
        shimmed(ctx, "cli", "")?,
        echo.display()
    ))?;
    ensure!(out.stdout.contains("echo ok"), "no echo");
    ensure!(ctx.wait("server", srv)?.success(), "the echo server failed");
    expect_counts(ctx, "cli", "client", &[("rdma UPGRADED", 1)])?;
    expect_counts(ctx, "srv", "server", &[("rdma UPGRADED", 1)])
}

/// socat sends a file to a socat listener.
fn socat(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let t = ctx.tmp.display();
    let data = random_file(ctx, "data.bin", 32)?;
    let srv = ctx.spawn(&format!(
        "{} socat -u TCP-LISTEN:9200,bind={a},reuseaddr OPEN:{t}/got.bin,creat,trunc",
        shimmed(ctx, "srv", "")?
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9200"))?;
    ctx.sh(&format!(
        "{} socat -u OPEN:{data} TCP:{a}:9200",
        shimmed(ctx, "cli", "")?
    ))?;
    ensure!(
        ctx.wait("socat server", srv)?.success(),
        "socat server failed"
    );
    same(ctx, &data, &format!("{t}/got.bin"))?;
    expect_counts(ctx, "cli", "client", &[("rdma UPGRADED", 1)])?;
    expect_counts(ctx, "srv", "server", &[("rdma UPGRADED", 1)])
}

/// `shim/tests/programs/signals.c` under the shim: after a listen started the engine's
/// threads, a signal the main thread blocks waits for it; no thread of the shim's runs the
/// app's handler (nginx's master, which waits for `SIGCHLD` in `sigsuspend`, missed its last
/// worker's exit when one did).
fn signals(ctx: &Ctx) -> anyhow::Result<()> {
    let src = workspace_root().join("shim/tests/programs/signals.c");
    let bin = ctx.tmp.join("signals");
    ctx.sh(&format!(
        "gcc -O2 -Wall -o {} {}",
        bin.display(),
        src.display()
    ))?;
    let out = ctx.sh(&format!(
        "{} {} {} 9390",
        shimmed(ctx, "sig", "")?,
        bin.display(),
        ctx.addr_a
    ))?;
    ensure!(out.stdout.starts_with("ok:"), "{}", out.stdout);
    ctx.report(out.stdout.trim());
    Ok(())
}

/// Builds `shim/tests/programs/echo.c` with FORTIFY (reads become `__read_chk`).
fn build_echo(ctx: &Ctx) -> anyhow::Result<String> {
    let src = workspace_root().join("shim/tests/programs/echo.c");
    let out = ctx.tmp.join("echo");
    ctx.sh(&format!(
        "gcc -O2 -D_FORTIFY_SOURCE=2 -Wall -o {} {}",
        out.display(),
        src.display()
    ))?;
    Ok(out.display().to_string())
}

/// The FORTIFY C client moving its connected fd around (dup/dup2/dup3/F_DUPFD_CLOEXEC, MSG_PEEK,
/// SCM_RIGHTS to a forked child, exec) against a fork-per-connection server; sockets
/// registered with epoll before `connect()` (level-triggered and modified; edge-triggered and
/// never modified, as nginx's upstreams) upgrade, their registrations moved with the swap.
fn c_client_modes(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let echo = build_echo(ctx)?;
    let data = random_file(ctx, "data.bin", 8)?;
    let t = ctx.tmp.display();
    let modes = ["plain", "dup", "peek", "scm", "exec", "epoll", "epollet"];
    let srv_err = ctx.tmp.join("server.err");
    let srv = ctx.spawn(&format!(
        "{} {echo} server 9300 {} 2> {}",
        shimmed(ctx, "srv", "")?,
        modes.len(),
        srv_err.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9300"))?;
    for mode in modes {
        let run = ctx
            .sh(&format!(
                "{} {echo} client {a} 9300 {data} {t}/out-{mode} {mode}",
                shimmed(ctx, &format!("cli{mode}"), "")?
            ))
            .and_then(|_| same(ctx, &data, &format!("{t}/out-{mode}")));
        if let Err(e) = run {
            let server = std::fs::read_to_string(&srv_err).unwrap_or_default();
            ctx.log(format_args!("the server's stderr so far:\n{server}"));
            return Err(e.context(format!("mode {mode}")));
        }
    }
    ensure!(
        ctx.wait("echo server", srv)?.success(),
        "the echo server failed"
    );
    for mode in modes {
        expect_counts(
            ctx,
            &format!("cli{mode}"),
            "client",
            &[("rdma UPGRADED", 1)],
        )?;
    }
    // The parent accepts (and counts); the forked children echo on the upgraded fds.
    expect_counts(
        ctx,
        "srv",
        "server",
        &[("rdma UPGRADED", u64::try_from(modes.len())?)],
    )
}

/// A sink that reads nothing for `delay` seconds after its accept, then reads slowly (16 KiB
/// every 2 ms) into a file until EOF.
const SLOW_SINK: &str = include_str!("scripts/slow_sink.py");

/// A client that writes 8 MiB and calls `exit(0)` at once (no close): the kernel would deliver
/// what a TCP socket holds after the process is gone; the shim's exit flush does the same. Once
/// to a sink that reads as fast as it can, once to one that reads nothing for 3 s and then
/// slowly, so that the client exits with its buffers full (the flush must wait for the reader).
/// The flush never stalls (the engine reads every app side once more when it starts, since the
/// app's direct writes leave its socketpair without an event), and the sinks read an orderly EOF
/// (a stream that failed would read as a reset).
fn exit_flush(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let echo = build_echo(ctx)?;
    let data = random_file(ctx, "data.bin", 8)?;
    let t = ctx.tmp.display();
    let srv = ctx.spawn(&format!(
        "{} {echo} sink 9310 {t}/got.bin",
        shimmed(ctx, "srv", "")?
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9310"))?;
    let fast = ctx.sh(&format!(
        "{} {echo} client {a} 9310 {data} - blast",
        shimmed(ctx, "cli", "")?
    ))?;
    ensure!(ctx.wait("sink", srv)?.success(), "the sink failed");
    ensure!(
        !fast.stderr.contains("could not deliver"),
        "the exit flush stalled: {}",
        fast.stderr
    );
    same(ctx, &data, &format!("{t}/got.bin"))?;
    expect_counts(ctx, "cli", "client", &[("rdma UPGRADED", 1)])?;
    expect_counts(ctx, "srv", "server", &[("rdma UPGRADED", 1)])?;

    let sink = file(ctx, "slow_sink.py", SLOW_SINK)?;
    let slow = ctx.spawn(&format!(
        "{} {} {} {a} 9311 {t}/slow.bin 3",
        shimmed(ctx, "slowsrv", "")?,
        python(),
        sink.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9311"))?;
    let out = ctx.sh(&format!(
        "start=$EPOCHREALTIME; {} {echo} client {a} 9311 {data} - blast; \
         awk -v a=$start -v b=$EPOCHREALTIME 'BEGIN {{ printf \"client exited after %.2f s\", b - a }}'",
        shimmed(ctx, "slowcli", "")?
    ))?;
    ensure!(
        ctx.wait("slow sink", slow)?.success(),
        "the slow sink failed"
    );
    same(ctx, &data, &format!("{t}/slow.bin"))?;
    ensure!(
        !out.stderr.contains("could not deliver"),
        "the exit flush stalled: {}",
        out.stderr
    );
    ctx.report(format_args!(
        "to a slow reader: {}, every byte arrived",
        out.stdout.lines().last().unwrap_or_default()
    ));
    expect_counts(ctx, "slowcli", "client", &[("rdma UPGRADED", 1)])?;
    expect_counts(ctx, "slowsrv", "server", &[("rdma UPGRADED", 1)])
}

/// The QEMU migration driver (`tests/tools/qemu_migrate.py`).
fn qemu_tool() -> String {
    workspace_root()
        .join("tests/tools/qemu_migrate.py")
        .display()
        .to_string()
}

fn qemu(ctx: &Ctx, multifd: u32) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let t = ctx.tmp.display();
    let shim = shim()?;
    let out = ctx.sh(&format!(
        "{} {} --workdir {t}/run --ram-mib 128 --port 4444 --listen tcp:{a}:4444 \
         --multifd {multifd} --timeout 400 \
         --env LD_PRELOAD={} --env STREAMSHIM_NEGOTIATE_MS=5000 --env STREAMSHIM_LOG=info \
         --src-env STREAMSHIM_STATS={t}/src-%p.json --dst-env STREAMSHIM_STATS={t}/dst-%p.json",
        python(),
        qemu_tool(),
        shim.display()
    ))?;
    let line = out.stdout.lines().last().unwrap_or_default();
    let r: serde_json::Value =
        serde_json::from_str(line).with_context(|| format!("result {line}"))?;
    ensure!(r["status"] == "completed", "migration {r}");
    ensure!(r["ram_match"] == true, "RAM differs: {r}");
    let channels = u64::from(multifd) + 1;
    expect_counts(ctx, "src", "client", &[("rdma UPGRADED", channels)])?;
    expect_counts(ctx, "dst", "server", &[("rdma UPGRADED", channels)])?;
    expect_carried(ctx, "src", 128 << 20, false)
}

/// QEMU live migration (128 MiB of random RAM), single stream, both QEMUs under the shim.
fn qemu_single(ctx: &Ctx) -> anyhow::Result<()> {
    qemu(ctx, 0)
}

/// The same with 4 multifd channels (QEMU 7.2: the main channel is accepted first, then the
/// channels).
fn qemu_multifd(ctx: &Ctx) -> anyhow::Result<()> {
    qemu(ctx, 4)
}
