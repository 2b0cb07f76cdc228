//! Scenarios over Soft-RoCE in QEMU guests (`cargo test -p rdma-streams-softroce`): the runner
//! boots one loop guest and one wire pair and runs these inside (see the crate docs and
//! `rdma_streams_softroce::runner`). Add a scenario: write `fn(&Ctx) -> anyhow::Result<()>` and
//! list it in `SCENARIOS`.

use std::collections::BTreeMap;
use std::fs;
use std::process::ExitCode;
use std::thread;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use rdma_streams_softroce::helpers::{Captured, rdma_counters};
use rdma_streams_softroce::{Ctx, Role, Scenario, Topology, runner};

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "smoke_loop_devices",
        topology: Topology::Loop,
        timeout: Duration::from_secs(60),
        run: loop_devices,
    },
    Scenario {
        name: "smoke_loop_rping",
        topology: Topology::Loop,
        timeout: Duration::from_secs(180),
        run: loop_rping,
    },
    Scenario {
        name: "smoke_loop_rstream_crosses_the_veth",
        topology: Topology::Loop,
        timeout: Duration::from_secs(240),
        run: loop_rstream,
    },
    Scenario {
        name: "smoke_wire_rping",
        topology: Topology::Wire,
        timeout: Duration::from_secs(180),
        run: wire_rping,
    },
    Scenario {
        name: "smoke_wire_rstream",
        topology: Topology::Wire,
        timeout: Duration::from_secs(240),
        run: wire_rstream,
    },
];

mod scenarios;

fn main() -> ExitCode {
    let all: Vec<Scenario> = SCENARIOS
        .iter()
        .chain(scenarios::shim_apps::SCENARIOS)
        .chain(scenarios::shim_load::SCENARIOS)
        .chain(scenarios::shim_nginx::SCENARIOS)
        .chain(scenarios::shim_spare::SCENARIOS)
        .chain(scenarios::shim_memory::SCENARIOS)
        .chain(scenarios::shim_faults::SCENARIOS)
        .chain(scenarios::shim_handed::SCENARIOS)
        .chain(scenarios::shim_wire::SCENARIOS)
        .chain(scenarios::gateway::SCENARIOS)
        .chain(scenarios::attacks::SCENARIOS)
        .chain(scenarios::conformance::SCENARIOS)
        .chain(scenarios::cpython::SCENARIOS)
        .copied()
        .collect();
    runner::main(&all)
}

/// `ibv_devices` lists the topology's rxe devices, each ACTIVE with a 4096 path MTU (the links
/// run at MTU 9000 unless `SOFTROCE_MTU` says otherwise).
fn loop_devices(ctx: &Ctx) -> anyhow::Result<()> {
    let devices = ctx.sh("ibv_devices")?.stdout;
    for dev in ["rxea", "rxeb"] {
        ensure!(devices.contains(dev), "ibv_devices does not list {dev}");
    }
    check_ports(ctx)
}

fn check_ports(ctx: &Ctx) -> anyhow::Result<()> {
    for dev in &ctx.devices {
        let info = ctx.sh(&format!("ibv_devinfo -d {dev}"))?.stdout;
        ensure!(info.contains("PORT_ACTIVE"), "{dev} is not active");
        // RoCEv2 headers take about 60 bytes of the link's MTU.
        if ctx.mtu >= 4200 {
            ensure!(
                info.contains("active_mtu:\t\t4096"),
                "{dev} does not run at a 4096 path MTU on links of MTU {}",
                ctx.mtu
            );
        }
    }
    Ok(())
}

/// Runs `script` until it succeeds, at most `tries` times a second apart: a client started
/// before its server listens is refused.
fn retry(ctx: &Ctx, tries: u32, script: &str) -> anyhow::Result<Captured> {
    let mut last = None;
    for attempt in 1..=tries {
        let c = ctx.bash(script)?;
        if c.success() {
            return Ok(c);
        }
        ctx.log(format_args!("attempt {attempt} of {tries} failed"));
        last = Some(c);
        if ctx.remaining() < Duration::from_secs(5) {
            break;
        }
        thread::sleep(Duration::from_secs(1));
    }
    bail!(
        "`{script}` failed {tries} times; the last: {}",
        last.map(|c| c.to_string()).unwrap_or_default()
    )
}

fn ping_lines(c: &Captured) -> usize {
    c.stdout
        .lines()
        .filter(|l| l.contains("ping data: "))
        .count()
}

/// rping from rxeb's address to rxea's: three pings, verified by both sides.
fn loop_rping(ctx: &Ctx) -> anyhow::Result<()> {
    let (a, b) = (ctx.addr_a, ctx.addr_b);
    let server = ctx.spawn(&format!("rping -s -a {a} -C 3 -v -V"))?;
    thread::sleep(Duration::from_millis(500));
    let client = retry(ctx, 10, &format!("rping -c -a {a} -I {b} -C 3 -v -V"))?;
    ensure!(
        ping_lines(&client) == 3,
        "the client printed {} pings",
        ping_lines(&client)
    );
    let server = ctx.wait("rping server", server)?;
    ensure!(server.success(), "the rping server failed: {server}");
    ensure!(
        ping_lines(&server) == 3,
        "the server printed {} pings",
        ping_lines(&server)
    );
    Ok(())
}

/// The packet counters of every device of the topology, and of its links.
fn counters(ctx: &Ctx) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for dev in &ctx.devices {
        let c = rdma_counters(dev).with_context(|| format!("counters of {dev}"))?;
        for k in ["sent_pkts", "rcvd_pkts"] {
            out.insert(format!("{dev}.{k}"), c.get(k).copied().unwrap_or(0));
        }
    }
    let links: &[&str] = if ctx.role == Role::Loop {
        &["va", "vb", "lo"]
    } else {
        &[]
    };
    for link in links {
        for k in ["tx_bytes", "rx_bytes"] {
            let v = fs::read_to_string(format!("/sys/class/net/{link}/statistics/{k}"))
                .with_context(|| format!("{link} {k}"))?;
            out.insert(format!("{link}.{k}"), v.trim().parse()?);
        }
    }
    Ok(out)
}

fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.saturating_sub(before.get(k).copied().unwrap_or(0)),
            )
        })
        .collect()
}

const RSTREAM_SIZE: u64 = 65536;
const RSTREAM_COUNT: u64 = 100;

/// rstream (rsockets) from rxeb's address to rxea's, data verified; the packet counters of
/// both rxe devices and the veth's byte counters move by at least the bytes sent, so the
/// stream crossed the veth (and rxe's UDP path), not lo.
fn loop_rstream(ctx: &Ctx) -> anyhow::Result<()> {
    let (a, b) = (ctx.addr_a, ctx.addr_b);
    let flags = format!("-S {RSTREAM_SIZE} -C {RSTREAM_COUNT} -T v");
    let before = counters(ctx)?;
    let server = ctx.spawn(&format!("rstream -b {a} {flags}"))?;
    thread::sleep(Duration::from_millis(500));
    retry(ctx, 10, &format!("rstream -s {a} -b {b} {flags}"))?;
    let server = ctx.wait("rstream server", server)?;
    ensure!(server.success(), "the rstream server failed: {server}");
    let d = delta(&before, &counters(ctx)?);
    ctx.log(format_args!("counter deltas: {d:?}"));
    let bytes = RSTREAM_SIZE * RSTREAM_COUNT;
    for dev in ["rxea", "rxeb"] {
        for k in ["sent_pkts", "rcvd_pkts"] {
            ensure!(
                d[&format!("{dev}.{k}")] > 0,
                "{dev} {k} did not move: {d:?}"
            );
        }
    }
    // rstream sends both ways (the transfer, then the echo), so each end of the veth carried at
    // least `bytes` each way.
    for k in ["va.tx_bytes", "va.rx_bytes", "vb.tx_bytes", "vb.rx_bytes"] {
        ensure!(
            d[k] >= bytes,
            "{k} moved {} bytes, less than the {bytes} sent: {d:?}",
            d[k]
        );
    }
    ensure!(
        d["lo.tx_bytes"] < bytes / 10,
        "lo carried {} bytes: the stream went through lo",
        d["lo.tx_bytes"]
    );
    Ok(())
}

/// rping between the two guests: A serves, B connects.
fn wire_rping(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    match ctx.role {
        Role::A => {
            let server = ctx.spawn(&format!("rping -s -a {a} -C 3 -v -V"))?;
            thread::sleep(Duration::from_millis(500));
            ctx.barrier("server-up")?;
            let server = ctx.wait("rping server", server)?;
            ensure!(server.success(), "the rping server failed: {server}");
            ensure!(
                ping_lines(&server) == 3,
                "the server printed {} pings",
                ping_lines(&server)
            );
        }
        _ => {
            ctx.barrier("server-up")?;
            let client = retry(ctx, 10, &format!("rping -c -a {a} -C 3 -v -V"))?;
            ensure!(
                ping_lines(&client) == 3,
                "the client printed {} pings",
                ping_lines(&client)
            );
        }
    }
    Ok(())
}

/// rstream between the two guests, data verified, with 4096-byte RoCE packets (the wire's
/// MTU 9000 carries them); rxe0's counters move on both sides.
fn wire_rstream(ctx: &Ctx) -> anyhow::Result<()> {
    check_ports(ctx)?;
    let a = ctx.addr_a;
    let flags = format!("-S {RSTREAM_SIZE} -C {RSTREAM_COUNT} -T v");
    let before = counters(ctx)?;
    match ctx.role {
        Role::A => {
            let server = ctx.spawn(&format!("rstream -b {a} {flags}"))?;
            thread::sleep(Duration::from_millis(500));
            ctx.barrier("server-up")?;
            let server = ctx.wait("rstream server", server)?;
            ensure!(server.success(), "the rstream server failed: {server}");
        }
        _ => {
            ctx.barrier("server-up")?;
            retry(
                ctx,
                10,
                &format!("rstream -s {a} -b {} {flags}", ctx.addr_b),
            )?;
        }
    }
    let d = delta(&before, &counters(ctx)?);
    ctx.log(format_args!("counter deltas: {d:?}"));
    // 64 KiB messages in packets of at most 4096 bytes: at least 16 packets per message each way.
    let min = RSTREAM_COUNT * RSTREAM_SIZE / 4096;
    for k in ["rxe0.sent_pkts", "rxe0.rcvd_pkts"] {
        ensure!(
            d[k] >= min,
            "{k} moved {} packets, expected at least {min}: {d:?}",
            d[k]
        );
    }
    Ok(())
}
