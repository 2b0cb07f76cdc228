//! `make bench`: admission latency and throughput of the release `rdma-stream-injector serve`
//! over HTTPS (TLS 1.3, HTTP/1.1 keep-alive connections, one per client), at 1, 16 and 64
//! concurrent clients, with a real opted-in pod review; then its resident memory.
//!
//! Goals (issue 4): p99 <= 10 ms at 64 clients and >= 2000 reviews/s, on this 2-core machine
//! with the load generator on the same cores. Exits non-zero when a goal is missed.

// A benchmark harness: a failed step panics, like a test.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::print_stdout, clippy::cast_precision_loss)]

use std::{
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rdma_streams_testkit::stats::percentile;
use rustls::pki_types::ServerName;
use serde_json::json;

#[path = "../tests/support/test_pki.rs"]
mod test_pki;

const BIN: &str = env!("CARGO_BIN_EXE_rdma-stream-injector");
const LEVELS: [(usize, usize); 3] = [(1, 2000), (16, 8000), (64, 12800)];

fn review_body() -> Bytes {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0b7bd6a4-2f6a-4a5c-9f55-7c3b2a1d9e01",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "perf",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": "iperf3-server-7d9f-", "namespace": "",
                             "labels": {"app": "iperf3-server", "rdma-streams.io/inject": "true"}},
                "spec": {"containers": [{"name": "iperf3", "image": "networkstatic/iperf3", "args": ["-s"],
                                         "resources": {"requests": {"cpu": "1", "memory": "256Mi"}}}]}
            },
            "dryRun": false
        }
    });
    Bytes::from(review.to_string())
}

async fn client_loop(
    addr: std::net::SocketAddr,
    tls: tokio_rustls::TlsConnector,
    n: usize,
    body: Bytes,
) -> Vec<Duration> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let stream = tls
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let req = hyper::Request::post("/mutate?timeout=5s")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(body.clone()))
            .unwrap();
        let t0 = Instant::now();
        send.ready().await.unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        lat.push(t0.elapsed());
        assert!(bytes.windows(9).any(|w| w == b"JSONPatch"), "not injected");
    }
    lat
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Kills the server when the benchmark ends, however it ends.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let ca_der = test_pki::write_certs(dir.path());
    let port = rdma_streams_testkit::free_port();
    let child = Command::new(BIN)
        .arg("serve")
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--cluster-access",
            "off",
        ])
        .args(["--log-level", "warn"])
        .arg("--tls-cert")
        .arg(dir.path().join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.path().join("tls.key"))
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn injector");
    let pid = child.id();
    let server = Server(child);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < deadline, "injector did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca_der.into()).unwrap();
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config));
    let body = review_body();

    // Warm-up.
    client_loop(addr, tls.clone(), 200, body.clone()).await;

    println!(
        "\nrdma-stream-injector admission benchmark (release binary, HTTPS, 2 cores shared with the load)\n"
    );
    println!("| clients | reviews | reviews/s | p50 | p99 | max |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let mut ok = true;
    for (clients, total) in LEVELS {
        let per = total / clients;
        let t0 = Instant::now();
        let tasks: Vec<_> = (0..clients)
            .map(|_| tokio::spawn(client_loop(addr, tls.clone(), per, body.clone())))
            .collect();
        let mut lat = Vec::with_capacity(total);
        for t in tasks {
            lat.extend(t.await.unwrap());
        }
        let secs = t0.elapsed().as_secs_f64();
        lat.sort();
        let rate = lat.len() as f64 / secs;
        let (p50, p99) = (percentile(&lat, 0.5), percentile(&lat, 0.99));
        println!(
            "| {clients} | {} | {rate:.0} | {:.2} ms | {:.2} ms | {:.2} ms |",
            lat.len(),
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3,
            lat[lat.len() - 1].as_secs_f64() * 1e3
        );
        if clients == 64 {
            ok &= p99 <= Duration::from_millis(10) && rate >= 2000.0;
        }
    }
    let rss = rss_kib(pid, "VmRSS:");
    let hwm = rss_kib(pid, "VmHWM:");
    println!(
        "\nresident memory of the injector: {:.1} MiB (peak {:.1} MiB)",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    println!(
        "goal at 64 clients: p99 <= 10 ms and >= 2000 reviews/s: {}",
        if ok { "ok" } else { "MISSED" }
    );
    drop(server);
    if !ok {
        std::process::exit(1);
    }
}
