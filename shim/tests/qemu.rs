//! QEMU live migration under the shim: `tests/tools/qemu_migrate.py` migrates a stopped TCG
//! guest with 256 MiB of preallocated random RAM from a source QEMU to a destination QEMU
//! (`-incoming defer`) on loopback, each case in its own network namespace with a hard timeout,
//! and checks the RAM arrived byte-exact. The fake provider's counters
//! (`FAKE_RSOCKET_STATS_DIR`) and the shim's `STREAMSHIM_STATS` prove which path carried it.
//!
//! The cases run one at a time and share one cached RAM image (see `qemu_tool`).

// Each migration's result line goes to the captured stdout (shown when a case fails).
#![allow(clippy::print_stdout)]

mod common;
mod qemu_tool;

use std::io::Write;

use qemu_tool::{PORT, Shim, migrate, qemu_version};

#[test]
fn single_stream_both_shimmed_fake_provider_is_upgraded() {
    let m = migrate(Shim::Fake, "");
    println!("{}", m.result);
    m.assert_verified();
    assert_eq!(m.result["multifd_channels"], 0);
    m.assert_upgraded(1);
}

#[test]
fn single_stream_both_shimmed_without_rdma_is_tcp_no_device() {
    let m = migrate(Shim::NoRdma, "");
    println!("{}", m.result);
    m.assert_verified();
    m.assert_tcp("NO_DEVICE");
}

/// Multifd with 4 channels where QEMU maps channels by magic (>= 8.0). Before 8.0 the
/// destination takes the first accepted connection as the main channel, so multifd is only as
/// good as the accept order; the issue asks for single stream there, so this case says why and
/// migrates single stream, with the destination listening on `[::]` (as libvirt does) and the
/// source migrating to 127.0.0.1: a dual-stack listener, a v4-mapped peer, and a listen URI
/// that differs from the target URI.
#[test]
fn multifd_by_magic_else_single_stream_to_dual_stack_listener() {
    let v = qemu_version();
    if v["multifd_by_magic"] == true {
        let m = migrate(Shim::Fake, "--multifd 4");
        println!("{}", m.result);
        m.assert_verified();
        assert_eq!(m.result["multifd_channels"], 4);
        // The main channel and the 4 multifd channels.
        m.assert_upgraded(5);
    } else {
        // Straight to stderr, past the test harness's capture: this must show in every run.
        let _ = writeln!(
            std::io::stderr(),
            "multifd NOT run: QEMU {} < 8.0 maps incoming multifd channels by accept order, not \
             by their magic; multifd is required only where QEMU orders channels by magic \
             (>= 8.0), so this case migrates single stream (listen tcp:[::]:{PORT}, target \
             tcp:127.0.0.1:{PORT})",
            v["qemu_version"].as_str().unwrap_or("?")
        );
        let m = migrate(
            Shim::Fake,
            &format!("--listen 'tcp:[::]:{PORT}' --target tcp:127.0.0.1:{PORT}"),
        );
        println!("{}", m.result);
        m.assert_verified();
        assert_eq!(m.result["multifd_channels"], 0);
        m.assert_upgraded(1);
    }
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
