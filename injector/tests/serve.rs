//! The real `rdma-stream-injector serve` process, driven by curl over real HTTPS with a
//! private CA, the way the API server calls it (caBundle = that CA).

// An integration test: its helpers panic to fail the test, as its `#[test]` functions may.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

#[path = "support/test_pki.rs"]
mod test_pki;

const BIN: &str = env!("CARGO_BIN_EXE_rdma-stream-injector");

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    let code = code.trim().parse().unwrap_or(0);
    if code == 0 {
        // No HTTP answer: say why (curl's own message).
        return (0, String::from_utf8_lossy(&out.stderr).into_owned());
    }
    (code, body.to_string())
}

fn review(pod: &Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "b3b7a8f0-1111-4c2e-9d7a-5f0e4c3a2b10",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "perf",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "dryRun": false
        }
    })
}

fn base64_decode(s: &str) -> Vec<u8> {
    const ALPHA: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let mut buf = 0u32;
    let mut bits = 0;
    for c in s.bytes().filter(|c| *c != b'=') {
        let v = ALPHA.iter().position(|a| *a == c).unwrap() as u32;
        buf = (buf << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buf >> bits) as u8);
            buf &= (1 << bits) - 1;
        }
    }
    out
}

#[test]
fn serves_admission_reviews_over_https_and_drains() {
    let dir = tempfile::tempdir().unwrap();
    test_pki::write_certs(dir.path());
    let port = rdma_streams_testkit::free_port();
    let admin = rdma_streams_testkit::free_port();
    let child = Command::new(BIN)
        .arg("serve")
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
        .arg("--tls-cert")
        .arg(dir.path().join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.path().join("tls.key"))
        .args(["--cluster-access", "off", "--log-format", "json"])
        .args(["--shutdown-delay-ms", "300"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut proc = Proc(child);

    let ready_url = format!("http://127.0.0.1:{admin}/ready");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if curl(&[&ready_url]).0 == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "never ready");
        std::thread::sleep(Duration::from_millis(100));
    }

    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "iperf3-server-7d9f-", "labels": {"rdma-streams.io/inject": "true"}},
        "spec": {"containers": [{"name": "iperf3", "image": "networkstatic/iperf3", "args": ["-s"]}]}
    });
    let body_path = dir.path().join("review.json");
    std::fs::write(&body_path, review(&pod).to_string()).unwrap();
    let url = format!("https://127.0.0.1:{port}/mutate");
    let ca = dir.path().join("ca.crt").to_string_lossy().into_owned();
    let data = format!("@{}", body_path.display());
    for proto in ["--http1.1", "--http2"] {
        let (code, body) = curl(&[
            proto,
            "--cacert",
            &ca,
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            &data,
            &url,
        ]);
        assert_eq!(code, 200, "{proto}: {body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(answer["kind"], "AdmissionReview");
        let resp = &answer["response"];
        assert_eq!(resp["uid"], "b3b7a8f0-1111-4c2e-9d7a-5f0e4c3a2b10");
        assert_eq!(resp["allowed"], true);
        assert_eq!(resp["patchType"], "JSONPatch");
        let patch: json_patch::Patch =
            serde_json::from_slice(&base64_decode(resp["patch"].as_str().unwrap())).unwrap();
        let mut patched = pod.clone();
        json_patch::patch(&mut patched, &patch).unwrap();
        let c = &patched["spec"]["containers"][0];
        let env = c["env"].as_array().unwrap();
        assert!(env.iter().any(|e| e["name"] == "LD_PRELOAD"
            && e["value"].as_str().unwrap().ends_with("libstreamshim.so")));
        assert_eq!(c["resources"]["limits"]["rdma-streams.io/hca"], "1");
        assert_eq!(c["resources"]["requests"]["rdma-streams.io/hca"], "1");
        assert!(patched["metadata"]["annotations"]["rdma-streams.io/status"].is_string());
    }

    // Only POST /mutate; nothing else.
    assert_eq!(
        curl(&["--cacert", &ca, &format!("https://127.0.0.1:{port}/other")]).0,
        404
    );
    let (code, _) = curl(&[
        "--cacert",
        &ca,
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        "{not json",
        &url,
    ]);
    assert_eq!(code, 400);
    // A client that does not trust our CA cannot talk to us (and we do not crash).
    let (code, _) = curl(&[&url]);
    assert_eq!(code, 0);

    let (code, metrics) = curl(&[&format!("http://127.0.0.1:{admin}/metrics")]);
    assert_eq!(code, 200);
    assert!(metrics.contains("rdma_stream_injector"), "{metrics}");
    // Every family exported is in the docs' metrics table, every row is a metric the code
    // registers, and every name the docs mention is exported.
    let exported = rdma_streams_testkit::docs::metric_families(&metrics);
    let page = rdma_streams_testkit::docs::read("injector.md");
    let table = rdma_streams_testkit::docs::table(&page, &["metric", "type", "labels", "meaning"]);
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let prefix = "rdma_stream_injector_";
    rdma_streams_testkit::docs::check_metrics_table(
        "injector.md",
        &table,
        &exported,
        prefix,
        &[&src],
    );
    rdma_streams_testkit::docs::check_metrics_mentioned(prefix, &exported, &[&src]);

    let pid = proc.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = proc.0.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn bad_certificate_files_are_a_clear_startup_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), "not a certificate").unwrap();
    std::fs::write(dir.path().join("tls.key"), "not a key").unwrap();
    let out = Command::new(BIN)
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--cluster-access", "off"])
        .arg("--tls-cert")
        .arg(dir.path().join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.path().join("tls.key"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tls.crt") || err.contains("tls.key"), "{err}");
}
