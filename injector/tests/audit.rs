//! The real `rdma-stream-injector audit` process against a canned API server on 127.0.0.1,
//! reached through a kubeconfig, as an admin runs it after a webhook outage.

// An integration test: its helpers panic to fail the test, as its `#[test]` functions may.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpListener,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_rdma-stream-injector");

/// The webhook's profiles, as its ConfigMap holds them: the default asks for 2 slots.
const PROFILES: &str = "profiles:\n  default:\n    resource: {name: rdma-streams.io/hca, count: 2}\n    shim: {delivery: init-copy, image: rdma-streams/shim-bundle:0.1.0}\n";

fn pod(namespace: &str, name: &str, status_annotation: Option<&str>) -> Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "ownerReferences": [{ "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9c", "uid": "u" }],
        },
        "spec": { "containers": [{ "name": "web", "image": "nginx" }] },
        "status": { "phase": "Running" },
    });
    if let Some(status) = status_annotation {
        pod["metadata"]["annotations"] = json!({ "rdma-streams.io/status": status });
    }
    pod
}

/// Serves `pods` on `/api/v1/pods` and namespace `rdma` (opted in) on `/api/v1/namespaces`,
/// one connection at a time, until the returned flag is set.
fn api_server(pods: Vec<Value>) -> (String, Arc<AtomicBool>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let done = stop.clone();
    listener.set_nonblocking(true).unwrap();
    thread::spawn(move || {
        while !done.load(Ordering::Relaxed) {
            let Ok((stream, _)) = listener.accept() else {
                thread::sleep(Duration::from_millis(5));
                continue;
            };
            stream.set_nonblocking(false).unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            reader.read_line(&mut request_line).unwrap();
            let mut length = 0usize;
            loop {
                let mut header = String::new();
                reader.read_line(&mut header).unwrap();
                if header.trim().is_empty() {
                    break;
                }
                if let Some(v) = header.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap();
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            let path = request_line.split_whitespace().nth(1).unwrap_or_default();
            let answer = if path.contains("/configmaps/") {
                json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": { "name": "inj", "namespace": "rdma-streams" },
                    "data": { "profiles.yaml": PROFILES },
                })
            } else if path.contains("/pods") {
                json!({ "apiVersion": "v1", "kind": "PodList", "metadata": { "resourceVersion": "2" }, "items": pods })
            } else if path.starts_with("/api/v1/namespaces") {
                json!({
                    "apiVersion": "v1", "kind": "PartialObjectMetadataList",
                    "metadata": { "resourceVersion": "1" },
                    "items": [{ "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                                "metadata": { "name": "rdma", "labels": { "rdma-streams.io/inject": "enabled" } } }],
                })
            } else {
                json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404 })
            };
            let text = answer.to_string();
            let mut stream = stream;
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                text.len()
            );
        }
    });
    (url, stop)
}

fn run_audit(url: &str, extra: &[&str]) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {url}\n\
             contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n\
             users:\n- name: u\n  user: {{}}\n"
        ),
    )
    .unwrap();
    let out = Command::new("timeout")
        .arg("60")
        .arg(BIN)
        .arg("audit")
        .args(extra)
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("RDMA_INJECTOR_CONFIG")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_pod_created_while_the_webhook_was_down_fails_the_audit() {
    let (url, stop) = api_server(vec![pod("rdma", "web-7d9c-x1", None)]);
    let (code, stdout, stderr) = run_audit(&url, &[]);
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    assert!(
        stdout.contains("rdma       web-7d9c-x1  ReplicaSet/web-7d9c  not_injected"),
        "{stdout}"
    );
    assert!(
        stdout.contains("1 not injected, 0 outdated, 0 would be denied: restart"),
        "{stdout}"
    );

    let (code, stdout, stderr) = run_audit(&url, &["-o", "json", "-n", "rdma"]);
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    let findings: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(findings[0]["state"], "not_injected");
    assert_eq!(findings[0]["owner"], "ReplicaSet/web-7d9c");
    stop.store(true, Ordering::Relaxed);
}

#[test]
fn the_profiles_can_come_from_the_webhooks_config_map() {
    let (url, stop) = api_server(vec![pod("rdma", "web-7d9c-x1", None)]);
    let (code, stdout, stderr) = run_audit(&url, &["--config-map", "rdma-streams/inj"]);
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    assert!(stdout.contains("not_injected"), "{stdout}");
    let (code, stdout, stderr) = run_audit(&url, &["--config-map", "no-slash"]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(stderr.contains("NAMESPACE/NAME"), "{stderr}");
    stop.store(true, Ordering::Relaxed);
}

#[test]
fn a_kubeconfig_context_can_be_named() {
    let (url, stop) = api_server(vec![pod("rdma", "web-7d9c-x1", None)]);
    let (code, stdout, stderr) = run_audit(&url, &["--context", "c"]);
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    let (code, stdout, stderr) = run_audit(&url, &["--context", "nope"]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(stderr.contains("kubeconfig context \"nope\""), "{stderr}");
    stop.store(true, Ordering::Relaxed);
}

#[test]
fn a_cluster_without_such_pods_passes() {
    let (url, stop) = api_server(vec![json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "plain", "namespace": "default" },
        "spec": { "containers": [{ "name": "c", "image": "busybox" }] },
        "status": { "phase": "Running" },
    })]);
    let (code, stdout, stderr) = run_audit(&url, &[]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert_eq!(stdout, "0 not injected, 0 outdated, 0 would be denied\n");
    stop.store(true, Ordering::Relaxed);
}

#[test]
fn no_api_server_is_a_clear_error() {
    let (code, stdout, stderr) = run_audit("http://127.0.0.1:1", &[]);
    assert_eq!(
        code,
        Some(1),
        "an API failure is an error, not a finding: {stdout}{stderr}"
    );
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("reading the cluster (kubeconfig"),
        "{stderr}"
    );
}
