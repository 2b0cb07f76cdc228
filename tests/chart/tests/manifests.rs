//! manifests/ is what `make manifests` renders from the chart now.

use std::process::Command;
use std::time::Duration;

use rdma_streams_chart_tests::{helm, repo_root, run};
use rdma_streams_testkit::within;

#[test]
fn manifests_match_the_chart() {
    within(Duration::from_secs(120), || {
        let Some(helm) = helm() else { return };
        let out = run(
            Command::new("bash")
                .arg(repo_root().join("scripts/render-manifests.sh"))
                .arg("--check")
                .env("HELM", &helm),
            Duration::from_secs(100),
        );
        assert!(
            out.status.success(),
            "manifests/ is stale; run `make manifests`:\n{}{}",
            out.stdout,
            out.stderr
        );
    });
}
