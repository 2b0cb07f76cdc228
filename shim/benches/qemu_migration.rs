//! `make bench`: QEMU live migration time with both QEMUs under the shim and no RDMA (the
//! shim passes the connection through as TCP, `NO_DEVICE`) against no shim at all, plus the
//! upgraded migration over the fake provider for information.
//!
//! Every run is `tests/tools/qemu_migrate.py`: a stopped TCG guest with 256 MiB of
//! preallocated random RAM migrated on loopback to a destination with preallocated (zero) RAM,
//! single stream, unthrottled, each run in a network namespace of its own. One verified warm-up run per mode first (RAM byte-exact, the
//! shim's counters show the mode is what it claims: `tcp NO_DEVICE` / `rdma UPGRADED`), then
//! `QEMU_BENCH_RUNS` (default 9) rounds of one timed run per mode, the order rotating each
//! round, without the RAM dumps (they would write 512 MiB between timed runs).
//!
//! | measure                                                   | goal      |
//! | --------------------------------------------------------- | --------- |
//! | migration time, shim without RDMA / no shim (medians)     | <= 1.05   |
//! | migration time, no shim; shim + fake provider (upgraded)  | for info  |
//!
//! Time: from the `migrate` command to both QEMUs reporting `completed` (the tool's `seconds`,
//! polled every 5 ms). Shown beside it: the minima (other load on the machine only ever adds
//! time), QEMU's own `total-time`, and the CPU seconds both QEMUs spent during the migration.
//!
//! Exits non-zero when a goal is missed. Results and the command go to docs/benchmarks.md.

#![allow(clippy::print_stdout)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/qemu_tool/mod.rs"]
mod qemu_tool;

use std::path::Path;
use std::process::Command;

use qemu_tool::{Shim, migrate, qemu_version};

const GOAL: f64 = 1.05;
const MODES: [Shim; 3] = [Shim::None, Shim::NoRdma, Shim::Fake];

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn name(mode: Shim) -> &'static str {
    match mode {
        Shim::None => "no shim",
        Shim::NoRdma => "shim, no RDMA (pass-through)",
        Shim::Fake => "shim + fake provider (upgraded)",
    }
}

fn list(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.3}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The 1-minute load average.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

struct Row {
    name: String,
    value: String,
    goal: &'static str,
    ok: bool,
}

/// `cargo bench` builds no cdylib for a bench: build (or refresh) `libstreamshim.so` in this
/// bench's profile and target dir, unless `STREAMSHIM_LIB` names one.
fn build_shim() {
    if std::env::var_os("STREAMSHIM_LIB").is_some() {
        return;
    }
    let exe = std::env::current_exe().expect("current_exe");
    // <target>/<profile>/deps/<bench binary>
    let profile_dir = exe.parent().and_then(Path::parent).expect("profile dir");
    let target_dir = profile_dir.parent().expect("target dir");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev",
        Some(other) => other,
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "-p",
            "rdma-streams-shim",
            "--lib",
            "--profile",
            profile,
        ])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        .status()
        .expect("run cargo build -p rdma-streams-shim");
    assert!(status.success(), "cargo build -p rdma-streams-shim failed");
}

fn main() {
    common::require_netns();
    build_shim();
    let runs: usize = std::env::var("QEMU_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(9);
    let version = qemu_version()["qemu_version"].clone();

    // Warm-up and correctness, one per mode.
    for mode in MODES {
        let m = migrate(mode, "");
        m.assert_verified();
        match mode {
            Shim::None => {}
            Shim::NoRdma => m.assert_tcp("NO_DEVICE"),
            Shim::Fake => m.assert_upgraded(1),
        }
    }

    // Timed: wall seconds, QEMU's total-time and the two QEMUs' CPU seconds, per mode.
    let load_before = loadavg();
    let mut wall: [Vec<f64>; 3] = Default::default();
    let mut qemu: [Vec<f64>; 3] = Default::default();
    let mut cpu: [Vec<f64>; 3] = Default::default();
    for round in 0..runs {
        for k in 0..MODES.len() {
            let i = (round + k) % MODES.len();
            let m = migrate(MODES[i], "--no-verify");
            assert_eq!(
                (m.exit_code, &m.result["status"]),
                (0, &serde_json::json!("completed")),
                "{}",
                m.result
            );
            let secs = m.result["seconds"].as_f64().expect("seconds");
            let c = &m.result["cpu_seconds"];
            wall[i].push(secs);
            // QEMU 7.2 now and then reports a total-time of 0 for a completed migration.
            if let Some(ms) = m.result["qemu_total_time_ms"]
                .as_f64()
                .filter(|&ms| ms > 0.0)
            {
                qemu[i].push(ms / 1e3);
            }
            cpu[i].push(
                c["src"].as_f64().unwrap_or(f64::NAN) + c["dst"].as_f64().unwrap_or(f64::NAN),
            );
        }
    }

    let med: Vec<f64> = wall.iter().map(|v| median(v)).collect();
    let qmed: Vec<f64> = qemu.iter().map(|v| median(v)).collect();
    let cmed: Vec<f64> = cpu.iter().map(|v| median(v)).collect();
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let mut rows = Vec::new();
    for (i, mode) in MODES.iter().enumerate() {
        rows.push(Row {
            name: format!("migration time, {} (median of {runs})", name(*mode)),
            value: format!(
                "{:.3} s (min {:.3} s; QEMU total-time {:.3} s; QEMU CPU {:.2} s; runs {})",
                med[i],
                min(&wall[i]),
                qmed[i],
                cmed[i],
                list(&wall[i])
            ),
            goal: "for info",
            ok: true,
        });
    }
    let ratio = med[1] / med[0];
    rows.push(Row {
        name: "migration time ratio, shim without RDMA / no shim".into(),
        value: format!(
            "{ratio:.3} (of minima {:.3}; QEMU total-time {:.3}; QEMU CPU {:.3})",
            min(&wall[1]) / min(&wall[0]),
            qmed[1] / qmed[0],
            cmed[1] / cmed[0]
        ),
        goal: "<= 1.05",
        ok: ratio <= GOAL,
    });
    rows.push(Row {
        name: "migration time ratio, shim + fake provider / no shim".into(),
        value: format!(
            "{:.3} (of minima {:.3}; QEMU total-time {:.3}; QEMU CPU {:.3})",
            med[2] / med[0],
            min(&wall[2]) / min(&wall[0]),
            qmed[2] / qmed[0],
            cmed[2] / cmed[0]
        ),
        goal: "for info",
        ok: true,
    });

    println!(
        "\nQEMU {} live migration, 256 MiB random RAM, TCG, stopped guest, loopback, single \
         stream, unthrottled\n",
        version.as_str().unwrap_or("?")
    );
    println!(
        "load average before/after the timed runs: {load_before} / {} ({} CPUs); figures from a \
         busy machine are noise-dominated\n",
        loadavg(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("| measure | result | goal | |");
    println!("| --- | --- | --- | --- |");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} |",
            r.name,
            r.value,
            r.goal,
            if r.ok { "ok" } else { "MISSED" }
        );
    }
    if rows.iter().any(|r| !r.ok) {
        std::process::exit(1);
    }
}
