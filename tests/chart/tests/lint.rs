//! `helm lint --strict` with the defaults and with every value set.

use std::time::Duration;

use rdma_streams_chart_tests::{
    NAMESPACE, VALUE_SETS, chart_dir, helm, helm_run, value_set, values_args,
};
use rdma_streams_testkit::within;

#[test]
fn lint_strict_passes_for_every_value_set() {
    within(Duration::from_secs(240), || {
        let Some(helm) = helm() else { return };
        for set in VALUE_SETS {
            let mut args: Vec<String> = vec![
                "lint".into(),
                "--strict".into(),
                chart_dir().display().to_string(),
                "--namespace".into(),
                NAMESPACE.into(),
            ];
            args.extend(values_args(*set));
            let out = helm_run(&helm, &args);
            assert!(
                out.status.success() && out.stdout.contains("0 chart(s) failed"),
                "helm lint --strict ({}) failed:\n{}\n{}",
                set.name,
                out.stdout,
                out.stderr
            );
        }
    });
}

#[test]
fn notes_tell_how_to_opt_in_and_verify() {
    within(Duration::from_secs(120), || {
        let Some(helm) = helm() else { return };
        for set in ["default", "kubevirt", "injector-certs"] {
            let mut args: Vec<String> = [
                "install",
                "rdma-streams",
                &chart_dir().display().to_string(),
                "--namespace",
                NAMESPACE,
                "--dry-run=client",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            args.extend(values_args(value_set(set)));
            let out = helm_run(&helm, &args);
            assert!(out.status.success(), "{set}: {}", out.stderr);
            let notes = out
                .stdout
                .split("NOTES:")
                .nth(1)
                .unwrap_or_else(|| panic!("{set}: no NOTES"));
            for needle in [
                "rdma-streams.io/inject: \"true\"",
                "rdma-streams.io/inject=enabled",
                "rdma-streams\\.io/status",
                "--dry-run=server",
                "kube-system, kube-public, kube-node-lease, rdma-streams are never injected",
            ] {
                assert!(
                    notes.contains(needle),
                    "{set}: NOTES lack {needle:?}:\n{notes}"
                );
            }
            assert_eq!(
                notes.contains("rdma-streams.io/migration"),
                set == "kubevirt",
                "{set}"
            );
        }
    });
}
