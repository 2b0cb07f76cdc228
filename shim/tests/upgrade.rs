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
