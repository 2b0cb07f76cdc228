//! Every rendered document of every value set, and the checked-in manifests/, validated with
//! `kubernetes-validate --strict` for Kubernetes 1.30 and the newest version the tool knows.
//! Only custom resources (cert-manager, Prometheus Operator) may lack a schema.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use rdma_streams_chart_tests::{
    Rendered, VALIDATE_TIMEOUT, VALUE_SETS, helm, kubernetes_validate, newest_kubernetes, render,
    repo_root, run, write_docs,
};
use rdma_streams_testkit::within;

const OLDEST: &str = "1.30.0";
/// API groups of the custom resources the chart renders; they have no published schema.
const CRD_GROUPS: [&str; 2] = ["cert-manager.io/v1", "monitoring.coreos.com/v1"];

#[test]
fn rendered_documents_pass_kubernetes_validate_strict() {
    within(Duration::from_secs(600), || {
        let Some(helm) = helm() else { return };
        let Some(kv) = kubernetes_validate() else {
            return;
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let mut files: Vec<PathBuf> = Vec::new();
        for set in VALUE_SETS {
            files.extend(write_docs(dir.path(), set.name, &render(&helm, *set, &[])));
        }
        for name in ["rdma-streams.yaml", "rdma-streams-kubevirt.yaml"] {
            let text = std::fs::read_to_string(repo_root().join("manifests").join(name))
                .expect("manifests/ (make manifests)");
            let rendered = Rendered::parse(&text).expect("manifests parse");
            files.extend(write_docs(dir.path(), name, &rendered));
        }
        assert!(files.len() > 100, "only {} documents", files.len());

        for version in [OLDEST.to_string(), newest_kubernetes(&kv)] {
            let out = run(
                Command::new(&kv)
                    .args(["--strict", "--quiet", "-k", &version])
                    .args(&files),
                VALIDATE_TIMEOUT,
            );
            let report = format!("{}{}", out.stdout, out.stderr);
            assert!(
                out.status.success(),
                "kubernetes-validate --strict -k {version} failed:\n{report}"
            );
            for line in report.lines().filter(|l| !l.trim().is_empty()) {
                assert!(
                    line.contains("Couldn't find schema")
                        && CRD_GROUPS.iter().any(|g| line.contains(g)),
                    "unexpected kubernetes-validate output for {version}: {line}"
                );
            }
        }
    });
}
