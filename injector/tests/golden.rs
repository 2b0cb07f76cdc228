//! Golden files shared by the CLI and the webhook paths.
//!
//! `tests/data/golden/<name>.yaml` -> `<name>.injected.yaml` through the real binary's
//! `inject -f`; every pod (and pod template) in it must come out of the webhook handler the
//! same way. `UPDATE_GOLDEN=1 cargo test -p rdma-stream-injector --test golden` rewrites the
//! expected files; a stale one fails the test.

// An integration test: its helpers panic to fail the test, as its `#[test]` functions may.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
};

use kube::core::{
    DynamicObject,
    admission::{AdmissionRequest, AdmissionReview},
};
use rdma_stream_injector::{
    Handler, InjectorHandler, NamespaceCache, Outcome, Reviewed, apply, parse_documents,
    profile::Config,
};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_rdma-stream-injector");

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden")
}

fn inputs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.ends_with(".yaml") && !n.ends_with(".injected.yaml")
        })
        .collect();
    v.sort();
    assert!(v.len() >= 5, "golden inputs missing: {v:?}");
    v
}

fn cli_inject(input: &Path) -> String {
    let out = Command::new(BIN)
        .args(["inject", "-f"])
        .arg(input)
        .env_remove("RDMA_INJECTOR_CONFIG")
        .output()
        .expect("run inject");
    assert!(
        out.status.success(),
        "inject -f {} failed: {}",
        input.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn cli_output_matches_golden_files() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    for input in inputs() {
        let got = cli_inject(&input);
        let expected_path = input.with_extension("injected.yaml");
        if update {
            std::fs::write(&expected_path, &got).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_else(|_| {
            panic!(
                "{} missing: run with UPDATE_GOLDEN=1",
                expected_path.display()
            )
        });
        assert_eq!(
            got,
            expected,
            "{} is stale (UPDATE_GOLDEN=1 regenerates it)",
            expected_path.display()
        );
    }
}

/// The pod the webhook would see for a document (a Pod, or a template wrapped as one).
fn pods_of(doc: &Value) -> Vec<(String, Value)> {
    let kind = doc["kind"].as_str().unwrap_or_default();
    let wrap = |t: &Value| json!({"apiVersion": "v1", "kind": "Pod", "metadata": t["metadata"].clone(), "spec": t["spec"].clone()});
    match kind {
        "Pod" => vec![("/".to_string(), doc.clone())],
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" => {
            vec![("/spec/template".to_string(), wrap(&doc["spec"]["template"]))]
        }
        "CronJob" => vec![(
            "/spec/jobTemplate/spec/template".to_string(),
            wrap(&doc["spec"]["jobTemplate"]["spec"]["template"]),
        )],
        _ => vec![],
    }
}

fn review_for(pod: &Value, namespace: &str) -> AdmissionRequest<DynamicObject> {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    });
    let review: AdmissionReview<DynamicObject> = serde_json::from_value(review).unwrap();
    review.try_into().unwrap()
}

#[test]
fn webhook_path_yields_the_same_pods() {
    let handler = InjectorHandler {
        profiles: tokio::sync::watch::channel(Arc::new(Config::builtin_default())).1,
        namespaces: NamespaceCache::disabled(),
    };
    let mut compared = 0;
    for input in inputs() {
        let before = parse_documents(&std::fs::read_to_string(&input).unwrap()).unwrap();
        let after = parse_documents(&cli_inject(&input)).unwrap();
        assert_eq!(before.len(), after.len());
        for (b, a) in before.iter().zip(&after) {
            for ((ptr, pod), (_, cli_pod)) in pods_of(b).into_iter().zip(pods_of(a)) {
                // The CLI opts workloads in with the label; the webhook sees pods that carry it.
                let mut pod = pod;
                if pod
                    .pointer("/metadata/labels/rdma-streams.io~1inject")
                    .is_none()
                    && pod
                        .pointer("/metadata/annotations/rdma-streams.io~1inject")
                        .is_none()
                {
                    pod["metadata"]["labels"]["rdma-streams.io/inject"] = json!("true");
                }
                let ns = b["metadata"]["namespace"].as_str().unwrap_or("default");
                let req = review_for(&pod, ns);
                let webhook_pod = match handler.review(&req) {
                    Reviewed::Allow(allowed) => match (allowed.outcome, allowed.patch) {
                        (Outcome::Injected, Some(patch)) => apply(&pod, &patch).unwrap(),
                        _ => pod.clone(),
                    },
                    other => panic!("{}: webhook said {other:?}", input.display()),
                };
                let strip = |mut v: Value| {
                    if let Some(o) = v.as_object_mut() {
                        o.remove("apiVersion");
                        o.remove("kind");
                    }
                    v
                };
                assert_eq!(
                    strip(webhook_pod),
                    strip(cli_pod),
                    "{} at {ptr}: webhook and CLI disagree",
                    input.display()
                );
                compared += 1;
            }
        }
    }
    assert!(compared >= 5, "compared only {compared} pods");
}

#[test]
fn inject_is_idempotent_on_its_own_output() {
    let dir = tempfile::tempdir().unwrap();
    for input in inputs() {
        let once = cli_inject(&input);
        let path = dir.path().join("once.yaml");
        std::fs::write(&path, &once).unwrap();
        assert_eq!(
            cli_inject(&path),
            once,
            "{}: injecting twice changed it",
            input.display()
        );
    }
}

#[test]
fn diff_mode_and_errors() {
    let input = golden_dir().join("pod-basic.yaml");
    let out = Command::new(BIN)
        .args(["inject", "--diff", "-f"])
        .arg(&input)
        .output()
        .unwrap();
    assert!(out.status.success());
    let diff = String::from_utf8_lossy(&out.stdout);
    assert!(
        diff.contains("+        - name: STREAMSHIM_MODE") || diff.contains("STREAMSHIM"),
        "{diff}"
    );
    assert!(
        diff.lines()
            .any(|l| l.starts_with("+") && l.contains("IPC_LOCK")),
        "{diff}"
    );

    let out = Command::new(BIN)
        .args(["inject", "--profile", "nope", "-f"])
        .arg(&input)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown profile"));

    let bad = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(bad.path(), "kind: Pod\n  bad: [indent\n").unwrap();
    let out = Command::new(BIN)
        .args(["inject", "-f"])
        .arg(bad.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("document 0"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Each error the CLI prints names its cause after the message (one line, `: `-joined).
#[test]
fn errors_name_their_cause() {
    let stderr = |args: &[&str], file: &Path| {
        let out = Command::new(BIN)
            .args(["inject"])
            .args(args)
            .arg("-f")
            .arg(file)
            .env_remove("RDMA_INJECTOR_CONFIG")
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let dir = tempfile::tempdir().unwrap();
    let input = golden_dir().join("pod-basic.yaml");

    let missing = dir.path().join("missing.yaml");
    let err = stderr(&[], &missing);
    let want = format!(
        "rdma-stream-injector: reading {}: No such file or directory (os error 2)\n",
        missing.display()
    );
    assert!(err.ends_with(&want), "{err}");

    let err = stderr(&["--config", &dir.path().to_string_lossy()], &input);
    let want = format!(
        "rdma-stream-injector: cannot read profile config {}: Is a directory (os error 21)\n",
        dir.path().display()
    );
    assert!(err.ends_with(&want), "{err}");

    // The YAML reader's own words follow the document index.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "kind: Pod\n  bad: [indent\n").unwrap();
    let err = stderr(&[], &bad);
    let line = err.lines().last().unwrap_or_default();
    assert!(
        line.starts_with("rdma-stream-injector: document 0: not valid YAML: ")
            && line.contains("line 2"),
        "{err}"
    );
}
