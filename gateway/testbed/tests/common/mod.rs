//! Test harness: runs bash scripts in a fresh network, PID and mount namespace (so `ip netns`
//! names and every process the script starts die with it) under a hard timeout, with the
//! test bed binary (`rdma-gateway-testbed`: the gateway plus its test events socket), the relay and QEMU tool paths in the environment.
//!
//! These machines have no RDMA device, so every gateway here relays its connections over TCP
//! (`NO_DEVICE` with the system's librdmacm): the capture, the nftables rules, the fallback
//! and the clean-ups are real, the RDMA stream is not. The stream itself runs in the Soft-RoCE
//! guests (`tests/scripts/softroce-migration.sh`).
// Test support: a panic is how a helper fails the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// One scenario at a time: QEMU runs take two 256 MiB guests, and the timing-based fallback
/// cases should not compete for the two cores.
static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Bash prelude: a trap that stops every background job, then the topology (`{topology}`) and
/// the helpers.
const PRELUDE: &str = "set -eu\nset -m\nT=$(mktemp -d)\n\
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf \"$T\"' EXIT\n\
ip link set lo up\n{topology}\n. $S/gateways.sh\n";

/// True when this host has RDMA devices (then a gateway's probe succeeds and its reasons
/// differ from `NO_DEVICE`).
pub fn host_has_rdma() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

/// The network namespace a script runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    /// A new one (the gateway tests' node namespaces live inside it).
    Private,
    /// The caller's (Soft-RoCE works in the initial network namespace only); still a new PID
    /// and mount namespace.
    Initial,
}

/// What a script printed.
#[derive(Debug)]
pub struct Run {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The value of the last `KEY=VALUE` line the script printed.
    pub fn value(&self, key: &str) -> Option<String> {
        let prefix = format!("{key}=");
        self.stdout
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
    }

    pub fn num(&self, key: &str) -> f64 {
        self.value(key)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no numeric {key}= in output\n{self}"))
    }

    pub fn assert_ok(&self) {
        assert!(self.success, "script failed\n{self}");
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stdout:\n{}\nstderr:\n{}", self.stdout, self.stderr)
    }
}

/// The random RAM image shared by every run.
pub fn ram_file() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("gateway-qemu-ram-256M.bin")
}

fn python() -> PathBuf {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Runs `script` after the prelude and the test topology (`scripts/topology.sh`) in a new
/// network namespace, killed after `limit`.
pub fn run(script: &str, limit: Duration) -> Run {
    run_in(Net::Private, ". $S/topology.sh", script, limit)
}

/// Runs `script` after the prelude and `topology` (shell) in `net`, killed after `limit`.
pub fn run_in(net: Net, topology: &str, script: &str, limit: Duration) -> Run {
    let full = format!("{}{script}\n", PRELUDE.replace("{topology}", topology));
    let mut cmd = Command::new("unshare");
    if net == Net::Private {
        cmd.arg("-n");
    }
    cmd.args([
        "-m",
        "-p",
        "-f",
        "--mount-proc",
        "--kill-child",
        "bash",
        "-c",
        &full,
    ])
    .env("GW", env!("CARGO_BIN_EXE_rdma-gateway-testbed"))
    .env("S", manifest().join("tests/scripts"))
    .env(
        "QEMU_TOOL",
        manifest().join("../../tests/tools/qemu_migrate.py"),
    )
    .env("RAM", ram_file())
    .env("PY", python())
    .env_remove("RDMA_GW_PROVIDER")
    .env_remove("LD_PRELOAD")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn unshare");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let start = Instant::now();
    match rx.recv_timeout(limit) {
        Ok(out) => {
            let out = out.expect("wait");
            Run {
                success: out.status.success(),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            }
        }
        Err(_) => {
            // --kill-child: killing unshare kills the whole PID namespace.
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            let out = rx.recv_timeout(Duration::from_secs(10));
            panic!(
                "script timed out after {:?}\n{}",
                start.elapsed(),
                match out {
                    Ok(Ok(o)) => format!(
                        "stdout:\n{}\nstderr:\n{}",
                        String::from_utf8_lossy(&o.stdout),
                        String::from_utf8_lossy(&o.stderr)
                    ),
                    _ => String::new(),
                }
            );
        }
    }
}
