//! The shipped injector carries no test double: no test-only crate among its dependencies,
//! no test-only module in the binary, no test flag in any `--help`.

#[test]
fn the_shipped_binary_has_no_test_code_or_flags() {
    rdma_streams_testkit::shipped::assert_no_test_code(
        env!("CARGO_MANIFEST_DIR"),
        env!("CARGO_PKG_NAME"),
        env!("CARGO_BIN_EXE_rdma-stream-injector"),
        &[&["serve"], &["inject"], &["audit"]],
    );
}
