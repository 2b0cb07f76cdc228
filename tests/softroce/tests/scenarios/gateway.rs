//! The migration gateway on real RDMA streams, run as `rdma-gateway-testbed` (the gateway plus
//! the test events socket the scenarios start and end migrations with).
//!
//! - Loop guest: `gateway/testbed/tests/scripts/softroce-migration.sh` (both gateways in the guest's
//!   initial namespace, the virt-handler namespaces behind veths, QEMU migrations through
//!   relays), one scenario of the script per scenario here, so that each has its own timeout,
//!   log and line in the results; the script's `PASS`/`FAIL` line judges, its `figure:` lines
//!   are reported.
//! - Wire pair: the KubeVirt shape across two nodes, written out here: guest A runs the source
//!   QEMU behind relay A in its virt-handler namespace vhA and gateway A capturing there;
//!   guest B runs gateway B, relay B in vhB (10.2.0.2) and the destination QEMU
//!   (`qemu_migrate.py --role source|destination`). The migration crosses the wire on one RDMA
//!   stream and must arrive byte-exact.
//!
//! The test bed is the binary of this build, next to the test binary (`make test` runs `cargo
//! build --workspace` first).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use rdma_streams_softroce::helpers::{Capture, Captured, Running, rdma_counters};
use rdma_streams_softroce::locate::workspace_root;
use rdma_streams_softroce::process::describe;
use rdma_streams_softroce::{Ctx, Role, Scenario, Topology};
use serde_json::Value;

use super::support::python;

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "gateway_loop_migration_over_the_stream",
        topology: Topology::Loop,
        timeout: Duration::from_secs(480),
        run: loop_rdma,
    },
    Scenario {
        name: "gateway_loop_parallel_streams",
        topology: Topology::Loop,
        timeout: Duration::from_secs(360),
        run: loop_parallel,
    },
    Scenario {
        name: "gateway_loop_abort_mid_migration",
        topology: Topology::Loop,
        timeout: Duration::from_secs(420),
        run: loop_abort,
    },
    Scenario {
        name: "gateway_loop_peer_killed_mid_migration",
        topology: Topology::Loop,
        timeout: Duration::from_secs(420),
        run: loop_peer_killed,
    },
    Scenario {
        name: "gateway_loop_fallbacks_peer_down_no_peer_stream_timeout_no_key",
        topology: Topology::Loop,
        timeout: Duration::from_secs(780),
        run: loop_fallbacks,
    },
    Scenario {
        name: "gateway_loop_peer_keys_differ",
        topology: Topology::Loop,
        timeout: Duration::from_secs(480),
        run: loop_wrong_key,
    },
    Scenario {
        name: "gateway_loop_peer_keys_rotated_while_running",
        topology: Topology::Loop,
        timeout: Duration::from_secs(420),
        run: loop_rotation,
    },
    Scenario {
        name: "gateway_loop_forged_requests_with_a_known_uid_dial_nothing",
        topology: Topology::Loop,
        timeout: Duration::from_secs(300),
        run: loop_forged,
    },
    Scenario {
        name: "gateway_wire_kubevirt_migration_between_two_guests",
        topology: Topology::Wire,
        timeout: Duration::from_secs(600),
        run: wire_migration,
    },
];

/// Guest RAM of the loop's migrations: QEMU runs under TCG inside the TCG guest.
const LOOP_RAM_MIB: u64 = 32;
/// Guest RAM of the migration between the two guests.
const WIRE_RAM_MIB: u64 = 64;

/// `rdma-gateway-testbed` of this build: in the test binary's profile directory.
fn gateway_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("current_exe")?;
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .context("the test binary is not in <target>/<profile>/deps")?;
    let gw = profile.join("rdma-gateway-testbed");
    ensure!(
        gw.is_file(),
        "{} not found (`cargo build -p rdma-gateway-testbed` first; `make test` runs `cargo \
         build --workspace` before the tests)",
        gw.display()
    );
    Ok(gw)
}

fn tool(rel: &str) -> String {
    workspace_root().join(rel).display().to_string()
}

// ---- The loop: softroce-migration.sh -------------------------------------------------------

/// Runs scenarios of softroce-migration.sh with the loop's two addresses, its output going to
/// the log as it comes; reports its `figure:` lines and judges its `PASS`/`FAIL` lines.
fn script(ctx: &Ctx, scenarios: &[&str]) -> anyhow::Result<()> {
    script_with(ctx, scenarios, "")
}

/// [`script`] with more `K=V` words in its environment.
fn script_with(ctx: &Ctx, scenarios: &[&str], env: &str) -> anyhow::Result<()> {
    let gw = gateway_binary()?;
    let cmd = format!(
        "PY={} {env} exec bash {} --scenario {} --ram-mib {LOOP_RAM_MIB} {} {} {} {}",
        python(),
        tool("gateway/testbed/tests/scripts/softroce-migration.sh"),
        scenarios.join(","),
        gw.display(),
        tool("tests/tools/qemu_migrate.py"),
        ctx.addr_a,
        ctx.addr_b
    );
    ctx.log(format_args!("$ {cmd}"));
    let mut bash = Command::new("bash");
    bash.arg("-c").arg(&cmd);
    let log = File::from(
        std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .context("dup stdout")?,
    );
    let run = Running::spawn(
        bash,
        Capture {
            merge: true,
            tee: Some(log),
            own_group: true,
        },
    )
    .context("starting bash")?;
    // Ends before the runner's bound, so a hung step still leaves its output and a verdict.
    let c = run.wait_timeout(ctx.remaining().saturating_sub(Duration::from_secs(15)))?;
    ctx.log(format_args!(
        "softroce-migration.sh: {} after {:.1} s",
        if c.timed_out {
            "timed out".to_string()
        } else {
            describe(c.status)
        },
        c.elapsed.as_secs_f64()
    ));
    for line in c.stdout.lines() {
        if let Some(f) = line.trim_start().strip_prefix("figure: ") {
            ctx.report(f);
        }
    }
    let lines: Vec<&str> = c.stdout.lines().collect();
    let missing: Vec<&str> = scenarios
        .iter()
        .copied()
        .filter(|s| !lines.iter().any(|l| l.starts_with(&format!("PASS {s} "))))
        .collect();
    if missing.is_empty() && c.success() {
        return Ok(());
    }
    let failed: Vec<&str> = lines
        .iter()
        .filter(|l| l.contains("FAILED:") || l.starts_with("FAIL "))
        .map(|l| l.trim())
        .collect();
    let why = match c.status.code() {
        _ if c.timed_out => "timed out".to_string(),
        Some(77) => "no RDMA device (exit 77)".to_string(),
        Some(2) => "usage error (exit 2)".to_string(),
        _ => describe(c.status),
    };
    bail!(
        "softroce-migration.sh: {why}; not passed: {}; {}",
        missing.join(", "),
        if failed.is_empty() {
            "no failed check printed (see the output above)".to_string()
        } else {
            failed.join("; ")
        }
    )
}

/// An RDMA peer without the peer key, which knows a migration's uid and port (attacks.rs's
/// attacker program): refused at every step, and the destination is never dialed.
fn loop_forged(ctx: &Ctx) -> anyhow::Result<()> {
    let attacker = super::attacks::attacker(ctx)?;
    script_with(
        ctx,
        &["forged"],
        &format!("ATTACKER={}", attacker.display()),
    )
}

fn loop_rdma(ctx: &Ctx) -> anyhow::Result<()> {
    script(ctx, &["rdma"])
}

fn loop_parallel(ctx: &Ctx) -> anyhow::Result<()> {
    script(ctx, &["parallel"])
}

fn loop_abort(ctx: &Ctx) -> anyhow::Result<()> {
    script(ctx, &["abort"])
}

fn loop_peer_killed(ctx: &Ctx) -> anyhow::Result<()> {
    script(ctx, &["peer-killed"])
}

/// The four fallbacks in one run of the script (one topology and RAM file for them).
fn loop_fallbacks(ctx: &Ctx) -> anyhow::Result<()> {
    script(ctx, &["peer-down", "no-peer", "timeout", "no-key"])
}

/// The gateways hold different keys: every connection over TCP (`PEER_AUTH_FAILED`), the
/// migration byte-exact.
fn loop_wrong_key(ctx: &Ctx) -> anyhow::Result<()> {
    script(ctx, &["wrong-key"])
}

/// The keys files rewritten while the gateways run, through a whole rotation.
fn loop_rotation(ctx: &Ctx) -> anyhow::Result<()> {
    script(ctx, &["rotation"])
}

// ---- The wire: two nodes ---------------------------------------------------------------------

/// The port the destination's relay publishes (virt-handler's migration port).
const PORT: u16 = 49152;
/// The migration's target: the destination virt-handler's address (vhB, in guest B only).
const TARGET: &str = "10.2.0.2";
/// Gateway B's stream listener port (gateway A's is the same on its own address).
const GW_PORT: u16 = 7471;
/// Installing a capture (setns threads, nft) took 8 s in a TCG guest.
const EVENT_TIMEOUT: Duration = Duration::from_secs(120);
/// The peer key both gateways hold (32 bytes, standard base64; a test key).
const PEER_KEY: &str = "cmRtYS1zdHJlYW1zIHNvZnRyb2NlIHdpcmUga2V5ISE=";

/// A peer keys file with [`PEER_KEY`] in the guest's scratch directory; its path.
fn peer_keys_file(ctx: &Ctx) -> anyhow::Result<PathBuf> {
    let path = ctx.tmp.join("peer-keys");
    fs::write(&path, format!("# the wire scenario's key\n{PEER_KEY}\n"))?;
    Ok(path)
}

/// A virt-handler network namespace: held by a `sleep` started with `unshare --net` (so it,
/// its veth and its nft tables vanish when the scenario's processes die, however it ends),
/// joined to this guest's initial namespace by a veth `h<name>` (HOST/24) <-> `v<name>`
/// (POD/24), default route via HOST.
struct VirtHandlerNs {
    holder: Running,
}

impl VirtHandlerNs {
    fn new(ctx: &Ctx, name: &'static str, host: &str, pod: &str) -> anyhow::Result<VirtHandlerNs> {
        let holder = ctx.spawn("exec unshare --net sleep 100000")?;
        let ns = VirtHandlerNs { holder };
        let mine = fs::read_link("/proc/self/ns/net")?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while fs::read_link(ns.path()).ok().is_none_or(|l| l == mine) {
            ensure!(
                Instant::now() < deadline,
                "unshare --net did not make a namespace"
            );
            thread::sleep(Duration::from_millis(20));
        }
        let pid = ns.holder.pid();
        ctx.sh(&format!(
            "set -e
             ip link add h{name} type veth peer name v{name}
             ip link set v{name} netns {pid}
             ip addr add {host}/24 dev h{name}
             ip link set h{name} up
             {exec} ip link set lo up
             {exec} ip addr add {pod}/24 dev v{name}
             {exec} ip link set v{name} up
             {exec} ip route add default via {host}",
            exec = ns.exec()
        ))?;
        Ok(ns)
    }

    /// The nsfs file (`--capture-netns`).
    fn path(&self) -> String {
        format!("/proc/{}/ns/net", self.holder.pid())
    }

    /// The words that run a command inside.
    fn exec(&self) -> String {
        format!("nsenter --net={}", self.path())
    }

    /// The gateway's nft tables inside.
    fn tables(&self, ctx: &Ctx) -> anyhow::Result<String> {
        let out = ctx.sh(&format!("{} nft list tables", self.exec()))?.stdout;
        Ok(out
            .lines()
            .filter(|l| l.contains("rdma_gw_"))
            .collect::<Vec<_>>()
            .join("\n"))
    }
}

/// Commands run when dropped (on every exit path but a kill): what outlives the scenario's
/// processes (a route, a sysctl).
struct Undo(Vec<String>);

impl Drop for Undo {
    fn drop(&mut self) {
        for cmd in self.0.iter().rev() {
            let _ = rdma_streams_softroce::helpers::bash(cmd, Duration::from_secs(30));
        }
    }
}

/// One gateway, started with the test events socket and JSON logs; killed when dropped.
struct Gateway {
    run: Running,
    log: PathBuf,
    events: PathBuf,
    admin: String,
}

impl Gateway {
    fn start(ctx: &Ctx, tag: &str, admin: &str, args: &str) -> anyhow::Result<Gateway> {
        let out = std::env::var_os("SOFTROCE_OUT").map_or_else(|| ctx.tmp.clone(), PathBuf::from);
        let log = out.join(format!("{}-gateway-{tag}.log", ctx.name));
        let events = ctx.tmp.join(format!("gw-{tag}.sock"));
        let run = ctx.spawn(&format!(
            "exec {} --admin-listen {admin} --provider librdmacm.so.1 --test-events-socket {} \
             --log-level info --log-format json {args} 2>>{}",
            gateway_binary()?.display(),
            events.display(),
            log.display()
        ))?;
        let mut gw = Gateway {
            run,
            log,
            events,
            admin: admin.to_string(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !gw.events.exists() {
            if !gw.run.is_running() {
                bail!("gateway {tag} exited at start:\n{}", gw.tail(30));
            }
            ensure!(
                Instant::now() < deadline,
                "gateway {tag}: no test events socket after 60 s:\n{}",
                gw.tail(30)
            );
            thread::sleep(Duration::from_millis(50));
        }
        ctx.log(format_args!(
            "gateway {tag} is up (log {})",
            gw.log.display()
        ));
        Ok(gw)
    }

    /// One migration event; fails unless the gateway answers `ok`.
    fn event(&self, ctx: &Ctx, json: &str) -> anyhow::Result<()> {
        ctx.log(format_args!("event: {json}"));
        let mut s = UnixStream::connect(&self.events)
            .with_context(|| format!("connecting to {}", self.events.display()))?;
        s.set_read_timeout(Some(EVENT_TIMEOUT))?;
        s.write_all(format!("{json}\n").as_bytes())?;
        let mut answer = String::new();
        BufReader::new(s)
            .read_line(&mut answer)
            .context("reading the event's answer")?;
        ensure!(answer.trim() == "ok", "event {json}: {}", answer.trim());
        Ok(())
    }

    fn started(&self, ctx: &Ctx, role: &str) -> anyhow::Result<()> {
        self.event(
            ctx,
            &format!(
                r#"{{"started":{{"uid":"u1","vmi":"default/vm-u1","role":"{role}","target":"{TARGET}","ports":[{PORT}]}}}}"#
            ),
        )
    }

    fn ended(&self, ctx: &Ctx) -> anyhow::Result<()> {
        self.event(ctx, r#"{"ended":{"uid":"u1","aborted":false}}"#)
    }

    /// `/metrics` as `name{labels}` -> value.
    fn metrics(&self) -> anyhow::Result<BTreeMap<String, f64>> {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "10"])
            .arg(format!("http://{}/metrics", self.admin))
            .output()
            .context("running curl")?;
        ensure!(
            out.status.success(),
            "curl {}/metrics: {}",
            self.admin,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect())
    }

    /// One metric (0 when absent).
    fn metric(&self, key: &str) -> anyhow::Result<f64> {
        Ok(self.metrics()?.get(key).copied().unwrap_or(0.0))
    }

    /// Waits until no connection is open, at most 30 s.
    fn idle(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let open = self.metric("rdma_gw_connections_active")?;
            if open == 0.0 {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "{open} connections still open after 30 s"
            );
            thread::sleep(Duration::from_millis(200));
        }
    }

    fn tail(&self, n: usize) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The first `open_ms` the log shows (the stream's connect, the peer's dial, the accept).
    fn open_ms(&self) -> Option<u64> {
        fs::read_to_string(&self.log)
            .ok()?
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find_map(|v| v["fields"]["open_ms"].as_u64().or(v["open_ms"].as_u64()))
    }
}

/// `rxe0`'s packet counters (sent, received).
fn rxe0() -> anyhow::Result<(u64, u64)> {
    let c = rdma_counters("rxe0").context("rxe0's counters")?;
    let get = |k: &str| c.get(k).copied().unwrap_or(0);
    Ok((get("sent_pkts"), get("rcvd_pkts")))
}

/// The last line of a `qemu_migrate.py` run as JSON.
fn qemu_result(what: &str, stdout: &str) -> anyhow::Result<Value> {
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).with_context(|| format!("{what} printed no JSON result: {stdout}"))
}

fn shared_file(ctx: &Ctx, what: &str) -> PathBuf {
    ctx.work.join(format!("{}.{what}", ctx.name))
}

/// The KubeVirt shape across two guests: see the module docs. Guest A routes 10.2.0.0/24 over
/// the wire to guest B, which forwards it into vhB, so that a TCP fallback could reach the
/// destination as in a cluster; the checks then make sure the migration did not take it.
fn wire_migration(ctx: &Ctx) -> anyhow::Result<()> {
    let mut gateway = None;
    let r = wire_side(ctx, &mut gateway);
    if let Err(e) = &r {
        // Guest B waits for the source's result while its destination QEMU listens: a source
        // side that failed before it says so here.
        let src_json = shared_file(ctx, "src.json");
        if ctx.role == Role::A && !src_json.exists() {
            let why = serde_json::json!({"status": "error", "error": format!("guest A: {e:#}")});
            let _ = fs::write(&src_json, why.to_string());
        }
        if let Some(gw) = &gateway {
            ctx.log(format_args!(
                "gateway log tail ({}):\n{}",
                gw.log.display(),
                gw.tail(40)
            ));
        }
    }
    r
}

fn wire_side(ctx: &Ctx, gateway: &mut Option<Gateway>) -> anyhow::Result<()> {
    let t = ctx.tmp.display().to_string();
    let ram = WIRE_RAM_MIB << 20;
    let qemu = format!("{} {}", python(), tool("tests/tools/qemu_migrate.py"));
    let relay = format!(
        "{} {}",
        python(),
        tool("gateway/testbed/tests/scripts/relay.py")
    );
    let src_json = shared_file(ctx, "src.json");
    let dst_json = shared_file(ctx, "dst.json");
    // Both migration JSON lines stay in the work dir of the run: only this run's.
    let _ = fs::remove_file(if ctx.role == Role::A {
        &src_json
    } else {
        &dst_json
    });
    let mut undo = Undo(Vec::new());
    match ctx.role {
        Role::A => {
            let nic = std::env::var("SOFTROCE_NIC").context("SOFTROCE_NIC")?;
            let vh = VirtHandlerNs::new(ctx, "vhA", "10.1.0.1", "10.1.0.2")?;
            ctx.sh(&format!(
                "ip route replace 10.2.0.0/24 via {} dev {nic}",
                ctx.addr_b
            ))?;
            undo.0.push(format!(
                "ip route del 10.2.0.0/24 via {} dev {nic}",
                ctx.addr_b
            ));
            let gw = gateway.insert(Gateway::start(
                ctx,
                "a",
                "127.0.0.1:9103",
                &format!(
                    "--listen {}:{GW_PORT} --capture-netns {} --peer {TARGET}={}:{GW_PORT} \
                     --stream-timeout-ms 10000 --peer-keys-file {}",
                    ctx.addr_a,
                    vh.path(),
                    ctx.addr_b,
                    peer_keys_file(ctx)?.display()
                ),
            )?);
            ensure!(
                gw.metric("rdma_gw_rdma_usable")? == 1.0,
                "gateway A: RDMA not usable"
            );
            ctx.barrier("destination-ready")?;
            gw.started(ctx, "source")?;
            let tables = vh.tables(ctx)?;
            ensure!(!tables.is_empty(), "no capture table in vhA");
            let relay_a = ctx.spawn(&format!(
                "exec {} {relay} unix-to-tcp {t}/src.sock {TARGET}:{PORT} > {t}/relayA.out",
                vh.exec()
            ))?;
            wait_ready(ctx, &format!("{t}/relayA.out"), "relay A")?;
            let before = rxe0()?;
            let out = ctx.bash(&format!(
                "{qemu} --role source --workdir {t}/qemu --ram-mib {WIRE_RAM_MIB} \
                 --target unix:{t}/src.sock --timeout 300"
            ))?;
            drop(relay_a);
            let src = qemu_result("the source", &out.stdout)?;
            fs::write(&src_json, src.to_string())?;
            ctx.barrier("migrated")?;
            // Only now: the source's QEMU is done once its bytes are in the socket, while
            // gateway A may still be sending the tail; the destination has all of it here.
            let after = rxe0()?;
            ensure!(
                src["status"] == "completed",
                "the source's migration: {src}"
            );
            let dst = read_json(&dst_json)?;
            same_ram(&src, &dst)?;
            ctx.report(format_args!(
                "{WIRE_RAM_MIB} MiB migrated in {} s ({} MiB/s), byte-exact; the stream opened in {} ms",
                src["seconds"],
                src["mib_per_s"],
                gw.open_ms()
                    .map_or_else(|| "?".to_string(), |ms| ms.to_string())
            ));
            gw.idle().context("gateway A")?;
            let m = gw.metrics()?;
            ctx.log(format_args!("gateway A: {m:?}"));
            let get = |k: &str| m.get(k).copied().unwrap_or(0.0);
            ensure!(
                get(r#"rdma_gw_connections_total{role="source",path="rdma"}"#) == 1.0,
                "gateway A did not carry the connection on a stream: {m:?}"
            );
            ensure!(
                get(r#"rdma_gw_connections_total{role="source",path="tcp"}"#) == 0.0,
                "gateway A relayed over TCP: {m:?}"
            );
            let fallbacks: f64 = m
                .iter()
                .filter(|(k, _)| k.starts_with("rdma_gw_fallbacks_total"))
                .map(|(_, v)| v)
                .sum();
            ensure!(fallbacks == 0.0, "gateway A counted fallbacks: {m:?}");
            let sent = get(r#"rdma_gw_bytes_total{path="rdma",direction="to_target"}"#);
            ensure!(
                sent >= ram as f64,
                "gateway A sent {sent} bytes on the stream, less than the {ram} of RAM"
            );
            rxe_moved(ctx, before, after, true)?;
            // What a TCP fallback of gateway A would take: from this namespace over the wire
            // into vhB, where relay B still listens.
            ctx.sh(&format!(
                "timeout 20 bash -c 'exec 3<>/dev/tcp/{TARGET}/{PORT}'"
            ))
            .context("no TCP path from guest A to the destination's relay (the fallback's)")?;
            gw.ended(ctx)?;
            let tables = vh.tables(ctx)?;
            ensure!(tables.is_empty(), "capture table left in vhA: {tables}");
            ctx.barrier("checked")
        }
        _ => {
            let forward = ctx.sh("sysctl -n net.ipv4.ip_forward")?.stdout;
            let vh = VirtHandlerNs::new(ctx, "vhB", "10.2.0.1", TARGET)?;
            ctx.sh("sysctl -qw net.ipv4.ip_forward=1")?;
            undo.0
                .push(format!("sysctl -qw net.ipv4.ip_forward={}", forward.trim()));
            let gw = gateway.insert(Gateway::start(
                ctx,
                "b",
                "127.0.0.1:9104",
                &format!(
                    "--listen {}:{GW_PORT} --capture-netns {} --peer-keys-file {}",
                    ctx.addr_b,
                    vh.path(),
                    peer_keys_file(ctx)?.display()
                ),
            )?);
            ensure!(
                gw.metric("rdma_gw_rdma_usable")? == 1.0,
                "gateway B: RDMA not usable"
            );
            gw.started(ctx, "target")?;
            let _relay_b = ctx.spawn(&format!(
                "exec {} {relay} tcp-to-unix {PORT} {t}/dst.sock > {t}/relayB.out",
                vh.exec()
            ))?;
            wait_ready(ctx, &format!("{t}/relayB.out"), "relay B")?;
            let before = rxe0()?;
            let dest = ctx.spawn(&format!(
                "exec {qemu} --role destination --workdir {t}/qemu --ram-mib {WIRE_RAM_MIB} \
                 --listen unix:{t}/dst.sock --ready-file {t}/dst.ready --timeout 420"
            ))?;
            wait_ready(ctx, &format!("{t}/dst.ready"), "the destination QEMU")?;
            ctx.barrier("destination-ready")?;
            let out = wait_destination(ctx, dest, &src_json)?;
            let after = rxe0()?;
            let dst = qemu_result("the destination", &out.stdout)?;
            fs::write(&dst_json, dst.to_string())?;
            ctx.barrier("migrated")?;
            ensure!(
                dst["status"] == "completed",
                "the destination's migration: {dst}"
            );
            let src = read_json(&src_json)?;
            same_ram(&src, &dst)?;
            ctx.report(format_args!(
                "the destination took {} s from the first byte (listened {} s), RAM equal to the source's",
                dst["seconds"], dst["waited_seconds"]
            ));
            gw.idle().context("gateway B")?;
            let m = gw.metrics()?;
            ctx.log(format_args!("gateway B: {m:?}"));
            let get = |k: &str| m.get(k).copied().unwrap_or(0.0);
            ensure!(
                get(r#"rdma_gw_connections_total{role="target",path="rdma"}"#) == 1.0,
                "gateway B did not accept and dial one stream: {m:?}"
            );
            let got = get(r#"rdma_gw_bytes_total{path="rdma",direction="to_target"}"#);
            ensure!(
                got >= ram as f64,
                "gateway B received {got} bytes on the stream, less than the {ram} of RAM"
            );
            rxe_moved(ctx, before, after, false)?;
            gw.ended(ctx)?;
            ctx.barrier("checked")
        }
    }
}

/// Waits for the destination's `qemu_migrate.py`, or until guest A says its source failed.
fn wait_destination(ctx: &Ctx, mut dest: Running, src_json: &Path) -> anyhow::Result<Captured> {
    while dest.is_running() && ctx.remaining() > Duration::ZERO {
        if let Ok(src) = read_json(src_json)
            && src["status"] != "completed"
        {
            let out = dest.kill()?;
            ctx.log(format_args!("the destination (killed): {out}"));
            bail!("guest A's source side failed: {src}");
        }
        thread::sleep(Duration::from_millis(200));
    }
    ctx.wait("the destination", dest)
}

/// Waits (60 s) until `path` exists and is not empty.
fn wait_ready(ctx: &Ctx, path: &str, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60).min(ctx.remaining());
    while fs::metadata(path).map_or(true, |m| m.len() == 0) {
        ensure!(Instant::now() < deadline, "{what} not ready after 60 s");
        thread::sleep(Duration::from_millis(50));
    }
    ctx.log(format_args!("{what} is ready"));
    Ok(())
}

fn read_json(path: &Path) -> anyhow::Result<Value> {
    let text = fs::read_to_string(path)
        .with_context(|| format!("the other guest wrote no {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: {text}", path.display()))
}

/// The destination's RAM hashes equal the source's (the dump and the PAM window).
fn same_ram(src: &Value, dst: &Value) -> anyhow::Result<()> {
    for k in ["ram_sha256", "ram_pam_window_sha256"] {
        ensure!(
            src[k].is_string() && src[k] == dst[k],
            "{k}: source {} against destination {} (source {src}, destination {dst})",
            src[k],
            dst[k]
        );
    }
    Ok(())
}

/// rxe0 carried the RAM: at least RAM / 4096 packets out (the source's side) or in (the
/// destination's), and some the other way (acknowledgements).
fn rxe_moved(ctx: &Ctx, before: (u64, u64), after: (u64, u64), source: bool) -> anyhow::Result<()> {
    let sent = after.0.saturating_sub(before.0);
    let rcvd = after.1.saturating_sub(before.1);
    ctx.report(format_args!("rxe0 sent {sent} packets, received {rcvd}"));
    let min = (WIRE_RAM_MIB << 20) / 4096;
    let (data, acks) = if source { (sent, rcvd) } else { (rcvd, sent) };
    ensure!(
        data >= min && acks > 0,
        "rxe0 moved {sent} packets out and {rcvd} in; expected at least {min} {}",
        if source { "out" } else { "in" }
    );
    Ok(())
}
