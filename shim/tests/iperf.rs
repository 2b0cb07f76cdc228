//! iperf3 client and server (2 s, one stream: a control and a data connection each) under the
//! shim in a network namespace, for every per-process decision these machines can make (they
//! have no RDMA device; the Soft-RoCE suite covers capable processes): the test always
//! completes and both sides count both connections with the expected reason.

// An integration test: its helpers panic to fail the test, as its `#[test]` functions may.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use common::*;

struct Outcome {
    client: serde_json::Value,
    server: serde_json::Value,
    client_err: String,
    server_err: String,
}

/// Runs one iperf3 test with `env` exported to both sides, `wrap` in front of both commands.
fn iperf(env: &[(&str, &str)], wrap: &str) -> Outcome {
    let dir = tempfile::tempdir().expect("tempdir");
    let w = dir.path();
    let exports: String = env
        .iter()
        .map(|(k, v)| format!("export {k}='{v}'\n"))
        .collect();
    let script = format!(
        "{WAIT_PORT}
{exports}
{wrap} env LD_PRELOAD=\"$SHIM\" STREAMSHIM_STATS=\"$W/srv-%p.json\" iperf3 -s -1 -p 5201 \
  >\"$W/srv.out\" 2>\"$W/srv.err\" &
srv=$!
wait_port 5201
{wrap} env LD_PRELOAD=\"$SHIM\" STREAMSHIM_STATS=\"$W/cli-%p.json\" iperf3 -c 127.0.0.1 -p 5201 -t 2 \
  >\"$W/cli.out\" 2>\"$W/cli.err\"
wait $srv
"
    );
    netns(
        &script,
        &[("W", OsString::from(w))],
        Duration::from_secs(60),
    );
    let read = |name: &str| std::fs::read_to_string(w.join(name)).unwrap_or_default();
    let cli_out = read("cli.out");
    assert!(
        cli_out.contains("iperf Done."),
        "iperf3 client did not complete:\n{cli_out}\n{}",
        read("cli.err")
    );
    Outcome {
        client: one_stats(w, "cli-"),
        server: one_stats(w, "srv-"),
        client_err: read("cli.err"),
        server_err: read("srv.err"),
    }
}

fn expect(o: &Outcome, reason: &str) {
    assert_counts(&o.client, "client", reason, 2);
    assert_no_counts(&o.client, "server");
    assert_counts(&o.server, "server", reason, 2);
    assert_no_counts(&o.server, "client");
}

fn expect_silent(o: &Outcome) {
    assert_eq!(o.client_err, "", "client stderr");
    assert_eq!(o.server_err, "", "server stderr");
}

fn policy_file(dir: &Path, text: &str) -> String {
    let p = dir.join("policy.yaml");
    std::fs::write(&p, text).expect("write policy");
    p.to_string_lossy().into_owned()
}

#[test]
fn default_provider_without_device_is_no_device() {
    let o = iperf(&[], "");
    expect(&o, "NO_DEVICE");
    expect_silent(&o);
}

#[test]
fn kill_switch_is_disabled() {
    let o = iperf(&[("STREAMSHIM_DISABLE", "1")], "");
    expect(&o, "DISABLED");
    expect_silent(&o);
}

#[test]
fn missing_provider_is_no_provider() {
    let o = iperf(
        &[("STREAMSHIM_PROVIDER", "/nonexistent/librdmacm.so.1")],
        "",
    );
    expect(&o, "NO_PROVIDER");
    expect_silent(&o);
}

#[test]
fn excluded_program_is_policy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pol = policy_file(
        dir.path(),
        "loopback: true\nexclude_programs: [\"iperf*\"]\n",
    );
    let o = iperf(&[("STREAMSHIM_POLICY", &pol)], "");
    expect(&o, "POLICY");
    expect_silent(&o);
}

#[test]
fn bad_policy_prints_one_line_and_passes_through() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pol = policy_file(dir.path(), "client: {allow: [{cidr: not-an-ip}]}\n");
    let o = iperf(&[("STREAMSHIM_POLICY", &pol)], "");
    expect(&o, "POLICY");
    for err in [&o.client_err, &o.server_err] {
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "exactly one stderr line expected:\n{err}");
        let line = lines.first().copied().unwrap_or_default();
        assert!(
            line.starts_with("streamshim: policy ") && line.ends_with("; passing through"),
            "{line}"
        );
    }
}

#[test]
fn unreadable_policy_prints_one_line_and_passes_through() {
    let o = iperf(&[("STREAMSHIM_POLICY", "/nonexistent/policy.yaml")], "");
    expect(&o, "POLICY");
    for err in [&o.client_err, &o.server_err] {
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("/nonexistent/policy.yaml"), "{err}");
    }
}

#[test]
fn debug_log_reports_decision_and_connections() {
    let o = iperf(&[("STREAMSHIM_LOG", "debug")], "");
    expect(&o, "NO_DEVICE");
    for (err, role) in [(&o.client_err, "client"), (&o.server_err, "server")] {
        assert!(err.contains("passing through (NO_DEVICE)"), "{err}");
        assert_eq!(
            err.matches(&format!("]: {role} fd ")).count(),
            2,
            "one line per connection:\n{err}"
        );
    }
}

#[test]
fn unknown_mode_prints_one_line_and_passes_through() {
    let o = iperf(&[("STREAMSHIM_MODE", "turbo")], "");
    expect(&o, "UNSUPPORTED");
    for err in [&o.client_err, &o.server_err] {
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("STREAMSHIM_MODE=\"turbo\" is not a mode")
                && err.contains("passing through"),
            "{err}"
        );
    }
}

#[test]
fn direct_mode_says_so_once_and_uses_proxy() {
    // Proxy mode then decides as usual: no RDMA device here (the Soft-RoCE suite shows the
    // upgrade with `direct`).
    let o = iperf(&[("STREAMSHIM_MODE", "direct")], "");
    expect(&o, "NO_DEVICE");
    for err in [&o.client_err, &o.server_err] {
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("direct is not available in this version; using proxy"),
            "{err}"
        );
    }
}
