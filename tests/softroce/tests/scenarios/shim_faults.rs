//! What goes wrong, on a real RDMA stack: a peer killed mid-stream, a peer whose node is gone,
//! a one-sided shim, no device, a memlock limit too low for one connection or for the next, a
//! server that stalls before accepting, a pre-fork server (which upgrades in its children),
//! and an RDMA program on the same port. Each ends with its stated reason (or a reader that sees a reset within a bound),
//! never a hang, and the bytes that were delivered are the right ones.

use std::thread;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use rdma_streams_softroce::{Ctx, Scenario, Topology};

use super::support::{
    WAIT_PORT, expect_counts, file, interface_of, python, shim, shimmed, wait_line,
};

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "shim_peer_killed_mid_stream_ends_the_reader",
        topology: Topology::Loop,
        timeout: Duration::from_secs(300),
        run: peer_killed,
    },
    Scenario {
        name: "shim_peer_node_gone_ends_the_reader_within_the_keepalive_bound",
        topology: Topology::Loop,
        timeout: Duration::from_secs(300),
        run: node_gone,
    },
    Scenario {
        name: "shim_one_sided_shim_stays_tcp_at_once",
        topology: Topology::Loop,
        timeout: Duration::from_secs(300),
        run: one_sided,
    },
    Scenario {
        name: "shim_memlock_too_low_falls_back_per_process_and_per_connection",
        topology: Topology::Loop,
        timeout: Duration::from_secs(300),
        run: memlock,
    },
    Scenario {
        name: "shim_server_stalling_before_accept_costs_one_bound",
        topology: Topology::Loop,
        timeout: Duration::from_secs(300),
        run: stalled_server,
    },
    Scenario {
        name: "shim_prefork_server_upgrades_in_its_children",
        topology: Topology::Loop,
        timeout: Duration::from_secs(300),
        run: prefork,
    },
    Scenario {
        name: "shim_rdma_program_on_the_same_port_keeps_working",
        topology: Topology::Loop,
        timeout: Duration::from_secs(300),
        run: port_in_use,
    },
    Scenario {
        name: "shim_policy_refusal_and_loopback",
        topology: Topology::Loop,
        timeout: Duration::from_secs(300),
        run: policy,
    },
    Scenario {
        name: "shim_service_vip_behind_dnat_stays_tcp_with_its_reason",
        topology: Topology::Loop,
        timeout: Duration::from_secs(180),
        run: service_vip,
    },
    Scenario {
        name: "shim_no_device_passes_through",
        topology: Topology::Loop,
        timeout: Duration::from_secs(120),
        run: no_device,
    },
];

/// Streams until killed (server) or reads until EOF or an error, reporting when it ended
/// (client); or the other way round with `up`: the client writes, the server reads.
const STREAM: &str = include_str!("scripts/stream.py");

/// The time in the first line starting with `word` of `out`.
fn when(out: &str, word: &str) -> Option<f64> {
    out.lines()
        .find(|l| l.starts_with(word))?
        .split_whitespace()
        .find_map(|w| w.parse::<f64>().ok().filter(|t| *t > 1e9))
}

/// The reader's `ended ...` line.
fn ended_line(text: &str) -> &str {
    text.lines()
        .find(|l| l.starts_with("ended"))
        .unwrap_or_default()
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// kill -9 of the writing peer, both ways round: the reader sees a reset within 5 s (the dying
/// process's kernel disconnects its RDMA connections at once; what the dead writer had not
/// posted is lost, so the end is never an orderly EOF).
fn peer_killed(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let py = python();
    let prog = file(ctx, "stream.py", STREAM)?;
    for (i, (writer, reader)) in [
        ("server-write", "client-read"),
        ("client-write", "server-read"),
    ]
    .into_iter()
    .enumerate()
    {
        let port = 9600 + i;
        let (server_mode, client_mode) = if writer.starts_with("server") {
            (writer, reader)
        } else {
            (reader, writer)
        };
        let srv_out = ctx.tmp.join(format!("srv{i}.out"));
        let cli_out = ctx.tmp.join(format!("cli{i}.out"));
        let srv = ctx.spawn(&format!(
            "exec {} {py} {} {server_mode} {a} {port} > {}",
            shimmed(ctx, &format!("srv{i}"), "")?,
            prog.display(),
            srv_out.display()
        ))?;
        ctx.sh(&format!("{WAIT_PORT} wait_port {port}"))?;
        let cli = ctx.spawn(&format!(
            "exec {} {py} {} {client_mode} {a} {port} > {}",
            shimmed(ctx, &format!("cli{i}"), "")?,
            prog.display(),
            cli_out.display()
        ))?;
        let (reader_out, writer_pid) = if writer.starts_with("server") {
            (&cli_out, srv.pid())
        } else {
            (&srv_out, cli.pid())
        };
        wait_line(ctx, reader_out, "flowing", Duration::from_secs(120))?;
        let killed = now();
        ctx.sh(&format!("kill -9 {writer_pid}"))?;
        let text = wait_line(ctx, reader_out, "ended", Duration::from_secs(30))?;
        let ended = when(&text, "ended").context("no time")?;
        let text = ended_line(&text);
        ctx.report(format_args!(
            "{reader}: {text} ({:.2} s after the kill)",
            ended - killed
        ));
        ensure!(
            ended - killed < 5.0,
            "the reader saw the end {:.1} s after the kill",
            ended - killed
        );
        ensure!(
            text.contains("ConnectionResetError"),
            "{reader}: a broken stream must read as a reset, not as `{text}`"
        );
        drop((srv, cli));
    }
    Ok(())
}

/// The writing peer stopped (SIGSTOP) and every RoCE packet to and from its side dropped: no
/// disconnect ever comes. The reader's engine probes after 5 s of silence; the probe's
/// retries run out (7 tries of the 1.07 s ACK timeout, about 12.5 s in all) and the stream
/// fails: the reader sees a reset within 15 s of the cut.
fn node_gone(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let py = python();
    let prog = file(ctx, "stream.py", STREAM)?;
    let srv_out = ctx.tmp.join("srv.out");
    let cli_out = ctx.tmp.join("cli.out");
    let srv = ctx.spawn(&format!(
        "exec {} {py} {} server-write {a} 9610 > {}",
        shimmed(ctx, "srv", "")?,
        prog.display(),
        srv_out.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9610"))?;
    let _cli = ctx.spawn(&format!(
        "exec {} {py} {} client-read {a} 9610 > {}",
        shimmed(ctx, "cli", "")?,
        prog.display(),
        cli_out.display()
    ))?;
    wait_line(ctx, &cli_out, "flowing", Duration::from_secs(120))?;
    // The server's node "goes away": its process stops and its device answers nothing.
    ctx.sh(&format!(
        "kill -STOP {} && nft add table inet gone && \
         nft add chain inet gone in '{{ type filter hook input priority 0; }}' && \
         nft add rule inet gone in ip saddr {a} udp dport 4791 drop && \
         nft add rule inet gone in ip daddr {a} udp dport 4791 drop",
        srv.pid()
    ))?;
    let cut = now();
    let result = wait_line(ctx, &cli_out, "ended", Duration::from_secs(60));
    let _ = ctx.bash(&format!(
        "nft delete table inet gone; kill -9 {}",
        srv.pid()
    ));
    let text = result?;
    let ended = when(&text, "ended").context("no time")?;
    let text = ended_line(&text);
    ctx.report(format_args!(
        "reader: {text} ({:.2} s after the cut)",
        ended - cut
    ));
    ensure!(
        ended - cut < 15.0,
        "the reader saw the end {:.1} s after the cut",
        ended - cut
    );
    ensure!(
        text.contains("ConnectionResetError"),
        "a broken stream must read as a reset, not as `{text}`"
    );
    Ok(())
}

pub const ECHO_SERVER: &str = include_str!("scripts/echo_server.py");

/// A thread-per-connection echo server for `n` connections.
const THREADED_ECHO: &str = include_str!("scripts/threaded_echo.py");

/// One connection: 256 KiB out and back, byte-exact; prints how long `connect()` took (the
/// first one of the process: it includes starting the shim's engine).
pub const ECHO_CLIENT: &str = include_str!("scripts/echo_client.py");

fn connect_seconds(out: &str) -> f64 {
    out.split_whitespace()
        .skip_while(|w| *w != "connect_s")
        .nth(1)
        .and_then(|w| w.parse().ok())
        .unwrap_or(f64::MAX)
}

/// A shimmed client and a plain server (nothing listens on the RDMA side: the CM rejects at
/// once), and a plain client to a shimmed server (nothing to claim, no wait).
fn one_sided(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let py = python();
    let server = file(ctx, "server.py", ECHO_SERVER)?;
    let client = file(ctx, "client.py", ECHO_CLIENT)?;
    let srv = ctx.spawn(&format!("{py} {} {a} 9700 1 0", server.display()))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9700"))?;
    let out = ctx.sh(&format!(
        "{} {py} {} {a} 9700",
        shimmed(ctx, "cli", "")?,
        client.display()
    ))?;
    ensure!(ctx.wait("server", srv)?.success(), "plain server failed");
    let t = connect_seconds(&out.stdout);
    ctx.report(format_args!(
        "a shimmed client's connect to a plain server: {t:.3} s"
    ));
    ensure!(
        t < 2.0,
        "a shimmed client's connect to a plain server took {t:.2} s"
    );
    expect_counts(ctx, "cli", "client", &[("tcp PEER_NOT_SHIMMED", 1)])?;

    let srv = ctx.spawn(&format!(
        "{} {py} {} {a} 9701 1 0",
        shimmed(ctx, "srv", "")?,
        server.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9701"))?;
    let out = ctx.sh(&format!("{py} {} {a} 9701", client.display()))?;
    ensure!(ctx.wait("server", srv)?.success(), "shimmed server failed");
    ensure!(out.stdout.contains("echo ok"), "no echo");
    expect_counts(ctx, "srv", "server", &[("tcp PEER_NOT_SHIMMED", 1)])
}

/// A Kubernetes Service's virtual IP as kube-proxy programs it: nftables DNAT of the VIP and
/// port to a server's own address and port (here in the output hook of the client's network
/// namespace, as for a client on the node; a pod's connection is translated the same way on
/// its node), the VIP routed out of the client's RDMA-capable interface, and another out of an
/// interface without RDMA (both from the client's address on the RDMA-capable one): the RDMA
/// connect to the VIP, which only the kernel's NAT knows, waits for an address that never
/// answers. Three connections of a shimmed client to each, at the default negotiation bound,
/// to a shimmed server behind them: byte-exact over TCP; the first costs one bound
/// (`TIMEOUT`), the next two none (`NEGATIVE_CACHE`); the server counts them
/// `PEER_NOT_SHIMMED`. A client told the Service CIDR upgrades through the backend
/// (`shim_wire_service_vip_upgrades_through_the_backend`, on two guests: here the translated
/// connection would pass the one network namespace's connection tracking twice, whose second
/// entry moves the client's port).
fn service_vip(ctx: &Ctx) -> anyhow::Result<()> {
    // Routed out of b's interface (rxeb's netdev), and out of a dummy one without RDMA.
    const VIP: &str = "10.96.0.10";
    const PLAIN_VIP: &str = "10.96.0.11";
    let (a, b) = (ctx.addr_a, ctx.addr_b);
    let netdev = interface_of(ctx, b)?;
    ctx.sh(&format!(
        "ip route replace {VIP}/32 dev {netdev} src {b} && \
         ip link add svc0 type dummy && ip addr add 10.97.0.1/24 dev svc0 && \
         ip link set svc0 up && ip route replace {PLAIN_VIP}/32 dev svc0 src {b} && \
         nft add table ip svc && \
         nft add chain ip svc out '{{ type nat hook output priority -100; }}' && \
         nft add rule ip svc out ip daddr {{ {VIP}, {PLAIN_VIP} }} tcp dport 80 \
         dnat to {a}:9790"
    ))?;
    let negotiated = [("tcp TIMEOUT", 1), ("tcp NEGATIVE_CACHE", 2)];
    let result = service_vip_clients(ctx, VIP, "v0", "", &negotiated)
        .and_then(|()| service_vip_clients(ctx, PLAIN_VIP, "v1", "", &negotiated));
    let cleanup = ctx.sh(&format!(
        "nft delete table ip svc; ip route del {VIP}/32 dev {netdev}; ip link del svc0; true"
    ));
    result.and(cleanup.map(|_| ()))
}

/// Three connections of a shimmed client (with `extra` in its environment) to `vip`, counted
/// as `expect` says (its stats and its server's tagged by `tag`).
fn service_vip_clients(
    ctx: &Ctx,
    vip: &str,
    tag: &str,
    extra: &str,
    expect: &[(&str, u64)],
) -> anyhow::Result<()> {
    const BOUND_MS: u64 = 200;
    let a = ctx.addr_a;
    let py = python();
    let server = file(ctx, "server.py", ECHO_SERVER)?;
    let client = file(ctx, "client.py", ECHO_CLIENT)?;
    let srv = ctx.spawn(&format!(
        "{} {py} {} {a} 9790 3 0",
        shimmed(ctx, &format!("{tag}srv"), "")?,
        server.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9790"))?;
    let out = ctx.sh(&format!(
        "{} {py} {} {vip} 80 3",
        shimmed(
            ctx,
            &format!("{tag}cli"),
            &format!("STREAMSHIM_NEGOTIATE_MS={BOUND_MS} {extra}")
        )?,
        client.display()
    ))?;
    ensure!(ctx.wait("server", srv)?.success(), "the server failed");
    ctx.report(format_args!(
        "a shimmed client to the Service VIP {vip} (DNAT to a shimmed server), {BOUND_MS} ms \
         bound{}: {}",
        if extra.is_empty() {
            String::new()
        } else {
            format!(", {extra}")
        },
        out.stdout.trim()
    ));
    expect_counts(ctx, &format!("{tag}cli"), "client", expect)?;
    expect_counts(
        ctx,
        &format!("{tag}srv"),
        "server",
        &[("tcp PEER_NOT_SHIMMED", 3)],
    )
}

/// No RDMA device at all: the scenario removes the topology's rxe links (and puts them back
/// whatever happens). Both ends pass through with `NO_DEVICE` at once, byte-exact.
fn no_device(ctx: &Ctx) -> anyhow::Result<()> {
    let links = ctx.sh("rdma link show")?.stdout;
    let mut restore = Vec::new();
    for line in links.lines() {
        // "link rxea/1 state ACTIVE physical_state LINK_UP netdev va"
        let words: Vec<&str> = line.split_whitespace().collect();
        let dev = words.get(1).and_then(|d| d.split('/').next());
        let netdev = words
            .iter()
            .position(|w| *w == "netdev")
            .and_then(|i| words.get(i + 1));
        if let (Some(dev), Some(netdev)) = (dev, netdev) {
            restore.push(format!("rdma link add {dev} type rxe netdev {netdev}"));
        }
    }
    ensure!(!restore.is_empty(), "no rxe links to remove: {links}");
    let removed = ctx.sh("for l in $(rdma link show | awk '{print $2}' | cut -d/ -f1); do rdma link delete $l; done; ls /sys/class/infiniband | wc -l");
    let result = removed.and_then(|out| {
        ensure!(out.stdout.trim() == "0", "devices left: {}", out.stdout);
        no_device_run(ctx)
    });
    let restored = ctx.sh(&restore.join(" && "));
    result?;
    restored?;
    Ok(())
}

fn no_device_run(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let py = python();
    let server = file(ctx, "server.py", ECHO_SERVER)?;
    let client = file(ctx, "client.py", ECHO_CLIENT)?;
    let srv = ctx.spawn(&format!(
        "{} {py} {} {a} 9710 1 0",
        shimmed(ctx, "srv", "")?,
        server.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9710"))?;
    let out = ctx.sh(&format!(
        "{} {py} {} {a} 9710",
        shimmed(ctx, "cli", "")?,
        client.display()
    ))?;
    ensure!(ctx.wait("server", srv)?.success(), "server failed");
    ensure!(out.stdout.contains("echo ok"), "no echo");
    expect_counts(ctx, "cli", "client", &[("tcp NO_DEVICE", 1)])?;
    expect_counts(ctx, "srv", "server", &[("tcp NO_DEVICE", 1)])
}

/// RLIMIT_MEMLOCK of 64 KiB without CAP_IPC_LOCK: one connection's buffers do not fit, the
/// process passes through (`MEMLOCK`). A limit for two connections: the third concurrent one
/// falls back alone (`MEMLOCK`), its bytes intact.
fn memlock(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let py = python();
    let server = file(ctx, "server.py", ECHO_SERVER)?;
    let client = file(ctx, "client.py", ECHO_CLIENT)?;
    let drop_cap = "setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock --";
    let srv = ctx.spawn(&format!(
        "{} {py} {} {a} 9720 1 0",
        shimmed(ctx, "srv", "")?,
        server.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9720"))?;
    // Also a ring size that is not one: said once on stderr, the default used (and the default
    // does not fit 64 KiB either).
    let out = ctx.sh(&format!(
        "prlimit --memlock=65536:65536 {drop_cap} {} {py} {} {a} 9720",
        shimmed(ctx, "low", "STREAMSHIM_RING_KIB=1m")?,
        client.display()
    ))?;
    ensure!(ctx.wait("server", srv)?.success(), "server failed");
    expect_counts(ctx, "low", "client", &[("tcp MEMLOCK", 1)])?;
    let printed = format!("{}{}", out.stdout, out.stderr);
    let said = printed
        .lines()
        .filter(|l| l.contains("STREAMSHIM_RING_KIB=\"1m\" is not a ring size"))
        .count();
    ensure!(said == 1, "the bad ring size said {said} times:\n{printed}");

    // Three connections held open at once under a limit that fits two: a connection starts on
    // its 64 KiB start rings and pins 200 KiB (two rings, control slots and the queue
    // allowance). The client's busy rings are 256 KiB (`STREAMSHIM_RING_KIB`), the server's
    // the default 2 MiB: the two ends' rings differ in size, and neither fits a busy ring
    // under this limit, so the streams stay on their start rings.
    let three = file(
        ctx,
        "three.py",
        include_str!("scripts/three_connections.py"),
    )?;
    // A server that accepts the three at once (a sequential one would not claim the second
    // while it serves the first: the client would count TIMEOUT, rightly).
    let threaded = file(ctx, "threaded.py", THREADED_ECHO)?;
    let srv = ctx.spawn(&format!(
        "{} {py} {} {a} 9721 3",
        shimmed(ctx, "srv3", "")?,
        threaded.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9721"))?;
    let out = ctx.sh(&format!(
        "prlimit --memlock=450000:450000 {drop_cap} {} {py} {} {a} 9721",
        shimmed(ctx, "two", "STREAMSHIM_RING_KIB=256")?,
        three.display()
    ))?;
    ensure!(out.stdout.contains("three ok"), "no echo");
    ensure!(ctx.wait("server", srv)?.success(), "server failed");
    expect_counts(
        ctx,
        "two",
        "client",
        &[("rdma UPGRADED", 2), ("tcp MEMLOCK", 1)],
    )
}

/// The server listens but accepts 12 s late: the client, with a 300 ms bound, gets no CLAIM and
/// connects over TCP after at most two bounds (`TIMEOUT`); the late accept finds the client's
/// abandoned registration and stays TCP too (`TIMEOUT`). Bytes are intact.
fn stalled_server(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let py = python();
    let server = file(ctx, "server.py", ECHO_SERVER)?;
    let client = file(ctx, "client.py", ECHO_CLIENT)?;
    let srv = ctx.spawn(&format!(
        "{} {py} {} {a} 9730 1 12",
        shimmed(ctx, "srv", "")?,
        server.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9730"))?;
    let out = ctx.sh(&format!(
        "{} {py} {} {a} 9730",
        shimmed(ctx, "cli", "STREAMSHIM_NEGOTIATE_MS=300")?,
        client.display()
    ))?;
    ensure!(ctx.wait("server", srv)?.success(), "server failed");
    let t = connect_seconds(&out.stdout);
    ensure!(t < 2.0, "connect() took {t:.2} s with a 300 ms bound");
    expect_counts(ctx, "cli", "client", &[("tcp TIMEOUT", 1)])?;
    expect_counts(ctx, "srv", "server", &[("tcp TIMEOUT", 1)])
}

/// A pre-fork server (`scripts/prefork.py`): socket/bind/listen in the parent, two forked
/// children that accept and echo, with one shared listening socket and with one `SO_REUSEPORT`
/// socket per child. The parent's engine holds every registration and runs every stream; a
/// child's accept hands the connection to it (`upgrade/delegate.rs`). Shimmed clients
/// upgrade and echo 256 KiB exactly; a plain client is served over TCP; a client killed
/// mid-connection reads as a reset in the child that accepted it. Each child's own connection
/// to a shimmed echo backend upgrades too (the parent's engine negotiates for it).
const PREFORK: &str = include_str!("scripts/prefork.py");
const HOLD_CLIENT: &str = include_str!("scripts/hold_client.py");

fn prefork(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let py = python();
    let server = file(ctx, "prefork.py", PREFORK)?;
    let client = file(ctx, "client.py", ECHO_CLIENT)?;
    let hold = file(ctx, "hold.py", HOLD_CLIENT)?;
    let echo = file(ctx, "echo_server.py", ECHO_SERVER)?;
    for (mode, tag, port) in [("shared", "pfs", 9740), ("reuseport", "pfr", 9741)] {
        let backend_port = port + 10;
        let backend = ctx.spawn(&format!(
            "{} {py} {} {a} {backend_port} 2 0",
            shimmed(ctx, &format!("{tag}b"), "")?,
            echo.display()
        ))?;
        ctx.sh(&format!("{WAIT_PORT} wait_port {backend_port}"))?;
        let stop = ctx.tmp.join(format!("{tag}.stop"));
        let srv = ctx.spawn(&format!(
            "{} {py} {} {a} {port} {mode} {backend_port} {} {}",
            shimmed(ctx, tag, "")?,
            server.display(),
            client.display(),
            stop.display()
        ))?;
        ctx.sh(&format!("{WAIT_PORT} wait_port {port}"))?;
        for i in 0..6 {
            let out = ctx.sh(&format!(
                "{} {py} {} {a} {port}",
                shimmed(ctx, &format!("{tag}c{i}"), "")?,
                client.display()
            ))?;
            ensure!(out.stdout.contains("echo ok"), "client {i}: {}", out.stdout);
            expect_counts(
                ctx,
                &format!("{tag}c{i}"),
                "client",
                &[("rdma UPGRADED", 1)],
            )?;
        }
        // A plain client (a kubelet probe, say): TCP, byte-exact.
        let out = ctx.sh(&format!("{py} {} {a} {port}", client.display()))?;
        ensure!(
            out.stdout.contains("echo ok"),
            "plain client: {}",
            out.stdout
        );
        // A client killed mid-connection.
        let held = ctx.tmp.join(format!("{tag}-hold.out"));
        let holder = ctx.spawn(&format!(
            "exec {} {py} {} {a} {port} > {}",
            shimmed(ctx, &format!("{tag}h"), "")?,
            hold.display(),
            held.display()
        ))?;
        wait_line(ctx, &held, "flowing", Duration::from_secs(60))?;
        ctx.sh(&format!("kill -9 {}", holder.pid()))?;
        drop(holder);
        std::fs::write(&stop, b"")?;
        let done = ctx.wait("prefork server", srv)?;
        ensure!(
            done.stdout.contains("parent done"),
            "the server did not finish"
        );
        let (mut served, mut resets) = (0, 0);
        for line in done
            .stdout
            .lines()
            .filter(|l| l.starts_with("child served"))
        {
            let n: Vec<u64> = line
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect();
            served += n.first().copied().unwrap_or(0);
            resets += n.get(1).copied().unwrap_or(0);
        }
        ctx.report(format_args!(
            "pre-fork {mode}: children served {served}, {resets} reset"
        ));
        ensure!(
            served == 8,
            "{mode}: the children served {served} of 8 connections"
        );
        ensure!(
            resets == 1,
            "{mode}: the killed client read as {resets} resets, not 1"
        );
        ensure!(
            done.stdout.matches("echo ok").count() == 2,
            "{mode}: the children's own connections: {}",
            done.stdout
        );
        ensure!(
            ctx.wait("backend", backend)?.success(),
            "the backend failed"
        );
        expect_counts(ctx, &format!("{tag}b"), "server", &[("rdma UPGRADED", 2)])?;
        expect_counts(
            ctx,
            tag,
            "server",
            &[("rdma UPGRADED", 7), ("tcp PEER_NOT_SHIMMED", 1)],
        )?;
        expect_counts(ctx, tag, "client", &[("rdma UPGRADED", 2)])?;
    }
    Ok(())
}

/// rping (rdma_cm port space TCP) serves on the app's port while a shimmed server listens on
/// the same TCP port: the shim's RDMA listener is in the IB port space, so both work, and the
/// shimmed connection upgrades.
fn port_in_use(ctx: &Ctx) -> anyhow::Result<()> {
    let (a, b) = (ctx.addr_a, ctx.addr_b);
    let py = python();
    let server = file(ctx, "server.py", ECHO_SERVER)?;
    let client = file(ctx, "client.py", ECHO_CLIENT)?;
    let rping = ctx.spawn(&format!("rping -s -a {a} -p 9750 -C 3 -v"))?;
    let srv = ctx.spawn(&format!(
        "{} {py} {} {a} 9750 1 0",
        shimmed(ctx, "srv", "")?,
        server.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9750"))?;
    ctx.sh(&format!(
        "{} {py} {} {a} 9750",
        shimmed(ctx, "cli", "")?,
        client.display()
    ))?;
    ensure!(ctx.wait("server", srv)?.success(), "server failed");
    expect_counts(ctx, "cli", "client", &[("rdma UPGRADED", 1)])?;
    expect_counts(ctx, "srv", "server", &[("rdma UPGRADED", 1)])?;
    let mut ok = false;
    for _ in 0..10 {
        let c = ctx.bash(&format!("rping -c -a {a} -I {b} -p 9750 -C 3 -v"))?;
        // Its three pings came back: it worked. (rping's client may still exit 255 after its
        // DISCONNECT, "rdma_get_cm_event: Bad file descriptor": its CM thread races its own
        // teardown. The server served it and is gone, so a retry could only be refused.)
        if c.stdout.matches("ping data").count() == 3 {
            ok = true;
            break;
        }
        thread::sleep(Duration::from_millis(500));
    }
    ensure!(ok, "rping on the same port stopped working");
    ensure!(
        ctx.wait("rping server", rping)?.success(),
        "the rping server failed"
    );
    Ok(())
}

/// A server policy that refuses the client's port (the client counts `PEER_REFUSED`, at once),
/// and a capable process talking to a loopback address without `loopback: true` (`POLICY`).
fn policy(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let py = python();
    let server = file(ctx, "server.py", ECHO_SERVER)?;
    let client = file(ctx, "client.py", ECHO_CLIENT)?;
    let pol = file(
        ctx,
        "policy.yaml",
        "version: 1\nserver:\n  allow: [{ports: [1]}]\n",
    )?;
    let srv = ctx.spawn(&format!(
        "{} {py} {} {a} 9760 1 0",
        shimmed(ctx, "srv", &format!("STREAMSHIM_POLICY={}", pol.display()))?,
        server.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9760"))?;
    let out = ctx.sh(&format!(
        "{} {py} {} {a} 9760",
        shimmed(ctx, "cli", "")?,
        client.display()
    ))?;
    ensure!(ctx.wait("server", srv)?.success(), "server failed");
    ensure!(
        connect_seconds(&out.stdout) < 2.0,
        "a refusal must be quick"
    );
    expect_counts(ctx, "cli", "client", &[("tcp PEER_REFUSED", 1)])?;
    expect_counts(ctx, "srv", "server", &[("tcp POLICY", 1)])?;

    let srv = ctx.spawn(&format!(
        "{} {py} {} 127.0.0.1 9761 1 0",
        shimmed(ctx, "lsrv", "")?,
        server.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9761"))?;
    ctx.sh(&format!(
        "{} {py} {} 127.0.0.1 9761",
        shimmed(ctx, "lcli", "")?,
        client.display()
    ))?;
    ensure!(ctx.wait("server", srv)?.success(), "server failed");
    expect_counts(ctx, "lcli", "client", &[("tcp POLICY", 1)])?;
    expect_counts(ctx, "lsrv", "server", &[("tcp POLICY", 1)])?;
    let _ = shim()?;
    Ok(())
}
