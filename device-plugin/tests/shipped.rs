//! What ships: the `rdma-device-plugin` binary carries no test double. Its normal and build
//! dependencies hold no test kit (the fixture builder and the fake kubelet are in
//! `rdma-device-plugin-testkit`, a dev-dependency), the binary names no test module, and its
//! command line offers no test or fake flag or variable.

#[test]
fn the_shipped_binary_has_no_test_code_or_flags() {
    rdma_streams_testkit::shipped::assert_no_test_code(
        env!("CARGO_MANIFEST_DIR"),
        env!("CARGO_PKG_NAME"),
        env!("CARGO_BIN_EXE_rdma-device-plugin"),
        &[&["serve"], &["discover"]],
    );
}
