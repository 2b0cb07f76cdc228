//! Attacks from the RDMA fabric on the real stack (docs/security.md names each): a program
//! without the shim (`tools/attacker.c`, librdmacm and libibverbs by hand) speaks the wire
//! protocol against shimmed servers and breaks its rules. Each ends with nothing of the
//! attacker's in any app, every victim's bytes intact (sha256), streams that were moving still
//! moving, and the server's pinned memory and fds bounded. One attacker is local: another
//! user's process at the door of a shimmed `SO_REUSEPORT` listener.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use rdma_streams_softroce::helpers::{Captured, Running};
use rdma_streams_softroce::{Ctx, Scenario, Topology};

use super::shim_handed::{LINE_CLIENT, REUSEPORT_SERVER};
use super::support::{
    WAIT_PORT, counts, file, footprint, python, service_dnat, shimmed, undo_service_dnat, wait_line,
};

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "attack_spoofed_hello_never_reaches_the_app",
        topology: Topology::Loop,
        timeout: Duration::from_secs(420),
        run: spoofed_hello,
    },
    Scenario {
        name: "attack_rkeys_reach_only_their_own_connection",
        topology: Topology::Loop,
        timeout: Duration::from_secs(300),
        run: foreign_rkeys,
    },
    Scenario {
        name: "attack_stale_and_phantom_bytes_fail_the_stream",
        topology: Topology::Loop,
        timeout: Duration::from_secs(300),
        run: phantom_bytes,
    },
    Scenario {
        name: "attack_connect_flood_is_bounded_and_streams_keep_moving",
        topology: Topology::Loop,
        timeout: Duration::from_secs(420),
        run: flood,
    },
    Scenario {
        name: "attack_a_listener_that_never_claims_holds_no_byte",
        topology: Topology::Loop,
        timeout: Duration::from_secs(240),
        run: never_claims,
    },
    Scenario {
        name: "attack_another_users_process_gets_nothing_at_a_group_door",
        topology: Topology::Loop,
        timeout: Duration::from_secs(240),
        run: foreign_door,
    },
    Scenario {
        name: "attack_a_reused_connection_is_judged_and_bound_as_a_new_one",
        topology: Topology::Loop,
        timeout: Duration::from_secs(360),
        run: reused_connection,
    },
    Scenario {
        name: "attack_an_impostor_connecting_back_through_a_service_gets_no_byte",
        topology: Topology::Wire,
        timeout: Duration::from_secs(300),
        run: impostor_back,
    },
];

/// An echo server that accepts once a cue file exists.
const GATED_ECHO: &str = include_str!("scripts/gated_echo.py");

const ATTACKER_C: &str = include_str!("../../tools/attacker.c");
const VICTIM_PY: &str = include_str!("../../tools/victim.py");

/// The attacker, compiled once per run (in the run's shared directory).
pub fn attacker(ctx: &Ctx) -> anyhow::Result<PathBuf> {
    let bin = ctx.work.join("attacker");
    if !bin.is_file() {
        let src = file(ctx, "attacker.c", ATTACKER_C)?;
        let tmp = ctx.tmp.join("attacker.bin");
        ctx.sh(&format!(
            "cc -O2 -Wall -o {} {} -lrdmacm -libverbs && mv {} {}",
            tmp.display(),
            src.display(),
            tmp.display(),
            bin.display()
        ))?;
    }
    Ok(bin)
}

/// Starts the attacker with `steps`, its lines going to `<tmp>/<tag>.out`.
fn attack(ctx: &Ctx, tag: &str, steps: &str) -> anyhow::Result<(Running, PathBuf)> {
    let out = ctx.tmp.join(format!("{tag}.out"));
    let run = ctx.spawn(&format!(
        "exec {} {steps} > {} 2>&1",
        attacker(ctx)?.display(),
        out.display()
    ))?;
    Ok((run, out))
}

/// The attacker's whole output once it ended (it must end by itself, with "done").
fn finished(ctx: &Ctx, tag: &str, run: Running, out: &Path) -> anyhow::Result<String> {
    let c = ctx.wait(tag, run)?;
    let text = std::fs::read_to_string(out).unwrap_or_default();
    ctx.log(format_args!("{tag} said:\n{text}"));
    ensure!(
        c.success() && text.contains("\ndone"),
        "the attacker {tag} did not finish: {c}\n{text}"
    );
    Ok(text)
}

fn victim(ctx: &Ctx) -> anyhow::Result<PathBuf> {
    file(ctx, "victim.py", VICTIM_PY)
}

/// Starts `victim.py ARGS` under the shim (stats tag `tag`), its stdout to `out` when given,
/// and waits until it listens on `port`.
fn serve(
    ctx: &Ctx,
    tag: &str,
    extra: &str,
    port: u16,
    args: &str,
    out: Option<&Path>,
) -> anyhow::Result<Running> {
    let to = out
        .map(|o| format!(" > {}", o.display()))
        .unwrap_or_default();
    let run = ctx.spawn(&format!(
        "exec {} {} {} {args}{to}",
        shimmed(ctx, tag, extra)?,
        python(),
        victim(ctx)?.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port {port}"))?;
    Ok(run)
}

/// Runs a `victim.py` client to its end: under the shim with stats tag `tag` (None: plain),
/// `env` (`K=V` words) before it.
fn client(ctx: &Ctx, tag: Option<&str>, env: &str, args: &str) -> anyhow::Result<Captured> {
    let shim = match tag {
        Some(tag) => shimmed(ctx, tag, "")?,
        None => String::from("env"),
    };
    ctx.sh(&format!(
        "{shim} {env} {} {} {args}",
        python(),
        victim(ctx)?.display()
    ))
}

/// A `stream` client's bytes came back whole: its "echoed" line has the sha256 it sent and
/// `size` bytes, then EOF.
fn intact(c: &Captured, size: u64, what: &str) -> anyhow::Result<()> {
    let sent = c
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("sent "))
        .unwrap_or("?");
    ensure!(
        c.stdout.contains(&format!("echoed {sent} {size} eof")),
        "{what} did not come back intact: {}",
        c.stdout
    );
    Ok(())
}

/// The server's line starting with `word` (the first one after `nth` earlier ones).
fn nth_line<'a>(text: &'a str, word: &str, nth: usize) -> Option<&'a str> {
    text.lines().filter(|l| l.starts_with(word)).nth(nth)
}

/// A spoofed HELLO (the attack): an RDMA peer names a victim's TCP address, so the
/// server registers it and CLAIMs it when the victim's TCP connection is accepted. Whatever it
/// sends (CONFIRM and bytes before CLAIM, or after it), nothing reaches the app: the victim's
/// bytes are relayed over TCP intact, whether it speaks first, waits for a banner (at most the
/// bound for the proof, 10 s), or runs the shim itself; a HELLO whose address is not its
/// request's own source is refused outright.
fn spoofed_hello(ctx: &Ctx) -> anyhow::Result<()> {
    let (a, b) = (ctx.addr_a, ctx.addr_b);
    let srv_out = ctx.tmp.join("srv.out");
    let srv = serve(
        ctx,
        "srv",
        "STREAMSHIM_LOG=debug",
        9100,
        &format!("server {a} 9100 echo 2"),
        Some(&srv_out),
    )?;
    let served_victim = |cli: &Captured, who: &str| {
        ensure!(
            cli.stdout.contains("got b'reply-to:VICTIM-DATA'"),
            "{who} was not served: {}",
            cli.stdout
        );
        Ok(())
    };

    // 1. CONFIRM and a write before any CLAIM: the registration dies with the stream, the
    // victim (plain, speaking first) is served over TCP.
    let (run, out) = attack(
        ctx,
        "early",
        &format!(
            "connect a1 {a} 9100 {b} {b}:40123 confirm a1 write a1 EVIL-BEFORE-CLAIM sleep 1500"
        ),
    )?;
    wait_line(ctx, &out, "a1 ", Duration::from_secs(60))?;
    let text = finished(ctx, "early", run, &out)?;
    ensure!(
        text.contains("a1 established"),
        "the spoofed HELLO was not even accepted: {text}"
    );
    ensure!(
        text.contains("a1 disconnected"),
        "CONFIRM before CLAIM did not end the stream: {text}"
    );
    let cli = client(ctx, None, "", &format!("client {a} 9100 {b} 40123 echo"))?;
    served_victim(&cli, "the victim")?;

    // 2. The protocol's order (CLAIM, then CONFIRM and bytes) without the proof: the victim
    // speaks first and is relayed.
    let (run, out) = attack(
        ctx,
        "ordered",
        &format!(
            "connect a2 {a} 9100 {b} {b}:40124 wait_claim a2 30000 confirm a2 \
             write a2 EVIL-AFTER-CLAIM recv a2 3000"
        ),
    )?;
    wait_line(ctx, &out, "a2 established", Duration::from_secs(60))?;
    let cli = client(ctx, None, "", &format!("client {a} 9100 {b} 40124 echo"))?;
    let text = finished(ctx, "ordered", run, &out)?;
    ensure!(
        text.contains("a2 claim "),
        "the server never CLAIMed the spoofed registration: {text}"
    );
    ensure!(
        !text.contains("a2 got"),
        "the server app wrote to the attacker: {text}"
    );
    served_victim(&cli, "the victim")?;
    ensure!(ctx.wait("server", srv)?.success(), "the server failed");
    let served = std::fs::read_to_string(&srv_out)?;
    ctx.log(format_args!("server:\n{served}"));
    ensure!(
        !served.contains("EVIL"),
        "attacker bytes reached the app:\n{served}"
    );
    for i in 0..2 {
        let read = nth_line(&served, "read ", i).unwrap_or_default();
        ensure!(
            read.ends_with("b'VICTIM-DATA'"),
            "connection {i} read {read:?}:\n{served}"
        );
    }
    let server_counts = counts(ctx, "srv", "server")?;
    ensure!(
        !server_counts.keys().any(|k| k.starts_with("rdma")),
        "a spoofed connection counted as upgraded: {server_counts:?}"
    );

    // 3. A victim that waits for the server's banner: served after the bound for the proof.
    let srv = serve(
        ctx,
        "bsrv",
        "",
        9101,
        &format!("server {a} 9101 banner 1"),
        Some(&srv_out),
    )?;
    let (run, out) = attack(
        ctx,
        "silent",
        &format!(
            "connect a3 {a} 9101 {b} {b}:40125 wait_claim a3 30000 confirm a3 \
             write a3 EVIL-TO-A-SILENT-VICTIM recv a3 15000"
        ),
    )?;
    wait_line(ctx, &out, "a3 established", Duration::from_secs(60))?;
    let cli = client(ctx, None, "", &format!("client {a} 9101 {b} 40125 banner"))?;
    let text = finished(ctx, "silent", run, &out)?;
    ensure!(text.contains("a3 claim "), "no CLAIM: {text}");
    ensure!(
        ctx.wait("server", srv)?.success(),
        "the banner server failed"
    );
    let served = std::fs::read_to_string(&srv_out)?;
    ensure!(
        !served.contains("EVIL") && !text.contains("a3 got"),
        "{served}\n{text}"
    );
    let delay = cli
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("banner after "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|s| s.parse::<f64>().ok())
        .with_context(|| format!("no banner: {}", cli.stdout))?;
    served_victim(&cli, "the silent victim")?;
    ensure!(
        delay < 15.0,
        "the banner came after {delay} s (bound: 10 s for the proof)"
    );
    ctx.report(format_args!(
        "a silent victim whose address an attacker registered got its banner after {delay:.2} s"
    ));

    // 4. A shimmed victim whose address was registered first: its own HELLO is refused, it
    // stays on TCP; and a HELLO naming an address that is not its source is refused.
    let srv = serve(
        ctx,
        "ssrv",
        "",
        9102,
        &format!("server {a} 9102 echo 1"),
        Some(&srv_out),
    )?;
    let (run, out) = attack(
        ctx,
        "first",
        &format!(
            "connect a5 {a} 9102 {a} {b}:40127 connect a4 {a} 9102 {b} {b}:40126 \
             wait_claim a4 30000 confirm a4 write a4 EVIL-TO-A-SHIMMED-VICTIM recv a4 2000"
        ),
    )?;
    wait_line(ctx, &out, "a4 established", Duration::from_secs(60))?;
    let cli = client(
        ctx,
        Some("scli"),
        "",
        &format!("client {a} 9102 {b} 40126 echo"),
    )?;
    let text = finished(ctx, "first", run, &out)?;
    ensure!(
        text.contains("a5 rejected"),
        "a HELLO from another source was taken: {text}"
    );
    ensure!(ctx.wait("server", srv)?.success(), "the server failed");
    let served = std::fs::read_to_string(&srv_out)?;
    ensure!(
        !served.contains("EVIL") && !text.contains("a4 got"),
        "{served}\n{text}"
    );
    served_victim(&cli, "the shimmed victim")?;
    let victim_counts = counts(ctx, "scli", "client")?;
    ensure!(
        victim_counts.get("tcp PEER_REFUSED") == Some(&1),
        "the shimmed victim counted {victim_counts:?}"
    );
    Ok(())
}

/// Remote keys reach only their own connection: a write through one of the attacker's queue
/// pairs with another of its connections' keys (live), and with the key of a connection that
/// closed just before a victim's connection took its region, fails on the attacker's side
/// (remote access error); the victim's stream, running meanwhile, arrives intact.
fn foreign_rkeys(ctx: &Ctx) -> anyhow::Result<()> {
    let (a, b) = (ctx.addr_a, ctx.addr_b);
    let srv = serve(
        ctx,
        "srv",
        "",
        9200,
        &format!("stream-server {a} 9200 1"),
        None,
    )?;
    let paused = ctx.tmp.join("paused");
    let (run, out) = attack(
        ctx,
        "keys",
        &format!(
            "connect a1 {a} 9200 {b} {b}:41001 connect a2 {a} 9200 {b} {b}:41002 \
             write_to a2 a1 connect a3 {a} 9200 {b} {b}:41003 disconnect a1 sleep 1500 \
             wait_file {} 120000 write_to a3 a1",
            paused.display()
        ),
    )?;
    wait_line(ctx, &out, "a1 disconnected-by-us", Duration::from_secs(90))?;
    // The victim takes the region a1 left (the server keeps regions for the next connection).
    let cli = client(
        ctx,
        Some("cli"),
        &format!("SIZE=4194304 PAUSE_FILE={} PAUSE=4", paused.display()),
        &format!("client {a} 9200 0.0.0.0 0 stream"),
    )?;
    let text = finished(ctx, "keys", run, &out)?;
    ensure!(ctx.wait("server", srv)?.success(), "the server failed");
    // The server's device refuses the key: the attacker's write completes with a remote access
    // error (10), never a success.
    let statuses: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("write-status"))
        .collect();
    ensure!(
        statuses == ["a2 write-status 10", "a3 write-status 10"],
        "writes with another connection's key did not fail with a remote access error: \
         {statuses:?}\n{text}"
    );
    intact(&cli, 4 << 20, "the victim's stream")?;
    let c = counts(ctx, "cli", "client")?;
    ensure!(
        c.get("rdma UPGRADED") == Some(&1),
        "the victim did not upgrade: {c:?}"
    );
    Ok(())
}

/// Stale and phantom bytes never reach an app: a peer that bound its stream properly (its own
/// TCP connection, the proof, CONFIRM) and wrote a few bytes (given time to be delivered: a
/// bad write polled in the same batch fails the stream before they are, as a TCP reset
/// discards what was not read) then writes nothing with an immediate that claims 2 MiB
/// (the previous peer's bytes are in the region it took, unless cleared), or repeats a write's
/// position: the app reads what the peer really wrote, then ECONNRESET, never a byte of the
/// previous connection. A third marks a byte that already arrived as urgent: its stream
/// fails the same way, and nothing reaches the app out of band. A fourth moves its writes to
/// a ring the server never offered (SWITCH): its stream fails the same way.
fn phantom_bytes(ctx: &Ctx) -> anyhow::Result<()> {
    let (a, b) = (ctx.addr_a, ctx.addr_b);
    let srv_out = ctx.tmp.join("srv.out");
    let srv = serve(
        ctx,
        "srv",
        "",
        9300,
        &format!("server {a} 9300 sink 5"),
        Some(&srv_out),
    )?;
    // The previous peer: 1 MiB of its own through the region the attacker takes next.
    let prev = client(
        ctx,
        Some("prev"),
        "SIZE=1048576",
        &format!("client {a} 9300 0.0.0.0 0 stream"),
    )?;
    let prev_sha = prev
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("sent "))
        .unwrap_or("?")
        .to_owned();
    let (run, out) = attack(
        ctx,
        "phantom",
        &format!(
            "connect p1 {a} 9300 {b} own tcp p1 {a} 9300 wait_claim p1 30000 prove p1 confirm p1 \
             write p1 REAL-BYTES-OF-PEER-2 sleep 300 write_imm p1 - 2097152 sleep 1000 \
             connect p2 {a} 9300 {b} own tcp p2 {a} 9300 wait_claim p2 30000 prove p2 confirm p2 \
             write p2 ONE write_imm p2 ONE 3 sleep 1000 \
             connect p3 {a} 9300 {b} own tcp p3 {a} 9300 wait_claim p3 30000 prove p3 confirm p3 \
             write p3 TWO urgent p3 1 write p3 ! sleep 1000 \
             connect p4 {a} 9300 {b} own tcp p4 {a} 9300 wait_claim p4 30000 prove p4 confirm p4 \
             write p4 FOUR sleep 300 switch p4 4 write p4 ! sleep 1000"
        ),
    )?;
    let text = finished(ctx, "phantom", run, &out)?;
    ensure!(ctx.wait("server", srv)?.success(), "the server failed");
    let served = std::fs::read_to_string(&srv_out)?;
    ctx.log(format_args!("server:\n{served}"));
    ensure!(
        nth_line(&served, "read ", 0)
            .is_some_and(|l| l.starts_with("read 1048576 ") && l.contains(&prev_sha)),
        "the previous peer's bytes did not arrive: {served}"
    );
    let first = nth_line(&served, "read ", 1).unwrap_or_default();
    ensure!(
        first.starts_with("read 20 ") && first.ends_with("b'REAL-BYTES-OF-PEER-2'"),
        "the app read more (or less) than the peer wrote: {first:?}\n{served}"
    );
    let second = nth_line(&served, "read ", 2).unwrap_or_default();
    ensure!(
        second.starts_with("read 3 ") && second.ends_with("b'ONE'"),
        "{second:?}\n{served}"
    );
    let third = nth_line(&served, "read ", 3).unwrap_or_default();
    ensure!(
        third.starts_with("read 3 ") && third.ends_with("b'TWO'"),
        "a misplaced urgent mark: {third:?}\n{served}"
    );
    let fourth = nth_line(&served, "read ", 4).unwrap_or_default();
    ensure!(
        fourth.starts_with("read 4 ") && fourth.ends_with("b'FOUR'"),
        "a ring switch nobody offered: {fourth:?}\n{served}"
    );
    for i in 1..5 {
        ensure!(
            nth_line(&served, "end ", i) == Some("end error ECONNRESET"),
            "connection {i} did not read as a reset:\n{served}"
        );
    }
    for p in ["p1", "p2", "p3", "p4"] {
        ensure!(
            text.contains(&format!("{p} claim ")),
            "{p} never bound: {text}"
        );
    }
    let c = counts(ctx, "srv", "server")?;
    ensure!(
        c.get("rdma UPGRADED") == Some(&5),
        "the server counted {c:?}"
    );
    Ok(())
}

/// A flood of connect requests from one address (thousands, none ever completed: no queue
/// pair, no RTU): at most the per-peer cap of them holds anything at a time, so the server's
/// pinned memory and fds stay bounded; a stream that was moving keeps moving and arrives
/// intact; new connections from the flooded address fall back to TCP with a reason, and
/// upgrade again once the flood is over.
fn flood(ctx: &Ctx) -> anyhow::Result<()> {
    let (a, b) = (ctx.addr_a, ctx.addr_b);
    // The paced stream, three connections during the flood and three after it, and a last one.
    let srv = serve(
        ctx,
        "srv",
        "",
        9400,
        &format!("stream-server {a} 9400 8"),
        None,
    )?;
    let pid = srv.pid();
    thread::sleep(Duration::from_millis(500));
    let (pin0, fds0) = footprint(pid)?;
    let stream = ctx.spawn(&format!(
        "exec {} SIZE=16777216 PACE=1 {} {} client {a} 9400 0.0.0.0 0 stream",
        shimmed(ctx, "long", "")?,
        python(),
        victim(ctx)?.display()
    ))?;
    thread::sleep(Duration::from_secs(3));
    let (run, out) = attack(ctx, "flood", &format!("flood {a} 9400 {b} 2000 25000"))?;
    // The server's footprint, sampled while the flood lasts.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            let (mut pin_max, mut fds_max) = (0u64, 0usize);
            while !stop.load(Ordering::Acquire) {
                if let Ok((pin, fds)) = footprint(pid) {
                    pin_max = pin_max.max(pin);
                    fds_max = fds_max.max(fds);
                }
                thread::sleep(Duration::from_millis(250));
            }
            (pin_max, fds_max)
        })
    };
    thread::sleep(Duration::from_secs(3));
    let short = |tag: String| {
        client(
            ctx,
            Some(&tag),
            "SIZE=65536",
            &format!("client {a} 9400 0.0.0.0 0 stream"),
        )
    };
    let mut during = Vec::new();
    for i in 0..3 {
        during.push(short(format!("during{i}"))?);
    }
    let text = finished(ctx, "flood", run, &out)?;
    stop.store(true, Ordering::Release);
    let (pin_max, fds_max) = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("the sampler panicked"))?;
    let long = ctx.wait("the paced stream", stream)?;
    for (i, c) in during.iter().enumerate() {
        intact(c, 65536, &format!("connection {i} during the flood"))?;
    }
    // After the flood (its requests expire with the unattached bound, 10 s).
    thread::sleep(Duration::from_secs(12));
    for i in 0..3 {
        intact(
            &short(format!("after{i}"))?,
            65536,
            &format!("connection {i} after the flood"),
        )?;
    }
    let (pin_end, fds_end) = footprint(pid)?;
    // The server's last connection: a plain one that ends at once.
    ctx.sh(&format!(
        "{} -c 'import socket; socket.create_connection((\"{a}\", 9400)).close()'",
        python()
    ))?;
    ensure!(ctx.wait("server", srv)?.success(), "the server failed");
    intact(&long, 16 << 20, "the stream that was moving")?;
    let counted = |tag: &str| counts(ctx, tag, "client");
    ensure!(
        counted("long")?.get("rdma UPGRADED") == Some(&1),
        "the paced stream did not upgrade"
    );
    let mut during_counts = Vec::new();
    for i in 0..3 {
        during_counts.push(counted(&format!("during{i}"))?);
    }
    for i in 0..3 {
        let c = counted(&format!("after{i}"))?;
        ensure!(
            c.get("rdma UPGRADED") == Some(&1),
            "connection {i} after the flood counted {c:?}"
        );
    }
    // Accepted requests hold a region each (4168 KiB) until the unattached bound: at most the
    // per-peer cap (64) of them at once, plus the streams' and the kept ones.
    let per = 4168 * 1024;
    let bound = pin0 + (64 + 4 + 8) * per;
    ctx.report(format_args!(
        "flood: {} | server VmPin {} -> max {} -> {} MiB (bound {} MiB), fds {fds0} -> max \
         {fds_max} -> {fds_end} | during the flood: {during_counts:?}",
        text.lines()
            .find(|l| l.starts_with("flood "))
            .unwrap_or("?"),
        pin0 >> 20,
        pin_max >> 20,
        pin_end >> 20,
        bound >> 20
    ));
    ensure!(pin_max <= bound, "the flood pinned {} MiB", pin_max >> 20);
    ensure!(
        fds_max <= fds0 + 16,
        "the flood grew the server's fds from {fds0} to {fds_max}"
    );
    ensure!(fds_end <= fds0 + 4, "fds left behind: {fds0} -> {fds_end}");
    let accepted: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("flood sent "))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|n| n.parse().ok())
        .unwrap_or(usize::MAX);
    ensure!(
        accepted < 2000,
        "every request of the flood was accepted: {text}"
    );
    if pin_end > pin0 + 8 * per {
        bail!(
            "pinned memory left behind after the flood: {} -> {} MiB",
            pin0 >> 20,
            pin_end >> 20
        );
    }
    Ok(())
}

/// A listener that accepts a client's HELLO and never sends CLAIM (an attacker, or another
/// program, at the RDMA port of a TCP server that runs without the shim): the client's bytes
/// do not wait for it. A request the client sends once `connect()` returned is answered well
/// within the client's bound for CLAIM (the bytes went over TCP at once; they used to wait for
/// that bound), no byte goes to the listener, and the client counts the connection `tcp TIMEOUT`
/// once its bound passed.
fn never_claims(ctx: &Ctx) -> anyhow::Result<()> {
    const BOUND_MS: u64 = 3000;
    let (a, b) = (ctx.addr_a, ctx.addr_b);
    let srv_out = ctx.tmp.join("plain-srv.out");
    let srv = ctx.spawn(&format!(
        "exec {} {} server {a} 9104 line 1 > {}",
        python(),
        victim(ctx)?.display(),
        srv_out.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9104"))?;
    let (run, out) = attack(
        ctx,
        "mute",
        &format!("listen l1 {a} 9104 {}", BOUND_MS + 2000),
    )?;
    wait_line(ctx, &out, "l1 listening", Duration::from_secs(60))?;
    let cli = client(
        ctx,
        Some("mcli"),
        &format!("STREAMSHIM_NEGOTIATE_MS={BOUND_MS}"),
        &format!("client {a} 9104 {b} 0 line"),
    )?;
    let text = finished(ctx, "mute", run, &out)?;
    ensure!(
        text.contains("l1 accepted"),
        "the client's HELLO never reached the listener: {text}"
    );
    ensure!(
        text.contains("l1 claimed 0, got 0 bytes"),
        "the listener got something: {text}"
    );
    ensure!(ctx.wait("server", srv)?.success(), "the server failed");
    let (delay, reply) = cli
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("reply after "))
        .and_then(|l| l.split_once(" s: "))
        .and_then(|(s, r)| Some((s.parse::<f64>().ok()?, r.to_owned())))
        .with_context(|| format!("no reply: {}", cli.stdout))?;
    ensure!(
        reply == "b'reply-to:VICTIM-DATA\\n'",
        "the client got {reply}"
    );
    // From the connect's return (the RDMA connect before it takes seconds on a loaded TCG
    // guest): within half the bound, the request did not wait for CLAIM (it would have waited
    // all of it, counted from the kernel connect).
    let connected = cli
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("connected in "))
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .with_context(|| format!("no connect time: {}", cli.stdout))?;
    ensure!(
        (delay - connected) * 1000.0 < BOUND_MS as f64 / 2.0,
        "the reply came {:.3} s after the connect returned, with {BOUND_MS} ms to wait for CLAIM",
        delay - connected
    );
    let got = counts(ctx, "mcli", "client")?;
    ensure!(
        got.get("tcp TIMEOUT") == Some(&1) && got.len() == 1,
        "the client counted {got:?}"
    );
    ctx.report(format_args!(
        "a listener that never claims: the reply {:.3} s after the connect returned ({connected:.3} s) \
         (bound for CLAIM {BOUND_MS} ms)",
        delay - connected
    ));
    Ok(())
}

const DOOR_ATTACKER: &str = include_str!("scripts/door_attacker.py");

/// Another user's process (`nobody`) at the door of a shimmed `SO_REUSEPORT` listener: 100
/// watch requests (more than a door keeps) and a claim handing over its own TCP connection.
/// The holder closes every conversation unread: no watcher's place, no answer to the claim
/// (the reply pair it sent is dropped unanswered), no fd kept; and serves a shimmed client
/// upgraded as before.
fn foreign_door(ctx: &Ctx) -> anyhow::Result<()> {
    const WATCHES: usize = 100;
    let a = ctx.addr_a;
    let py = python();
    let server = file(ctx, "reuseport_server.py", REUSEPORT_SERVER)?;
    let stop = ctx.tmp.join("door.stop");
    let srv = ctx.spawn(&format!(
        "exec {} {py} {} {a} 9230 {}",
        shimmed(ctx, "dsrv", "")?,
        server.display(),
        stop.display()
    ))?;
    let pid = srv.pid();
    ctx.sh(&format!("{WAIT_PORT} wait_port 9230"))?;
    ctx.sh(&format!(
        "for _ in $(seq 1 400); do ss -lxH | grep -q '@rdma-streams/port/{a}:9230 ' && exit 0; \
         sleep 0.05; done; echo 'the holder never opened its door' >&2; exit 1"
    ))?;
    let (_, fds_before) = footprint(pid)?;
    let attacker = file(ctx, "door_attacker.py", DOOR_ATTACKER)?;
    let out = ctx.sh(&format!(
        "{py} {} {a} 9230 {WATCHES} 65534",
        attacker.display()
    ))?;
    let said = out.stdout.trim();
    ctx.report(format_args!("another user at the door: {said}"));
    ensure!(
        said == format!("closed {WATCHES} of {WATCHES}; claim answered b''"),
        "the holder served another user's process: {said}"
    );
    // Nothing of the attacker's kept (its TCP connection, served by the echo loop until the
    // attacker exited, is closed too).
    let mut fds_after = footprint(pid)?.1;
    for _ in 0..100 {
        if fds_after <= fds_before {
            break;
        }
        thread::sleep(Duration::from_millis(50));
        fds_after = footprint(pid)?.1;
    }
    ensure!(
        fds_after <= fds_before,
        "the holder's fds: {fds_before} before the attacker, {fds_after} after"
    );
    let client = file(ctx, "line_client.py", LINE_CLIENT)?;
    let answers = ctx.sh(&format!(
        "{} {py} {} {a} 9230 2",
        shimmed(ctx, "dcli", "")?,
        client.display()
    ))?;
    ensure!(
        answers.stdout.lines().count() == 2,
        "the client got {:?}",
        answers.stdout
    );
    for name in ["door.stop", "door.stop.exit"] {
        std::fs::write(ctx.tmp.join(name), b"")?;
    }
    ensure!(ctx.wait("server", srv)?.success(), "the server failed");
    let got = counts(ctx, "dcli", "client")?;
    ensure!(
        got.get("rdma UPGRADED") == Some(&2) && got.len() == 1,
        "the client counted {got:?}"
    );
    ctx.report(format_args!(
        "the holder's fds {fds_before} before the attacker, {fds_after} after; then {got:?}"
    ));
    Ok(())
}

/// A connection through a Service's virtual IP waits for its backend to connect back to the
/// client's own address: an impostor on the fabric connects back first. A shimmed client on
/// guest B connects through a VIP (nftables DNAT, as kube-proxy programs it) to a shimmed
/// echo server on guest A that accepts only once the attack is under way; as soon as the
/// client's port is known, the attacker on A connects to it with a HELLO flagged back naming
/// it (the client's listener takes it: anyone may name an address), takes the client's CLAIM,
/// sends CONFIRM and writes on the stream. It cannot write the CLAIM's secret into the client's TCP connection, so the
/// client never binds: the attacker's bytes never reach the app, nothing of the app's reaches
/// the attacker, and the connection goes on over TCP once the backend accepted, every echo
/// exact (client and server count `PEER_NOT_SHIMMED`, the backend's own connection back
/// refused: the listener took one peer; the client's connection outlives its wait for a
/// connection back).
fn impostor_back(ctx: &Ctx) -> anyhow::Result<()> {
    const VIP: &str = "10.96.0.12";
    let (a, b) = (ctx.addr_a, ctx.addr_b);
    let py = python();
    let cue = ctx.work.join("impostor-port");
    match ctx.role {
        rdma_streams_softroce::Role::A => {
            let server = file(ctx, "gated_echo.py", GATED_ECHO)?;
            let gate = ctx.tmp.join("accept-now");
            let srv = ctx.spawn(&format!(
                "{} {py} {} {a} 9793 {}",
                shimmed(ctx, "impsrv", "")?,
                server.display(),
                gate.display()
            ))?;
            ctx.sh(&format!("{WAIT_PORT} wait_port 9793"))?;
            // Compiled before the race starts.
            attacker(ctx)?;
            ctx.barrier("impostor-listening")?;
            let port = wait_cue(&cue)?;
            let mut hello = String::from("530101");
            hello.push_str("0102030405060708");
            hello.push_str(&format!("04{port:04x}"));
            for octet in b.octets() {
                hello.push_str(&format!("{octet:02x}"));
            }
            let (run, out) = attack(
                ctx,
                "impostor",
                &format!(
                    "raw_connect x {b} {port} {a} {hello} wait_claim x 10000 confirm x \
                     write x EVIL-BACK recv x 3000 disconnect x"
                ),
            )?;
            // The backend accepts once the impostor holds the client's listener (or gave up).
            let held = wait_line(ctx, &out, "x ", Duration::from_secs(60));
            std::fs::write(&gate, "")?;
            held?;
            let text = finished(ctx, "impostor", run, &out)?;
            ctx.report(format_args!(
                "an impostor connecting back to a client through a Service: {}",
                text.lines().collect::<Vec<_>>().join("; ")
            ));
            ensure!(
                text.contains("x established"),
                "the client's listener did not take the impostor: {text}"
            );
            ensure!(text.contains("x claim "), "no CLAIM came: {text}");
            ensure!(
                !text.contains("x got"),
                "the client's app wrote to the impostor: {text}"
            );
            ensure!(ctx.wait("server", srv)?.success(), "the server failed");
            let server_counts = counts(ctx, "impsrv", "server")?;
            ensure!(
                server_counts.get("tcp PEER_NOT_SHIMMED") == Some(&1) && server_counts.len() == 1,
                "the server counted {server_counts:?}"
            );
            ctx.barrier("impostor-done")
        }
        _ => {
            ctx.barrier("impostor-listening")?;
            let nic = service_dnat(ctx, ("imp", VIP), b, &[(80, format!("{a}:9793"))])?;
            let result = (|| {
                let rounds = file(ctx, "rounds_client.py", super::shim_wire::ROUNDS_CLIENT)?;
                let said = ctx.tmp.join("impcli.out");
                let cli = ctx.spawn(&format!(
                    "{} {py} {} {VIP} 80 1 10 > {} 2>&1",
                    shimmed(
                        ctx,
                        "impcli",
                        "STREAMSHIM_SERVICE_CIDRS=10.96.0.0/12 STREAMSHIM_NEGOTIATE_MS=3000"
                    )?,
                    rounds.display(),
                    said.display()
                ))?;
                let text = wait_line(ctx, &said, "connected ", Duration::from_secs(60))?;
                let port = text
                    .lines()
                    .find_map(|l| l.strip_prefix("connected "))
                    .unwrap_or_default()
                    .trim()
                    .to_owned();
                std::fs::write(&cue, &port)?;
                let out = ctx.wait("client", cli)?;
                let text = std::fs::read_to_string(&said).unwrap_or_default();
                ctx.log(format_args!("client:\n{text}"));
                ensure!(
                    out.success() && text.contains("rounds ok"),
                    "the client failed: {out}\n{text}"
                );
                let client_counts = counts(ctx, "impcli", "client")?;
                ensure!(
                    client_counts.get("tcp PEER_NOT_SHIMMED") == Some(&1)
                        && client_counts.len() == 1,
                    "the client counted {client_counts:?}"
                );
                Ok(())
            })();
            let cleanup = undo_service_dnat(ctx, ("imp", VIP), &nic);
            result?;
            cleanup?;
            ctx.barrier("impostor-done")
        }
    }
}

/// The port another guest wrote to `cue`, within a minute.
fn wait_cue(cue: &Path) -> anyhow::Result<u16> {
    for _ in 0..600 {
        if let Ok(text) = std::fs::read_to_string(cue)
            && let Ok(port) = text.trim().parse()
        {
            return Ok(port);
        }
        thread::sleep(Duration::from_millis(100));
    }
    bail!("no port in {} within a minute", cue.display())
}

/// A finished connection's queue pair carries the next connection only as a new connect
/// request would (docs/shim-protocol.md, "Reused connections"): an attacker that held a proven
/// connection (its own TCP connection, proof, CONFIRM, bytes both ways, FIN each way) sends
/// REUSE naming a victim's TCP address. The server judges it as it judges a connect request and
/// registers the address (REUSED), CLAIMs it when the victim's TCP connection is accepted, and
/// without the proof relays the victim over TCP: nothing of the victim reaches the attacker,
/// nothing of the attacker's reaches the app. A REUSE before the attacker's FIN, and one naming
/// an address that is not the queue pair's own source, end the connection instead.
fn reused_connection(ctx: &Ctx) -> anyhow::Result<()> {
    let (a, b) = (ctx.addr_a, ctx.addr_b);
    let srv_out = ctx.tmp.join("srv.out");
    let srv = serve(
        ctx,
        "srv",
        "STREAMSHIM_LOG=debug",
        9130,
        &format!("server {a} 9130 echo 4"),
        Some(&srv_out),
    )?;
    // A connection of the attacker's own, proven and bound, its bytes both ways.
    let proven = |n: &str| {
        format!(
            "connect {n} {a} 9130 {b} own tcp {n} {a} 9130 wait_claim {n} 30000 prove {n} \
             confirm {n} write {n} LEGIT-{n}"
        )
    };
    // 1. Ended in order, then REUSE naming the victim's address: judged and registered, then
    // CLAIMed for the victim, who is relayed over TCP.
    let (run, out) = attack(
        ctx,
        "reuse",
        &format!(
            "{} fin a1 recv a1 1500 reuse a1 {b}:40130 wait_claim a1 30000 confirm a1 \
             write a1 EVIL-ON-A-REUSED-PAIR recv a1 3000",
            proven("a1")
        ),
    )?;
    wait_line(ctx, &out, "a1 reuse-status", Duration::from_secs(90))?;
    let cli = client(ctx, None, "", &format!("client {a} 9130 {b} 40130 echo"))?;
    let text = finished(ctx, "reuse", run, &out)?;
    ensure!(
        text.contains("a1 got") && text.contains("reply-to:LEGIT-a1"),
        "the attacker's own connection was not served: {text}"
    );
    ensure!(
        text.contains("a1 control 10"),
        "the REUSE was not taken (no REUSED): {text}"
    );
    ensure!(
        text.contains("a1 claim "),
        "the server never CLAIMed the reused registration: {text}"
    );
    ensure!(
        !text.contains("VICTIM"),
        "the victim's bytes reached the attacker: {text}"
    );
    ensure!(
        cli.stdout.contains("got b'reply-to:VICTIM-DATA'"),
        "the victim was not served: {}",
        cli.stdout
    );

    // 2. REUSE before the attacker's FIN: the connection ends.
    let (run, out) = attack(
        ctx,
        "early",
        &format!("{} reuse a2 own recv a2 3000", proven("a2")),
    )?;
    let text = finished(ctx, "early", run, &out)?;
    ensure!(
        text.contains("a2 disconnected") && !text.contains("a2 control 10"),
        "a REUSE before FIN did not end the connection: {text}"
    );

    // 3. REUSE naming an address that is not the queue pair's source: refused (a disconnect).
    let (run, out) = attack(
        ctx,
        "elsewhere",
        &format!(
            "{} fin a3 recv a3 1500 reuse a3 {a}:40132 recv a3 3000",
            proven("a3")
        ),
    )?;
    let text = finished(ctx, "elsewhere", run, &out)?;
    ensure!(
        text.contains("a3 disconnected") && !text.contains("a3 control 10"),
        "a REUSE naming another address was taken: {text}"
    );

    ensure!(ctx.wait("server", srv)?.success(), "the server failed");
    let served = std::fs::read_to_string(&srv_out)?;
    ctx.log(format_args!("server:\n{served}"));
    ensure!(
        !served.contains("EVIL"),
        "attacker bytes reached the app:\n{served}"
    );
    ensure!(
        nth_line(&served, "read ", 1).is_some_and(|l| l.ends_with("b'VICTIM-DATA'")),
        "the victim's bytes did not reach the app whole:\n{served}"
    );
    let server_counts = counts(ctx, "srv", "server")?;
    ctx.report(format_args!("server counts: {server_counts:?}"));
    Ok(())
}
