//! Links `libstreamshim.so` with `streamshim.map`, so that only the hook symbols are exported.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".to_owned());
    println!("cargo:rerun-if-changed=streamshim.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/streamshim.map");
}
