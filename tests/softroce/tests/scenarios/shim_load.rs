//! Many connections: 1,000 short ones in a row (every one upgraded; open fds, threads and
//! pinned memory of both processes back where they were), and 64 at once, each checked with
//! sha256, with part of their bytes read straight from the rings (direct reads), then 8 with
//! direct reads off.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use rdma_streams_softroce::{Ctx, Scenario, Topology};
use serde_json::Value;

use super::support::{WAIT_PORT, direct_bytes, expect_counts, file, python, shimmed};

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
const SERVER: &str = r#"
import os, selectors, socket, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sel = selectors.DefaultSelector()
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((host, port))
ls.listen(128)
ls.setblocking(False)
sel.register(ls, selectors.EVENT_READ)
done = 0
while done < n:
    for key, _ in sel.select():
        s = key.fileobj
        if s is ls:
            c, _ = ls.accept()
            c.setblocking(False)
            sel.register(c, selectors.EVENT_READ)
            continue
        try:
            b = s.recv(65536)
        except BlockingIOError:
            continue
        if b:
            s.setblocking(True)
            s.sendall(b)
            s.setblocking(False)
        else:
            sel.unregister(s)
            s.close()
            done += 1
"#;

/// Makes `n` connections one after the other (each: a line out, the same line back, close),
/// after one warm-up connection and before a last one that ends the server; prints the
/// resources of itself and of the server before the run and after it, as JSON.
const CLIENT: &str = r#"
import json, os, socket, sys, time
host, port, n, server = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def res(pid):
    st = open(f"/proc/{pid}/status").read()
    field = lambda k: int(next(l.split()[1] for l in st.splitlines() if l.startswith(k + ":")))
    return {"fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": field("Threads"),
            "vmpin_kib": field("VmPin")}

def one(i):
    msg = (b"%d:" % i) * 40
    s = socket.create_connection((host, port))
    s.sendall(msg)
    s.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
    s.close()
    assert got == msg, (i, len(got), len(msg))

def settle(pid_list, target=None):
    # The engines finish each stream's teardown (FIN both ways, then a CM disconnect) a
    # little after the app's close: wait (at most 30 s) until nothing is pinned and the counts
    # are back at `target`, or, without one, hold still for a second.
    last, still = None, 0
    for _ in range(150):
        now = [res(p) for p in pid_list]
        if all(r["vmpin_kib"] == 0 for r in now):
            if target is not None and now == target:
                return
            still = still + 1 if now == last else 0
            if target is None and still >= 5:
                return
        last = now
        time.sleep(0.2)

def fds_of(pid):
    out = []
    for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
        try:
            out.append("%s -> %s" % (fd, os.readlink(f"/proc/{pid}/fd/{fd}")))
        except OSError:
            pass
    return out

me = os.getpid()
start = {"client": res(me), "server": res(server)}
one(0)
settle([me, server])
before = {"client": res(me), "server": res(server)}
t0 = time.time()
for i in range(1, n + 1):
    one(i)
elapsed = time.time() - t0
settle([me, server], [before["client"], before["server"]])
after = {"client": res(me), "server": res(server)}
if after != before:
    print("fds of the server:", fds_of(server), file=sys.stderr)
    print("fds of the client:", fds_of(me), file=sys.stderr)
one(n + 1)  # the last one lets the server finish (and write its stats) after the measurement
print(json.dumps({"start": start, "before": before, "after": after, "seconds": elapsed}))
"#;

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
    expect_counts(ctx, "srv", "server", &[("rdma UPGRADED", u64::from(N) + 2)])
}

/// 64 threads, each its own connection to a thread-per-connection echo server, 2 MiB of random
/// bytes each way, checked with sha256 on arrival. The server reads with `MSG_WAITALL` when its
/// fifth argument says `waitall` (64 KiB at a time: 2 MiB is 32 of them), the client with plain
/// `recv`.
const CONCURRENT: &str = r#"
import hashlib, os, socket, socketserver, sys, threading
mode, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
flags = socket.MSG_WAITALL if sys.argv[5:] == ["waitall"] else 0
SIZE = 2 << 20

if mode == "server":
    class H(socketserver.BaseRequestHandler):
        def handle(self):
            h = hashlib.sha256()
            while True:
                b = self.request.recv(65536, flags)
                if not b:
                    break
                h.update(b)
                self.request.sendall(b)
    class S(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = False
        request_queue_size = 128
    with S((host, port), H) as s:
        for _ in range(n):
            s.handle_request()
        s.server_close()
        for t in threading.enumerate():
            if t is not threading.current_thread():
                t.join()
    sys.exit(0)

errors = []
# Connected one after another, then all carried at once: 64 connects in the same instant make
# the engines set up 64 RDMA connections back to back, which on a loaded TCG host can outlast
# the negotiation bound (a timing limit, not what this test is about).
socks = [socket.create_connection((host, port)) for _ in range(n)]
def one(i):
    try:
        data = os.urandom(SIZE)
        s = socks[i]
        def send():
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        t = threading.Thread(target=send)
        t.start()
        h = hashlib.sha256()
        got = 0
        while True:
            b = s.recv(65536)
            if not b:
                break
            h.update(b)
            got += len(b)
        t.join()
        s.close()
        if h.digest() != hashlib.sha256(data).digest():
            errors.append(f"connection {i}: {got} bytes, sha256 differs")
    except Exception as e:
        errors.append(f"connection {i}: {e!r}")
threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("errors", len(errors), errors[:5])
sys.exit(1 if errors else 0)
"#;

/// 64 echo connections at once from one threaded client to one threaded server (reading with
/// MSG_WAITALL), 2 MiB each way each, sha256-checked; then 8 with the client's direct reads and
/// writes off.
fn concurrent(ctx: &Ctx) -> anyhow::Result<()> {
    const N: u64 = 64;
    let a = ctx.addr_a;
    let py = python();
    let prog = file(ctx, "concurrent.py", CONCURRENT)?;
    let srv = ctx.spawn(&format!(
        "{} {py} {} server {a} 9500 {N} waitall",
        shimmed(ctx, "srv", "")?,
        prog.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9500"))?;
    // The client connects one after another (see the program), each within the largest
    // negotiation bound the shim takes, then moves all 64 streams at once.
    ctx.sh(&format!(
        "{} {py} {} client {a} 9500 {N}",
        shimmed(ctx, "cli", "STREAMSHIM_NEGOTIATE_MS=10000")?,
        prog.display()
    ))?;
    ensure!(ctx.wait("server", srv)?.success(), "the echo server failed");
    expect_counts(ctx, "cli", "client", &[("rdma UPGRADED", N)])?;
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
    const OFF: u64 = 8;
    let srv = ctx.spawn(&format!(
        "{} {py} {} server {a} 9501 {OFF}",
        shimmed(ctx, "srvoff", "")?,
        prog.display()
    ))?;
    ctx.sh(&format!("{WAIT_PORT} wait_port 9501"))?;
    ctx.sh(&format!(
        "{} {py} {} client {a} 9501 {OFF}",
        shimmed(
            ctx,
            "clioff",
            "STREAMSHIM_NEGOTIATE_MS=10000 STREAMSHIM_DIRECT_READ=0 STREAMSHIM_DIRECT_WRITE=0"
        )?,
        prog.display()
    ))?;
    ensure!(ctx.wait("server", srv)?.success(), "the echo server failed");
    expect_counts(ctx, "clioff", "client", &[("rdma UPGRADED", OFF)])?;
    let off = direct_bytes(ctx, "clioff")?;
    ensure!(
        off == (0, 0),
        "STREAMSHIM_DIRECT_READ=0 STREAMSHIM_DIRECT_WRITE=0, yet {} bytes were read and {} \
         written directly",
        off.0,
        off.1
    );
    Ok(())
}
