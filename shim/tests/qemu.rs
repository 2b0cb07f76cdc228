//! QEMU live migration under the shim: `tests/tools/qemu_migrate.py` migrates a stopped TCG
//! guest with 256 MiB of preallocated random RAM from a source QEMU to a destination QEMU
//! (`-incoming defer`) on loopback, each case in its own network namespace with a hard timeout,
//! and checks the RAM arrived byte-exact; the shim's `STREAMSHIM_STATS` prove which path
//! carried it. These machines have no RDMA device: here the shim passes through (the Soft-RoCE
//! suite migrates single stream and multifd over real RDMA streams).
//!
//! The cases run one at a time and share one cached RAM image (see `qemu_tool`).

// Each migration's result line goes to the captured stdout (shown when a case fails).
#![allow(clippy::print_stdout)]

mod common;
mod qemu_tool;

use qemu_tool::{Shim, migrate};

#[test]
fn single_stream_both_shimmed_without_rdma_is_tcp_no_device() {
    let m = migrate(Shim::NoRdma, "");
    println!("{}", m.result);
    m.assert_verified();
    m.assert_tcp("NO_DEVICE");
}

/// The harness's own check: one destination byte flipped after the migration in the RAM the
/// guest sees (at 64 MiB) and one in the PAM window (where the guest sees ROM) are both caught.
#[test]
fn ram_check_catches_a_changed_byte() {
    let m = migrate(Shim::None, "--corrupt-dst 0x4000000 --corrupt-dst 0xc8000");
    let r = &m.result;
    println!("{r}");
    assert_eq!(m.exit_code, 1, "{r}");
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["ram_match"], false, "{r}");
    assert_eq!(r["ram_first_difference"], 0x400_0000, "{r}");
    assert_eq!(r["ram_differing_bytes"], 1, "{r}");
    assert_eq!(r["ram_pam_window"], "differs", "{r}");
}
