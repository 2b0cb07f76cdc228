//! The shipped `libstreamshim.so` carries no test double: no test-only crate among its
//! dependencies, no test-only module in the library.

mod common;

#[test]
fn the_shipped_library_has_no_test_code() {
    rdma_streams_testkit::shipped::assert_no_test_dependencies(
        env!("CARGO_MANIFEST_DIR"),
        env!("CARGO_PKG_NAME"),
    );
    let lib = common::shim_lib();
    rdma_streams_testkit::shipped::assert_no_test_symbols(&lib.to_string_lossy());
}
