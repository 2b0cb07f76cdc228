//! Link hygiene of `libstreamshim.so`: it needs only libc (and libgcc_s, the loader) and
//! exports exactly the hook symbols (`streamshim.map`).

mod common;

use std::process::Command;

use common::*;

fn tool(cmd: &str, args: &[&str]) -> String {
    let lib = shim_lib();
    let out = Command::new(cmd)
        .args(args)
        .arg(&lib)
        .output()
        .unwrap_or_else(|e| panic!("{cmd} (binutils) is needed: {e}"));
    assert!(out.status.success(), "{cmd} {args:?} failed: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn needs_only_libc() {
    let dynamic = tool("readelf", &["-d", "-W"]);
    let needed: Vec<&str> = dynamic
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1)?.split(']').next())
        .collect();
    assert!(needed.contains(&"libc.so.6"), "NEEDED: {needed:?}");
    for lib in &needed {
        assert!(
            *lib == "libc.so.6" || *lib == "libgcc_s.so.1" || lib.starts_with("ld-linux"),
            "unexpected NEEDED {lib} (all: {needed:?}); rdma-core must only be dlopen'ed"
        );
    }
}

#[test]
fn exports_exactly_the_hooks() {
    let syms = tool("nm", &["-D", "--defined-only"]);
    let mut names: Vec<&str> = syms
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    names.sort_unstable();
    assert_eq!(names, HOOKS, "nm -D --defined-only:\n{syms}");
    // Unversioned (anonymous version node): a versioned definition would not satisfy the
    // programs' socket@GLIBC_2.2.5 references.
    assert!(!syms.contains('@'), "hooks must be unversioned:\n{syms}");
}
