//! The real `rdma-migration-gateway` binary failing at startup, outside any namespace: the
//! error it prints names its cause (the report of `rdma_streams_common::report`).

use std::{error::Error, net::TcpListener, process::Command};

const BIN: &str = env!("CARGO_BIN_EXE_rdma-migration-gateway");

#[test]
fn a_taken_admin_address_is_an_error_with_the_errno() -> Result<(), Box<dyn Error>> {
    let taken = TcpListener::bind("127.0.0.1:0")?;
    let addr = taken.local_addr()?;
    let out = Command::new(BIN)
        .args([
            "--kube",
            "off",
            "--capture-process=",
            "--listen",
            "127.0.0.1:0",
        ])
        // No RDMA library: the gateway falls back to TCP at once and goes on to bind.
        .args(["--provider", "/nonexistent/librdmacm.so.1"])
        .arg("--admin-listen")
        .arg(addr.to_string())
        .env_remove("RDMA_GW_NODE_HOOKS_SOCKET")
        .output()?;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let want = format!(
        "rdma-migration-gateway: binding the admin endpoint on {addr}: Address already in use (os error 98)\n"
    );
    assert!(err.ends_with(&want), "{err}");
    Ok(())
}
