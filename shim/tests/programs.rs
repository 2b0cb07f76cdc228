//! Unmodified programs on two hosts: network namespaces joined by a veth pair (198.18.0.1 and
//! 198.18.0.2), both shimmed with the fake provider and no policy file (the default policy: any
//! non-loopback peer may upgrade). The C echo (`tests/programs/echo.c`, built with
//! `-D_FORTIFY_SOURCE=2 -O2`) moves its connected fd around the way real programs do; socat
//! and iperf3 run as Debian ships them. Bytes are checked with sha256, the path by the fake
//! provider's counters and the shim's stats. Then the peer matrix: every combination of
//! shimmed ends and every provider fault, each byte-exact (or a clean failure for a reset),
//! on the expected path with the expected reason, never a hang.

mod common;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::*;
use sha2::{Digest, Sha256};

/// The C echo program, compiled once per test run (atomically replaced, so parallel runs of
/// this binary cannot see a half-written file).
fn echo_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/echo.c");
        let exe = std::env::current_exe().expect("current_exe");
        let dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target dir")
            .join("shim-test-programs");
        std::fs::create_dir_all(&dir).expect("mkdir shim-test-programs");
        let tmp = dir.join(format!("echo.{}", std::process::id()));
        let out = Command::new("cc")
            .args(["-std=c11", "-D_FORTIFY_SOURCE=2", "-O2", "-Wall", "-Werror"])
            .arg("-o")
            .arg(&tmp)
            .arg(&src)
            .output()
            .expect("cc is needed by the shim tests (build-essential)");
        assert!(
            out.status.success(),
            "cc {}: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let bin = dir.join("echo");
        std::fs::rename(&tmp, &bin).expect("rename echo");
        bin
    })
    .clone()
}

/// A work dir with `in.bin` (`mib` MiB of pseudo-random bytes) and `fk/`.
fn workdir(mib: usize) -> (tempfile::TempDir, Vec<u8>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ mib as u64;
    let data: Vec<u8> = (0..mib << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[3]
        })
        .collect();
    std::fs::write(dir.path().join("in.bin"), &data).expect("write in.bin");
    std::fs::create_dir(dir.path().join("fk")).expect("mkdir fk");
    (dir, data)
}

fn sha(b: &[u8]) -> Vec<u8> {
    Sha256::digest(b).to_vec()
}

fn env(w: &Path) -> Vec<(&'static str, OsString)> {
    vec![
        ("W", OsString::from(w)),
        ("FAKE", fake_lib().into_os_string()),
        ("ECHO", echo_bin().into_os_string()),
    ]
}

/// Shell words running a command under the shim with the fake provider, stats `$W/<who>-%p`,
/// `extra` env words in front of the command.
fn shimmed(who: &str, extra: &str) -> String {
    format!(
        "env LD_PRELOAD=\"$SHIM\" STREAMSHIM_PROVIDER=\"$FAKE\" FAKE_RSOCKET_STATS_DIR=\"$W/fk\" \
         STREAMSHIM_STATS=\"$W/{who}-%p.json\" {extra}"
    )
}

fn assert_same(w: &Path, out: &str, data: &[u8]) {
    let got = std::fs::read(w.join(out)).unwrap_or_default();
    assert_eq!(got.len(), data.len(), "length of {out}");
    assert!(sha(&got) == sha(data), "sha256 of {out} differs");
}

/// The C client's modes, one connection each, against the fork-per-connection C server.
const MODES: [&str; 5] = ["plain", "dup", "peek", "scm", "exec"];

/// The fork-per-connection C server on B, and the C client on A once per mode, all shimmed
/// (`extra`: more env words for both) and logging at debug; the logs are shown with the mode
/// whose client failed. Returns the work dir for the caller's checks.
fn c_client_modes(extra: &str) -> tempfile::TempDir {
    require_netns();
    let syms = Command::new("nm")
        .args(["-D", "--undefined-only"])
        .arg(echo_bin())
        .output()
        .expect("nm (binutils)");
    let syms = String::from_utf8_lossy(&syms.stdout);
    assert!(
        syms.contains("__read_chk"),
        "the echo client is not a FORTIFY build:\n{syms}"
    );
    let (dir, data) = workdir(4);
    let w = dir.path();
    let srv = shimmed("srv", &format!("STREAMSHIM_LOG=debug {extra}"));
    let cli = shimmed("cli", &format!("STREAMSHIM_LOG=debug {extra}"));
    let mut clients = String::new();
    for m in MODES {
        clients.push_str(&format!(
            "on_a {cli} \"$ECHO\" client \"$B\" 7000 \"$W/in.bin\" \"$W/out-{m}.bin\" {m} \
             2>\"$W/cli-{m}.err\" || {{ echo \"client mode {m} failed\" >&2; \
             for f in \"$W\"/cli-*.err \"$W/srv.err\"; do echo \"== $f\" >&2; tail -n 60 \"$f\" >&2; done; \
             exit 1; }}\n"
        ));
    }
    let script = format!(
        "{TWO_HOSTS}
on_b {srv} \"$ECHO\" server 7000 {n} 2>\"$W/srv.err\" &
srv=$!
wait_port_on \"$NSB\" 7000
{clients}
wait $srv
",
        n = MODES.len()
    );
    netns(&script, &env(w), Duration::from_secs(120));
    for m in MODES {
        assert_same(w, &format!("out-{m}.bin"), &data);
    }
    dir
}

/// Every mode upgraded on both sides, every echo byte-exact, FORTIFY's `__read_chk` in use.
#[test]
fn c_client_modes_against_a_fork_per_connection_server_over_veth() {
    let dir = c_client_modes("");
    let w = dir.path();
    let (tcp, rdma) = sum_counts(w, "cli-", "client");
    assert_eq!((tcp.len(), rdma), (0, 5), "client counters {tcp:?}");
    let (tcp, rdma) = sum_counts(w, "srv-", "server");
    assert_eq!((tcp.len(), rdma), (0, 5), "server counters {tcp:?}");
    let (sent, received, _) = fake_bytes(&w.join("fk"));
    assert!(
        sent >= 4 << 20 && received >= 4 << 20,
        "fake provider carried {sent}/{received} bytes"
    );
}

/// With a 1 ms negotiation bound every step of the handshake can run out on either side, at
/// any point (the client before ACCEPT, the server's wait for a HELLO): whichever path each
/// connection ends on, it completes byte-exact on both sides and is counted once per side.
#[test]
fn c_client_modes_with_a_1_ms_negotiation_bound_never_break() {
    let dir = c_client_modes("STREAMSHIM_NEGOTIATE_MS=1");
    let w = dir.path();
    for (prefix, role) in [("cli-", "client"), ("srv-", "server")] {
        let (tcp, rdma) = sum_counts(w, prefix, role);
        let tcp_total: u64 = tcp.values().filter_map(serde_json::Value::as_u64).sum();
        assert_eq!(tcp_total + rdma, 5, "{role}: tcp {tcp:?} rdma {rdma}");
    }
}

/// A client that writes and exits at once (no close, no shutdown): the kernel would deliver
/// its bytes after the process is gone; the shim's exit flush must too.
#[test]
fn bytes_written_just_before_exit_arrive() {
    require_netns();
    let (dir, data) = workdir(8);
    let w = dir.path();
    let script = format!(
        "{TWO_HOSTS}
on_b {srv} \"$ECHO\" sink 7000 \"$W/out.bin\" &
srv=$!
wait_port_on \"$NSB\" 7000
on_a {cli} \"$ECHO\" client \"$B\" 7000 \"$W/in.bin\" /dev/null blast
wait $srv
",
        srv = shimmed("srv", ""),
        // No stats file for the client: writing it at exit would give the pump time to
        // finish anyway.
        cli = "env LD_PRELOAD=\"$SHIM\" STREAMSHIM_PROVIDER=\"$FAKE\""
    );
    netns(&script, &env(w), Duration::from_secs(60));
    assert_same(w, "out.bin", &data);
    assert_upgraded(&one_stats(w, "srv-"), "server", 1);
}

/// A socket registered with epoll before connect() is never swapped (the registration would
/// stay on the TCP description): it stays TCP, `UNSUPPORTED`, and the echo works.
#[test]
fn epoll_registration_before_connect_stays_tcp() {
    require_netns();
    let (dir, data) = workdir(2);
    let w = dir.path();
    let script = format!(
        "{TWO_HOSTS}
on_b {srv} \"$ECHO\" server 7000 1 &
srv=$!
wait_port_on \"$NSB\" 7000
on_a {cli} \"$ECHO\" client \"$B\" 7000 \"$W/in.bin\" \"$W/out.bin\" epoll
wait $srv
",
        srv = shimmed("srv", ""),
        cli = shimmed("cli", "")
    );
    netns(&script, &env(w), Duration::from_secs(60));
    assert_same(w, "out.bin", &data);
    assert_counts(&one_stats(w, "cli-"), "client", "UNSUPPORTED", 1);
    let (tcp, rdma) = sum_counts(w, "srv-", "server");
    assert_eq!(
        (serde_json::Value::Object(tcp), rdma),
        (serde_json::json!({"PEER_NOT_SHIMMED": 1}), 0)
    );
}

/// socat as a fork-per-connection echo server (`EXEC:cat`) and as a client, both shimmed.
#[test]
fn socat_over_veth_is_upgraded() {
    require_netns();
    let (dir, data) = workdir(4);
    let w = dir.path();
    let script = format!(
        "{TWO_HOSTS}
on_b {srv} socat TCP-LISTEN:7100,fork,reuseaddr EXEC:cat 2>\"$W/srv.err\" &
wait_port_on \"$NSB\" 7100
on_a {cli} socat -t 10 - TCP:$B:7100 <\"$W/in.bin\" >\"$W/out.bin\"
on_a {cli} socat -t 10 - TCP:$B:7100 <\"$W/in.bin\" >\"$W/out2.bin\"
",
        srv = shimmed("srv", ""),
        cli = shimmed("cli", "")
    );
    netns(&script, &env(w), Duration::from_secs(60));
    assert_same(w, "out.bin", &data);
    assert_same(w, "out2.bin", &data);
    let (tcp, rdma) = sum_counts(w, "cli-", "client");
    assert_eq!((tcp.len(), rdma), (0, 2), "client counters {tcp:?}");
    let (sent, _, _) = fake_bytes(&w.join("fk"));
    assert!(sent >= 4 << 20, "fake provider carried {sent} bytes");
}

/// iperf3 between the hosts with two parallel streams: the control and both data connections
/// upgraded, the bytes carried by the provider.
#[test]
fn iperf3_over_veth_is_upgraded() {
    require_netns();
    let (dir, _) = workdir(0);
    let w = dir.path();
    let script = format!(
        "{TWO_HOSTS}
on_b {srv} iperf3 -s -1 -p 5201 >\"$W/srv.out\" 2>&1 &
srv=$!
wait_port_on \"$NSB\" 5201
on_a {cli} iperf3 -c \"$B\" -p 5201 -P 2 -n 64M >\"$W/cli.out\" 2>&1 ||
  {{ echo client failed; cat \"$W/cli.out\" \"$W/srv.out\"; exit 1; }} >&2
wait $srv || {{ echo server failed; cat \"$W/srv.out\"; exit 1; }} >&2
",
        srv = shimmed("srv", ""),
        cli = shimmed("cli", "")
    );
    netns(&script, &env(w), Duration::from_secs(90));
    assert_upgraded(&one_stats(w, "cli-"), "client", 3);
    assert_upgraded(&one_stats(w, "srv-"), "server", 3);
    let (sent, received, _) = fake_bytes(&w.join("fk"));
    assert!(
        sent.max(received) >= 32 << 20,
        "fake provider carried {sent}/{received} bytes"
    );
}

/// What a matrix case expects.
struct Expect {
    /// Client counters: `rdma` UPGRADED count, or the tcp reason.
    client: &'static str,
    server: &'static str,
    /// The echo completes byte-exact (false: the connection fails cleanly, the received bytes
    /// a prefix of the sent ones).
    complete: bool,
}

const UP: &str = "UPGRADED";

/// One matrix case: the fork server on B (`srv_env`: shim words or empty), the plain client on
/// A (`cli_env`), 4 MiB echoed.
fn matrix(srv_env: &str, cli_env: &str, want: Expect) {
    require_netns();
    let (dir, data) = workdir(4);
    let w = dir.path();
    let script = format!(
        "{TWO_HOSTS}
on_b {srv_env} \"$ECHO\" server 7000 1 2>\"$W/srv.err\" &
srv=$!
wait_port_on \"$NSB\" 7000
rc=0
on_a {cli_env} \"$ECHO\" client \"$B\" 7000 \"$W/in.bin\" \"$W/out.bin\" plain 2>\"$W/cli.err\" || rc=$?
echo \"client exit $rc\"
wait $srv || true
"
    );
    let run = netns(&script, &env(w), Duration::from_secs(60));
    let cli_err = std::fs::read_to_string(w.join("cli.err")).unwrap_or_default();
    if want.complete {
        assert!(
            run.stdout.contains("client exit 0"),
            "client failed: {}\n{cli_err}",
            run.stdout
        );
        assert_same(w, "out.bin", &data);
    } else {
        assert!(
            !run.stdout.contains("client exit 0"),
            "the client should have seen the reset: {}",
            run.stdout
        );
        let got = std::fs::read(w.join("out.bin")).unwrap_or_default();
        assert!(
            data.starts_with(&got),
            "received {} bytes that are not a prefix of the sent ones",
            got.len()
        );
    }
    for (prefix, role, expected) in [
        ("cli-", "client", want.client),
        ("srv-", "server", want.server),
    ] {
        let (tcp, rdma) = sum_counts(w, prefix, role);
        match expected {
            "" => assert!(
                stats_files(w, prefix).is_empty(),
                "{role}: no shim, no stats expected"
            ),
            UP => assert_eq!((tcp.len(), rdma), (0, 1), "{role}: {tcp:?} rdma {rdma}"),
            reason => assert_eq!(
                (serde_json::Value::Object(tcp), rdma),
                (serde_json::json!({ reason: 1 }), 0),
                "{role}"
            ),
        }
    }
    let (sent, received, _) = fake_bytes(&w.join("fk"));
    let carried = sent.max(received);
    if want.client == UP {
        assert!(
            carried > 0,
            "upgraded, yet the fake provider carried nothing"
        );
    } else {
        assert!(
            carried < 1024,
            "stayed TCP, yet the fake provider carried {carried} bytes"
        );
    }
}

fn faulty(who: &str, faults: &str) -> String {
    shimmed(who, &format!("FAKE_RSOCKET_FAULTS={faults}"))
}

#[test]
fn matrix_both_shimmed() {
    let (s, c) = (shimmed("srv", ""), shimmed("cli", ""));
    matrix(
        &s,
        &c,
        Expect {
            client: UP,
            server: UP,
            complete: true,
        },
    );
}

#[test]
fn matrix_server_only() {
    let s = shimmed("srv", "");
    let want = Expect {
        client: "",
        server: "PEER_NOT_SHIMMED",
        complete: true,
    };
    matrix(&s, "", want);
}

#[test]
fn matrix_client_only() {
    let c = shimmed("cli", "");
    let want = Expect {
        client: "PEER_NOT_SHIMMED",
        server: "",
        complete: true,
    };
    matrix("", &c, want);
}

#[test]
fn matrix_neither() {
    matrix(
        "",
        "",
        Expect {
            client: "",
            server: "",
            complete: true,
        },
    );
}

#[test]
fn matrix_no_provider() {
    let words = |who: &str| {
        format!(
            "env LD_PRELOAD=\"$SHIM\" STREAMSHIM_PROVIDER=/nonexistent/librdmacm.so.1 \
             STREAMSHIM_STATS=\"$W/{who}-%p.json\""
        )
    };
    let want = Expect {
        client: "NO_PROVIDER",
        server: "NO_PROVIDER",
        complete: true,
    };
    matrix(&words("srv"), &words("cli"), want);
}

#[test]
fn matrix_server_without_provider() {
    let s = "env LD_PRELOAD=\"$SHIM\" STREAMSHIM_PROVIDER=/nonexistent/librdmacm.so.1 \
             STREAMSHIM_STATS=\"$W/srv-%p.json\"";
    let want = Expect {
        client: "PEER_NOT_SHIMMED",
        server: "NO_PROVIDER",
        complete: true,
    };
    matrix(s, &shimmed("cli", ""), want);
}

#[test]
fn matrix_fault_nodev() {
    let want = Expect {
        client: "NO_DEVICE",
        server: "NO_DEVICE",
        complete: true,
    };
    matrix(&faulty("srv", "nodev"), &faulty("cli", "nodev"), want);
}

#[test]
fn matrix_fault_enomem() {
    let want = Expect {
        client: "MEMLOCK",
        server: "MEMLOCK",
        complete: true,
    };
    matrix(&faulty("srv", "enomem"), &faulty("cli", "enomem"), want);
}

#[test]
fn matrix_fault_refuse() {
    let want = Expect {
        client: "PEER_NOT_SHIMMED",
        server: "PEER_NOT_SHIMMED",
        complete: true,
    };
    matrix(&shimmed("srv", ""), &faulty("cli", "refuse"), want);
}

#[test]
fn matrix_fault_slow_connect_within_the_bound() {
    let want = Expect {
        client: UP,
        server: UP,
        complete: true,
    };
    matrix(&shimmed("srv", ""), &faulty("cli", "slow_connect=50"), want);
}

#[test]
fn matrix_fault_slow_connect_past_the_bound() {
    let want = Expect {
        client: "TIMEOUT",
        server: "PEER_NOT_SHIMMED",
        complete: true,
    };
    matrix(
        &shimmed("srv", ""),
        &faulty("cli", "slow_connect=1000"),
        want,
    );
}

/// The client's CONFIRM leaves 600 ms after ACCEPT arrived (a stalled client, 3x the 200 ms
/// negotiation bound): the server waits for it and the connection upgrades on both sides.
/// (A server that gave up on CONFIRM after its own bound left the client on the rsocket and
/// itself on TCP: a connection failed on both sides.)
#[test]
fn matrix_fault_late_confirm_still_upgrades() {
    let want = Expect {
        client: UP,
        server: UP,
        complete: true,
    };
    matrix(&shimmed("srv", ""), &faulty("cli", "slow_send=600@2"), want);
}

/// The server's ACCEPT leaves 600 ms after its `accept()` claimed the connection: the client
/// gave up at its bound and stayed TCP, the server already swapped the app's fd, and relays the
/// connection over its kept TCP socket: byte-exact, both counted TCP `TIMEOUT`.
#[test]
fn matrix_fault_late_accept_is_relayed_over_tcp() {
    let want = Expect {
        client: "TIMEOUT",
        server: "TIMEOUT",
        complete: true,
    };
    matrix(&faulty("srv", "slow_send=600@1"), &shimmed("cli", ""), want);
}

#[test]
fn matrix_fault_hang_connect() {
    let want = Expect {
        client: "TIMEOUT",
        server: "PEER_NOT_SHIMMED",
        complete: true,
    };
    matrix(&shimmed("srv", ""), &faulty("cli", "hang_connect"), want);
}

#[test]
fn matrix_fault_eagain_storm() {
    let want = Expect {
        client: UP,
        server: UP,
        complete: true,
    };
    matrix(
        &faulty("srv", "eagain_storm=200"),
        &faulty("cli", "eagain_storm=200"),
        want,
    );
}

#[test]
fn matrix_fault_poll_never_wakes() {
    // The client cannot see its side connection complete: the negotiation bound expires and
    // the connection stays TCP (the pump's own ticks are covered by the transport tests).
    let want = Expect {
        client: "TIMEOUT",
        server: "PEER_NOT_SHIMMED",
        complete: true,
    };
    matrix(
        &faulty("srv", "poll_never_wakes"),
        &faulty("cli", "poll_never_wakes"),
        want,
    );
}

#[test]
fn matrix_fault_reset_mid_stream() {
    // Upgraded, then the stream is reset after 1 MiB: the client fails cleanly (EOF or
    // ECONNRESET before all bytes came back), no hang, no corrupted byte.
    let want = Expect {
        client: UP,
        server: UP,
        complete: false,
    };
    matrix(
        &shimmed("srv", ""),
        &faulty("cli", "reset_after=1048576"),
        want,
    );
}
