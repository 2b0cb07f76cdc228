//! The shipped `rdma-migration-gateway` (a host-network, host-PID node agent) carries no
//! test-only code: none of its normal or build dependencies is a test crate (the test bed,
//! `rdma-gateway-testbed`, is a crate of its own that is never shipped), the binary names no
//! test module, no flag or variable of its own mentions tests, and the test bed's
//! `--test-events-socket` is an unknown argument to it.

use std::{process::Command, time::Duration};

use rdma_streams_testkit::{process::run, shipped};

const BIN: &str = env!("CARGO_BIN_EXE_rdma-migration-gateway");

#[test]
fn the_shipped_binary_has_no_test_code_or_flags() {
    shipped::assert_no_test_code(env!("CARGO_MANIFEST_DIR"), env!("CARGO_PKG_NAME"), BIN, &[]);
}

#[test]
fn the_test_events_socket_is_an_unknown_argument() {
    let out = run(
        Command::new(BIN).args(["--test-events-socket", "x"]),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("unexpected argument '--test-events-socket'"),
        "{}",
        out.stderr
    );
}
