//! Phase 2: real programs upgraded to rsocket streams through the fake provider, each case in
//! its own network namespace (lo up) with a hard timeout, the shim in both, one or neither of
//! client and server, policy `loopback: true`. Bytes are checked with sha256; the fake
//! provider's counters (`FAKE_RSOCKET_STATS_DIR`) prove which path carried them.

mod common;

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use common::*;
use sha2::{Digest, Sha256};

const MIB: u64 = 1 << 20;

/// A work dir with `www/blob.bin` (20 MiB pseudo-random), `pol.yaml` and `fk/`.
fn setup() -> (tempfile::TempDir, Vec<u8>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let w = dir.path();
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let data: Vec<u8> = (0..20 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[5]
        })
        .collect();
    std::fs::create_dir(w.join("www")).expect("mkdir www");
    std::fs::create_dir(w.join("fk")).expect("mkdir fk");
    std::fs::write(w.join("www/blob.bin"), &data).expect("write blob");
    std::fs::write(w.join("pol.yaml"), "version: 1\nloopback: true\n").expect("write policy");
    (dir, data)
}

/// Shell words that run a command under the shim with the fake provider (stats `$W/<who>-%p`).
fn shimmed(who: &str) -> String {
    shimmed_with(who, "pol.yaml")
}

/// [`shimmed`] with the policy file `$W/<policy>`.
fn shimmed_with(who: &str, policy: &str) -> String {
    format!(
        "env LD_PRELOAD=\"$SHIM\" STREAMSHIM_PROVIDER=\"$FAKE\" STREAMSHIM_POLICY=\"$W/{policy}\" \
         FAKE_RSOCKET_STATS_DIR=\"$W/fk\" STREAMSHIM_STATS=\"$W/{who}-%p.json\""
    )
}

fn env(w: &Path) -> Vec<(&'static str, OsString)> {
    vec![
        ("W", OsString::from(w)),
        ("FAKE", fake_lib().into_os_string()),
    ]
}

/// python3 http.server on 8080 (shimmed or not) and curl (shimmed or not, `curl_env` in front)
/// fetching `urls` blobs; returns the work dir and the data.
fn http(
    server_shim: bool,
    client_shim: bool,
    curl_env: &str,
    urls: usize,
) -> (tempfile::TempDir, Vec<u8>) {
    http_with(server_shim, client_shim, curl_env, urls, None)
}

/// [`http`] with a policy of its own for the server.
fn http_with(
    server_shim: bool,
    client_shim: bool,
    curl_env: &str,
    urls: usize,
    server_policy: Option<&str>,
) -> (tempfile::TempDir, Vec<u8>) {
    let (dir, data) = setup();
    let w = dir.path();
    let srv = match (server_shim, server_policy) {
        (false, _) => String::new(),
        (true, None) => shimmed("srv"),
        (true, Some(text)) => {
            std::fs::write(w.join("srv-pol.yaml"), text).expect("write server policy");
            shimmed_with("srv", "srv-pol.yaml")
        }
    };
    let cli = if client_shim {
        shimmed("cli")
    } else {
        String::new()
    };
    let mut args = String::new();
    for i in 0..urls {
        args.push_str(&format!(
            " -o \"$W/got{i}.bin\" http://127.0.0.1:8080/blob.bin"
        ));
    }
    let script = format!(
        "{WAIT_PORT}
cd \"$W/www\"
{srv} \"$PY\" -m http.server --bind 127.0.0.1 8080 >\"$W/srv.out\" 2>\"$W/srv.err\" &
srv=$!
wait_port 8080
{cli} {curl_env} curl -sS -w '%{{time_connect}}\\n' {args} >\"$W/curl.out\" 2>\"$W/cli.err\"
kill -INT $srv
wait $srv
"
    );
    netns(&script, &env(w), Duration::from_secs(90));
    for i in 0..urls {
        let got = std::fs::read(w.join(format!("got{i}.bin"))).expect("curl output");
        assert_eq!(got.len(), data.len(), "length of download {i}");
        assert!(
            Sha256::digest(&got) == Sha256::digest(&data),
            "sha256 of download {i} differs"
        );
    }
    // The server saw exactly the requests: no stray byte became a bad request line.
    let srv_err = std::fs::read_to_string(w.join("srv.err")).expect("srv.err");
    let gets = srv_err
        .lines()
        .filter(|l| l.contains("\"GET /blob.bin HTTP/1.1\" 200"))
        .count();
    assert_eq!(gets, urls, "server log:\n{srv_err}");
    assert!(!srv_err.contains("code 400"), "{srv_err}");
    (dir, data)
}

#[test]
fn http_both_shimmed_is_upgraded() {
    let (dir, _) = http(true, true, "", 1);
    let w = dir.path();
    let cli = one_stats(w, "cli-");
    assert_upgraded(&cli, "client", 1);
    assert_no_counts(&cli, "server");
    let srv = one_stats(w, "srv-");
    assert_upgraded(&srv, "server", 1);
    assert_no_counts(&srv, "client");
    let (sent, received, files) = fake_bytes(&w.join("fk"));
    assert_eq!(files, 2, "one fake stats file per process");
    assert!(sent >= 20 * MIB, "fake provider sent only {sent} bytes");
    assert!(
        received >= 20 * MIB,
        "fake provider received only {received} bytes"
    );
    let cli_err = std::fs::read_to_string(w.join("cli.err")).expect("cli.err");
    assert_eq!(cli_err, "", "curl stderr");
}

#[test]
fn http_server_only_shimmed_is_peer_not_shimmed() {
    let (dir, _) = http(true, false, "", 1);
    let w = dir.path();
    let srv = one_stats(w, "srv-");
    assert_counts(&srv, "server", "PEER_NOT_SHIMMED", 1);
    let (sent, received, _) = fake_bytes(&w.join("fk"));
    assert_eq!(
        (sent, received),
        (0, 0),
        "no byte went through the fake provider"
    );
}

#[test]
fn http_client_only_shimmed_is_peer_not_shimmed_then_cached() {
    // Two downloads in one curl process: http.server (HTTP/1.0) closes after each response, so
    // curl connects twice; the second connect finds the peer in the negative cache.
    let (dir, _) = http(false, true, "", 2);
    let w = dir.path();
    let cli = one_stats(w, "cli-");
    assert_eq!(
        cli["client"]["tcp"],
        serde_json::json!({"PEER_NOT_SHIMMED": 1, "NEGATIVE_CACHE": 1}),
        "{cli}"
    );
    assert_eq!(cli["client"]["total"]["rdma"], 0, "{cli}");
    let (sent, received, _) = fake_bytes(&w.join("fk"));
    assert_eq!(
        (sent, received),
        (0, 0),
        "no byte went through the fake provider"
    );
}

#[test]
fn hanging_rconnect_falls_back_within_the_bound() {
    // Two connections from one curl: the first waits for the negotiation bound (200 ms), the
    // second finds the peer in the negative cache and does not wait.
    let (dir, _) = http(true, true, "FAKE_RSOCKET_FAULTS=hang_connect", 2);
    let w = dir.path();
    let cli = one_stats(w, "cli-");
    assert_eq!(
        cli["client"]["tcp"],
        serde_json::json!({"TIMEOUT": 1, "NEGATIVE_CACHE": 1}),
        "{cli}"
    );
    assert_eq!(cli["client"]["total"]["rdma"], 0, "{cli}");
    let srv = one_stats(w, "srv-");
    assert_counts(&srv, "server", "PEER_NOT_SHIMMED", 2);
    let out = std::fs::read_to_string(w.join("curl.out")).expect("curl.out");
    let times: Vec<f64> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert_eq!(times.len(), 2, "time_connect lines in {out:?}");
    assert!(
        times[0] >= 0.15 && times[0] < 1.0,
        "first connect took {} s (bound 200 ms)",
        times[0]
    );
    assert!(times[1] < 0.1, "cached connect took {} s", times[1]);
}

#[test]
fn server_policy_refusal_is_peer_refused() {
    let (dir, _) = http_with(
        true,
        true,
        "",
        1,
        Some("version: 1\nloopback: true\nserver: {deny: [{ports: [8080]}]}\n"),
    );
    let w = dir.path();
    assert_counts(&one_stats(w, "cli-"), "client", "PEER_REFUSED", 1);
    assert_counts(&one_stats(w, "srv-"), "server", "POLICY", 1);
    let (sent, received, _) = fake_bytes(&w.join("fk"));
    assert!(
        sent < 1024 && received < 1024,
        "only the side channel went through the fake provider: {sent}/{received}"
    );
}

const ECHO: &str = r#"
import asyncio, hashlib, os, sys

PORT = 9000

async def server():
    done = asyncio.get_running_loop().create_future()
    async def handle(r, w):
        while True:
            chunk = await r.read(65536)
            if not chunk:
                break
            w.write(chunk)
            await w.drain()
        w.close()
        await w.wait_closed()
        done.set_result(None)
    srv = await asyncio.start_server(handle, "127.0.0.1", PORT)
    async with srv:
        await done

async def client():
    data = os.urandom(1 << 20)
    r, w = await asyncio.open_connection("127.0.0.1", PORT)
    peer = w.get_extra_info("peername")
    assert peer == ("127.0.0.1", PORT), peer
    async def send():
        for i in range(0, len(data), 100000):
            w.write(data[i:i + 100000])
            await w.drain()
        w.write_eof()
    t = asyncio.create_task(send())
    got = await r.read(-1)
    await t
    w.close()
    assert got == data, (len(got), len(data))
    print("echo ok", hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest())

asyncio.run(server() if sys.argv[1] == "server" else client())
"#;

#[test]
fn asyncio_echo_both_shimmed_is_upgraded() {
    let (dir, _) = setup();
    let w = dir.path();
    std::fs::write(w.join("echo.py"), ECHO).expect("write echo.py");
    let srv = shimmed("srv");
    let cli = shimmed("cli");
    let script = format!(
        "{WAIT_PORT}
{srv} \"$PY\" \"$W/echo.py\" server >\"$W/srv.out\" 2>\"$W/srv.err\" &
srv=$!
wait_port 9000
{cli} \"$PY\" \"$W/echo.py\" client 2>\"$W/cli.err\"
wait $srv
"
    );
    let run = netns(&script, &env(w), Duration::from_secs(60));
    assert!(run.stdout.contains("echo ok True"), "{run:?}");
    for f in ["cli.err", "srv.err"] {
        let err = std::fs::read_to_string(w.join(f)).expect("stderr file");
        assert_eq!(err, "", "{f}");
    }
    assert_upgraded(&one_stats(w, "cli-"), "client", 1);
    assert_upgraded(&one_stats(w, "srv-"), "server", 1);
    let (sent, received, _) = fake_bytes(&w.join("fk"));
    assert!(
        sent >= MIB && received >= MIB,
        "fake carried {sent}/{received}"
    );
}

/// A pre-fork server: socket/bind/listen in the parent, two forked children that each accept
/// and echo until no connection comes for 3 s; the parent only waits. Its side-channel thread
/// (the parent's) holds every pending upgrade, but the children accept: no ACCEPT ever reaches
/// a client, so every client falls back to TCP (`TIMEOUT`) and no server side swaps.
const PREFORK: &str = r#"
import os, socket, sys

PORT = 9100
ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", PORT))
ls.listen(64)
ls.settimeout(3.0)
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        served = 0
        while True:
            try:
                c, _ = ls.accept()
            except socket.timeout:
                break
            c.settimeout(None)
            with c:
                while True:
                    b = c.recv(65536)
                    if not b:
                        break
                    c.sendall(b)
            served += 1
        # One write(2) per line: the children share stdout.
        os.write(1, ("child served %d\n" % served).encode())
        sys.exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print("parent done", flush=True)
"#;

/// One connection: 64 KiB out, the same 64 KiB back, byte-exact.
const ECHO_CLIENT: &str = r#"
import os, socket, sys
data = os.urandom(64 << 10)
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(data)
s.shutdown(socket.SHUT_WR)
got = bytearray()
while True:
    b = s.recv(65536)
    if not b:
        break
    got += b
s.close()
assert bytes(got) == data, (len(got), len(data))
print("echo ok")
"#;

#[test]
fn prefork_server_never_hangs_and_stays_tcp() {
    let (dir, _) = setup();
    let w = dir.path();
    std::fs::write(w.join("prefork.py"), PREFORK).expect("write prefork.py");
    std::fs::write(w.join("client.py"), ECHO_CLIENT).expect("write client.py");
    let srv = shimmed("srv");
    let cli = shimmed("cli");
    // 20 client processes (each its own negative cache, so each one negotiates), 10 at a time.
    let script = format!(
        "{WAIT_PORT}
{srv} \"$PY\" \"$W/prefork.py\" >\"$W/srv.out\" 2>\"$W/srv.err\" &
srv=$!
wait_port 9100
for batch in 0 1; do
  pids=\"\"
  for i in 0 1 2 3 4 5 6 7 8 9; do
    {cli} \"$PY\" \"$W/client.py\" 9100 >\"$W/cli$batch$i.out\" 2>\"$W/cli$batch$i.err\" &
    pids=\"$pids $!\"
  done
  for p in $pids; do wait $p; done
done
wait $srv
cat \"$W\"/cli*.out
cat \"$W/srv.out\"
"
    );
    let run = netns(&script, &env(w), Duration::from_secs(60));
    assert_eq!(run.stdout.matches("echo ok").count(), 20, "{run:?}");
    assert!(run.stdout.contains("parent done"), "{run:?}");
    // The two children share stdout: their lines may interleave, so take every
    // "child served N" wherever it starts.
    let served: u64 = run
        .stdout
        .split("child served ")
        .skip(1)
        .map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u64>().expect("served count")
        })
        .sum();
    assert_eq!(served, 20, "{run:?}");
    let err = std::fs::read_to_string(w.join("srv.err")).expect("srv.err");
    assert_eq!(err, "", "server stderr");
    let (cli_tcp, cli_rdma) = sum_counts(w, "cli-", "client");
    assert_eq!(
        serde_json::Value::Object(cli_tcp),
        serde_json::json!({"TIMEOUT": 20}),
        "client tcp counters"
    );
    assert_eq!(cli_rdma, 0, "no client upgraded");
    let (srv_tcp, srv_rdma) = sum_counts(w, "srv-", "server");
    assert_eq!(
        serde_json::Value::Object(srv_tcp),
        serde_json::json!({"UNSUPPORTED": 20}),
        "server tcp counters (fork children of a capable process pass through)"
    );
    assert_eq!(srv_rdma, 0, "no server connection upgraded");
    let (sent, received, _) = fake_bytes(&w.join("fk"));
    assert!(
        sent < 4096 && received < 4096,
        "only side-channel HELLOs went through the fake provider: {sent}/{received}"
    );
}

/// A threaded echo server in one process: accepts `argv[1]` connections on 9300.
const THREADED_ECHO: &str = r#"
import socket, sys, threading
ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", 9300))
ls.listen(16)
def serve(c):
    while True:
        b = c.recv(65536)
        if not b:
            break
        c.sendall(b)
    c.shutdown(socket.SHUT_WR)
    c.close()
threads = []
for _ in range(int(sys.argv[1])):
    c, _ = ls.accept()
    t = threading.Thread(target=serve, args=(c,))
    t.start()
    threads.append(t)
for t in threads:
    t.join()
"#;

/// Upgrades a connection, forks while its pump runs; the child connects anew and uses the
/// inherited connection; then the parent connects again.
const FORKING_CLIENT: &str = r#"
import os, socket, sys
def echo(s, n):
    data = os.urandom(n)
    s.sendall(data)
    got = bytearray()
    while len(got) < n:
        b = s.recv(65536)
        assert b, "EOF after %d bytes" % len(got)
        got += b
    assert bytes(got) == data
first = socket.create_connection(("127.0.0.1", 9300))
echo(first, 64 << 10)
pid = os.fork()
if pid == 0:
    c = socket.create_connection(("127.0.0.1", 9300))
    echo(c, 64 << 10)
    c.close()
    echo(first, 64 << 10)
    print("child ok", flush=True)
    sys.exit(0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
second = socket.create_connection(("127.0.0.1", 9300))
echo(second, 64 << 10)
echo(first, 64 << 10)
first.close()
second.close()
print("parent ok", flush=True)
"#;

/// A fork child of a capable process must not touch the RDMA stack its parent initialized
/// (librdmacm and libibverbs cannot be rebuilt after fork, and the provider's locks may be held
/// by parent threads): its new connection stays TCP (`UNSUPPORTED`, no side channel), while
/// the upgraded connection it inherited keeps working through the parent's pump, and the
/// parent keeps upgrading after the fork.
#[test]
fn fork_child_of_a_capable_process_connects_over_tcp() {
    let (dir, _) = setup();
    let w = dir.path();
    std::fs::write(w.join("echo.py"), THREADED_ECHO).expect("write echo.py");
    std::fs::write(w.join("client.py"), FORKING_CLIENT).expect("write client.py");
    let script = format!(
        "{WAIT_PORT}
{srv} \"$PY\" \"$W/echo.py\" 3 2>\"$W/srv.err\" &
srv=$!
wait_port 9300
{cli} \"$PY\" \"$W/client.py\"
wait $srv
",
        srv = shimmed("srv"),
        cli = shimmed("cli"),
    );
    let run = netns(&script, &env(w), Duration::from_secs(60));
    assert!(run.stdout.contains("child ok"), "{run:?}");
    assert!(run.stdout.contains("parent ok"), "{run:?}");
    let files = stats_files(w, "cli-");
    assert_eq!(files.len(), 2, "a stats file per client process: {files:?}");
    let (tcp, rdma) = sum_counts(w, "cli-", "client");
    assert_eq!(
        (serde_json::Value::Object(tcp), rdma),
        (serde_json::json!({"UNSUPPORTED": 1}), 2),
        "client: the parent's two connections upgraded, the child's stayed TCP"
    );
    let (tcp, rdma) = sum_counts(w, "srv-", "server");
    assert_eq!(
        (serde_json::Value::Object(tcp), rdma),
        (serde_json::json!({"PEER_NOT_SHIMMED": 1}), 2),
        "server"
    );
}

/// Listens, sleeps 1 s, then accepts one connection and echoes it.
const LATE: &str = r#"
import socket, time
ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", 9200))
ls.listen(8)
open(__import__("sys").argv[1], "w").close()
time.sleep(1.0)
c, _ = ls.accept()
with c:
    while True:
        b = c.recv(65536)
        if not b:
            break
        c.sendall(b)
print("late done", flush=True)
"#;

#[test]
fn late_accept_falls_back_to_tcp_without_hanging() {
    let (dir, _) = setup();
    let w = dir.path();
    std::fs::write(w.join("late.py"), LATE).expect("write late.py");
    std::fs::write(w.join("client.py"), ECHO_CLIENT).expect("write client.py");
    let srv = shimmed("srv");
    let cli = shimmed("cli");
    let script = format!(
        "{srv} \"$PY\" \"$W/late.py\" \"$W/ready\" >\"$W/srv.out\" 2>\"$W/srv.err\" &
srv=$!
for _ in $(seq 1 200); do [ -e \"$W/ready\" ] && break; sleep 0.01; done
{cli} \"$PY\" \"$W/client.py\" 9200 2>\"$W/cli.err\"
wait $srv
cat \"$W/srv.out\"
"
    );
    let run = netns(&script, &env(w), Duration::from_secs(30));
    assert!(run.stdout.contains("echo ok"), "{run:?}");
    assert!(run.stdout.contains("late done"), "{run:?}");
    for f in ["cli.err", "srv.err"] {
        let err = std::fs::read_to_string(w.join(f)).expect("stderr file");
        assert_eq!(err, "", "{f}");
    }
    // The client gave up waiting for ACCEPT; the server's late claim found its rsocket closed.
    assert_counts(&one_stats(w, "cli-"), "client", "TIMEOUT", 1);
    assert_counts(&one_stats(w, "srv-"), "server", "TIMEOUT", 1);
    let (sent, received, _) = fake_bytes(&w.join("fk"));
    assert!(
        sent < 1024 && received < 1024,
        "only the side channel went through the fake provider: {sent}/{received}"
    );
}

/// Two listeners on one port, `0.0.0.0` and an IPv6-only `[::]` (QEMU's `-incoming tcp::P`):
/// both side listeners open (the `[::]` one keeps IPV6_V6ONLY), so IPv4 and IPv6 clients both
/// upgrade.
const DUAL: &str = r#"
import hashlib, select, socket, sys

PORT = 9200
if sys.argv[1] == "server":
    l4 = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    l4.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l4.bind(("0.0.0.0", PORT)); l4.listen(4)
    l6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    l6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    l6.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l6.bind(("::", PORT)); l6.listen(4)
    for _ in range(2):
        ready, _, _ = select.select([l4, l6], [], [], 20)
        c, _ = ready[0].accept()
        h = hashlib.sha256()
        while True:
            b = c.recv(65536)
            if not b:
                break
            h.update(b)
        c.sendall(h.hexdigest().encode())
        c.close()
else:
    host = sys.argv[2]
    data = bytes(range(256)) * 8192
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.connect((host, PORT))
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        b = s.recv(100)
        if not b:
            break
        got += b
    print("digest ok", got.decode() == hashlib.sha256(data).hexdigest())
"#;

#[test]
fn dual_stack_listeners_upgrade_ipv4_and_ipv6_clients() {
    let (dir, _) = setup();
    let w = dir.path();
    std::fs::write(w.join("dual.py"), DUAL).expect("write dual.py");
    let srv = shimmed("srv");
    let cli = shimmed("cli");
    let script = format!(
        "{WAIT_PORT}
{srv} \"$PY\" \"$W/dual.py\" server 2>\"$W/srv.err\" &
srv=$!
wait_port 9200
{cli} \"$PY\" \"$W/dual.py\" client 127.0.0.1
{cli} \"$PY\" \"$W/dual.py\" client ::1
wait $srv
"
    );
    let run = netns(&script, &env(w), Duration::from_secs(60));
    assert_eq!(run.stdout.matches("digest ok True").count(), 2, "{run:?}");
    let (tcp, rdma) = sum_counts(w, "cli-", "client");
    assert_eq!((tcp.len(), rdma), (0, 2), "client counters {tcp:?}");
    assert_upgraded(&one_stats(w, "srv-"), "server", 2);
}
