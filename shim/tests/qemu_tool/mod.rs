//! Runs `tests/tools/qemu_migrate.py` (one live migration of a stopped TCG guest with 256 MiB of
//! random RAM, source and destination QEMU on loopback) in a fresh network namespace, with
//! neither, or both QEMUs under the shim; shared by `tests/qemu.rs` and
//! `benches/qemu_migration.rs`. Needs `mod common;` next to it.

// Test support: a panic is how a helper fails the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Not every user needs every helper.
#![allow(dead_code)]

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use crate::common::{assert_counts, assert_no_counts, netns, one_stats, python};

pub const MIB: u64 = 1 << 20;
/// Guest RAM.
pub const RAM_MIB: u64 = 256;
/// The tool's own bound; the script's is a little longer so the tool reports first.
const TOOL_TIMEOUT_S: u64 = 60;
const SCRIPT_LIMIT: Duration = Duration::from_secs(80);
/// Migration port (each run has a network namespace of its own).
pub const PORT: u16 = 4444;

/// One migration at a time: two QEMUs and 512 MiB per migration, and a loaded machine would
/// also stretch the shim's 200 ms negotiation bound.
static SERIAL: Mutex<()> = Mutex::new(());

/// `tests/tools/qemu_migrate.py`.
pub fn tool() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/tools/qemu_migrate.py")
}

/// The random RAM image, shared by every run (and kept between runs of the tests).
pub fn ram_file() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("qemu-ram-{RAM_MIB}M.bin"))
}

/// `qemu_migrate.py --print-version`: `{"qemu_version": "7.2.22", "multifd_by_magic": false}`.
pub fn qemu_version() -> &'static serde_json::Value {
    static V: OnceLock<serde_json::Value> = OnceLock::new();
    V.get_or_init(|| {
        let out = Command::new(python())
            .arg(tool())
            .arg("--print-version")
            .output()
            .expect("run qemu_migrate.py");
        assert!(
            out.status.success(),
            "qemu_migrate.py --print-version failed (is qemu-system-x86 installed? `make deps`): \
             {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("version JSON")
    })
}

/// How the two QEMUs run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shim {
    /// No LD_PRELOAD at all.
    None,
    /// Both under the shim with the system's RDMA libraries (no RDMA device here, so the shim
    /// passes through: `tcp NO_DEVICE`; the Soft-RoCE suite migrates over real streams).
    NoRdma,
}

impl Shim {
    /// The tool's environment options for this mode.
    fn tool_args(self) -> &'static str {
        match self {
            Shim::None => "",
            Shim::NoRdma => {
                "--env LD_PRELOAD=\"$SHIM\" \
                 --src-env STREAMSHIM_STATS=\"$W/src-%p.json\" \
                 --dst-env STREAMSHIM_STATS=\"$W/dst-%p.json\""
            }
        }
    }
}

/// What one migration gave: the tool's JSON line and exit code, and the work dir (`run/` holds
/// the QEMU logs, `src-*.json`/`dst-*.json` the shim's stats).
pub struct Migration {
    pub dir: tempfile::TempDir,
    pub result: serde_json::Value,
    pub exit_code: i32,
}

impl Migration {
    pub fn w(&self) -> &Path {
        self.dir.path()
    }

    /// A file of the tool's work dir (`src.log`, `dst.log`), empty if missing.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.w().join("run").join(name)).unwrap_or_default()
    }

    /// Completed, RAM byte-exact (all of it), at least the RAM on the wire, and not a word from
    /// QEMU, the shim or the provider on either side.
    pub fn assert_verified(&self) {
        let r = &self.result;
        assert_eq!(
            self.exit_code,
            0,
            "migration failed: {r}\nsrc.log:\n{}\ndst.log:\n{}",
            self.log("src.log"),
            self.log("dst.log")
        );
        assert_eq!(r["status"], "completed", "{r}");
        assert_eq!(r["ram_match"], true, "{r}");
        assert_eq!(r["ram_pam_window"], "match", "{r}");
        assert_eq!(r["ram_bytes"], RAM_MIB * MIB, "{r}");
        assert!(
            r["bytes"].as_u64().unwrap_or(0) >= RAM_MIB * MIB,
            "transferred {r}"
        );
        assert_eq!(self.log("src.log"), "", "source QEMU output");
        assert_eq!(self.log("dst.log"), "", "destination QEMU output");
    }

    /// Both shims passed the one migration connection through as TCP with `reason`.
    pub fn assert_tcp(&self, reason: &str) {
        let w = self.w();
        let src = one_stats(w, "src-");
        assert_counts(&src, "client", reason, 1);
        assert_no_counts(&src, "server");
        let dst = one_stats(w, "dst-");
        assert_counts(&dst, "server", reason, 1);
        assert_no_counts(&dst, "client");
    }
}

/// Runs one migration in a fresh network namespace; `extra` are more tool arguments (shell
/// words). Panics only when the script itself fails or gives no JSON line.
pub fn migrate(shim: Shim, extra: &str) -> Migration {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let dir = tempfile::tempdir().expect("tempdir");
    let w = dir.path();
    let env_args = shim.tool_args();
    let script = format!(
        "rc=0
\"$PY\" \"$TOOL\" --workdir \"$W/run\" --ram-file \"$RAM\" --ram-mib {RAM_MIB} --port {PORT} \
  --timeout {TOOL_TIMEOUT_S} {env_args} {extra} >\"$W/result.json\" || rc=$?
echo \"$rc\" >\"$W/exit\"
"
    );
    let env = [
        ("W", OsString::from(w)),
        ("TOOL", tool().into_os_string()),
        ("RAM", ram_file().into_os_string()),
    ];
    let run = netns(&script, &env, SCRIPT_LIMIT);
    let text = std::fs::read_to_string(w.join("result.json")).unwrap_or_default();
    let result: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "no JSON line from qemu_migrate.py ({e})\nstdout:\n{}\nstderr:\n{}",
            run.stdout, run.stderr
        )
    });
    let exit_code = std::fs::read_to_string(w.join("exit"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(-1);
    Migration {
        dir,
        result,
        exit_code,
    }
}
