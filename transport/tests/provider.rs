//! Loading providers, and the NO_DEVICE decision against the fake and the real librdmacm.

mod common;

use common::*;
use rdma_streams_transport::{DEFAULT_PROVIDER, ENV_PROVIDER, Provider, ProviderError};

/// Dispatches the case of a child process; a no-op in the normal test run.
#[test]
fn child_entry() {
    let Some(case) = child_case() else { return };
    match case.as_str() {
        "probe_nodev" => {
            let p = fake();
            let err = p.probe().expect_err("nodev must mean no device");
            assert_eq!(err.errno(), Some(libc::ENODEV));
        }
        "probe_enomem" => {
            let err = fake()
                .probe()
                .expect_err("any rsocket() failure means no device");
            assert_eq!(err.errno(), Some(libc::ENOMEM));
        }
        "from_env_fake" => {
            let p = Provider::from_env().expect("from_env loads the fake");
            assert_eq!(p.name(), std::env::var(ENV_PROVIDER).unwrap());
            p.probe().expect("the fake has a 'device'");
        }
        "from_env_default" => match Provider::from_env() {
            Ok(p) => assert_eq!(p.name(), DEFAULT_PROVIDER),
            Err(ProviderError::Open { name, .. }) => assert_eq!(name, DEFAULT_PROVIDER),
            Err(e) => panic!("unexpected error: {e}"),
        },
        other => panic!("unknown child case {other}"),
    }
}

#[test]
fn missing_library_is_an_open_error() {
    for name in [
        "librdma-streams-no-such-provider.so.7",
        "/nonexistent/dir/libfake.so",
    ] {
        match Provider::load(name) {
            Err(ProviderError::Open { name: n, reason }) => {
                assert_eq!(n, name);
                assert!(!reason.is_empty());
            }
            other => panic!("expected an Open error for {name}, got {other:?}"),
        }
    }
}

#[test]
fn library_without_rsocket_functions_names_the_missing_symbol() {
    match Provider::load("libc.so.6") {
        Err(e @ ProviderError::MissingSymbol { .. }) => {
            let ProviderError::MissingSymbol { name, symbol } = &e else {
                unreachable!()
            };
            assert_eq!(name, "libc.so.6");
            assert_eq!(*symbol, "rsocket");
            assert!(e.to_string().contains("`rsocket`"), "{e}");
        }
        other => panic!("expected MissingSymbol, got {other:?}"),
    }
}

#[test]
fn fake_provider_loads_and_has_a_device() {
    let p = fake();
    assert!(p.name().ends_with("libfakersocket.so"));
    assert!(!p.has_repoll());
    p.probe().expect("the fake reports a usable device");
    // Loading twice is fine (the library is shared, never unloaded).
    fake().probe().unwrap();
}

#[test]
fn probe_reports_no_device_when_rsocket_fails_enodev() {
    child_passes("probe_nodev", &[(ENV_FAULTS, "nodev")]);
}

#[test]
fn probe_reports_no_device_for_any_rsocket_failure() {
    child_passes("probe_enomem", &[(ENV_FAULTS, "enomem")]);
}

#[test]
fn from_env_uses_streamshim_provider() {
    let lib = fake_lib();
    child_passes("from_env_fake", &[(ENV_PROVIDER, lib.to_str().unwrap())]);
}

#[test]
fn from_env_defaults_to_librdmacm() {
    // run_child removes STREAMSHIM_PROVIDER.
    child_passes("from_env_default", &[]);
}

/// Debian's real librdmacm (package librdmacm1, pulled in by `make deps`) must load, and on a
/// machine without RDMA `probe()` must say NO_DEVICE (librdmacm answers ENODEV). This is the
/// path every shimmed process takes on such a host.
#[test]
fn real_librdmacm_loads_and_reports_no_device_without_rdma() {
    let p = Provider::load(DEFAULT_PROVIDER).unwrap_or_else(|e| {
        panic!("{e}: install Debian's librdmacm1 (make deps) to run this test")
    });
    let has_rdma = std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    match p.probe() {
        Err(no_device) => {
            assert!(
                !has_rdma,
                "an RDMA device exists but probe failed: {no_device:?}"
            );
            assert_eq!(no_device.errno(), Some(libc::ENODEV), "{no_device:?}");
        }
        Ok(()) => assert!(has_rdma, "probe succeeded without any RDMA device"),
    }
}
