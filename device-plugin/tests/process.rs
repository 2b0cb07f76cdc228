//! The real `rdma-device-plugin` binary as a process: `discover`, serving a fake kubelet,
//! the admin endpoint, and SIGTERM draining.

// An integration test: its helpers panic to fail the test, as its `#[test]` functions may.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use common::{Harness, LIMIT, RESOURCE, SOON};
use rdma_streams_testkit::{docs, free_port, within_async};

const BIN: &str = env!("CARGO_BIN_EXE_rdma-device-plugin");
const EXAMPLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../examples/sysfs/two-hca-node"
);

fn discover(sys: &Path, dev: &Path, extra: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .arg("discover")
        .arg("--sysfs-root")
        .arg(sys)
        .arg("--dev-root")
        .arg(dev)
        .args(extra)
        .env_remove("RDMA_DP_CONFIG")
        .output()
        .expect("run discover");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn discover_example_tree_as_yaml_and_json() {
    let sys = Path::new(EXAMPLE).join("sys");
    let dev = Path::new(EXAMPLE).join("dev");
    let (ok, yaml, err) = discover(&sys, &dev, &[]);
    assert!(ok, "{err}");
    let v: serde_json::Value = rdma_streams_yaml::from_str(&yaml).expect("yaml");
    let names: Vec<_> = v["hcas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["mlx5_0", "mlx5_1", "mlx5_2"]);
    assert_eq!(v["netnsMode"].as_str(), Some("shared"));
    assert!(v.get("notes").is_none(), "{yaml}");
    assert_eq!(v["hcas"][0]["numaNode"].as_i64(), Some(0));
    assert_eq!(v["hcas"][1]["numaNode"].as_i64(), Some(1));
    assert_eq!(v["hcas"][2]["bus"]["kind"].as_str(), Some("auxiliary"));
    assert_eq!(
        v["hcas"][2]["bus"]["parentPci"].as_str(),
        Some("0000:af:00.0")
    );
    assert_eq!(v["pools"][0]["resourceName"].as_str(), Some(RESOURCE));
    assert_eq!(v["pools"][0]["healthyDevices"].as_u64(), Some(3 * 64));
    assert_eq!(v["pools"][0]["sampleIds"][0].as_str(), Some("mlx5_0-0000"));

    let (ok, json, err) = discover(&sys, &dev, &["-o", "json"]);
    assert!(ok, "{err}");
    let j: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert_eq!(j["hcas"][1]["ports"][0]["linkLayer"], "Ethernet");
    assert_eq!(j["hcas"][0]["health"]["status"], "Healthy");
}

#[test]
fn discover_with_no_rdma_says_so() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("sys/class/net")).unwrap();
    std::fs::create_dir_all(dir.path().join("dev")).unwrap();
    let (ok, yaml, err) = discover(&dir.path().join("sys"), &dir.path().join("dev"), &[]);
    assert!(ok, "{err}");
    assert!(yaml.contains("no RDMA device found"), "{yaml}");
    assert!(yaml.contains("hcas: []"), "{yaml}");
}

#[test]
fn discover_warns_about_exclusive_netns_mode() {
    let dir = tempfile::tempdir().unwrap();
    let tree = rdma_device_plugin_testkit::fixture::FixtureTree::new(dir.path()).unwrap();
    tree.add_hca(rdma_device_plugin_testkit::fixture::HcaSpec::connectx_ib(
        "mlx5_0",
        "0000:3b:00.0",
    ))
    .unwrap();
    tree.write_sys("module/ib_core/parameters/netns_mode", "N\n")
        .unwrap();
    let (ok, yaml, err) = discover(&tree.sys_root(), &tree.dev_root(), &[]);
    assert!(ok, "{err}");
    let v: serde_json::Value = rdma_streams_yaml::from_str(&yaml).expect("yaml");
    assert_eq!(v["netnsMode"].as_str(), Some("exclusive"));
    let notes = v["notes"].as_array().expect("notes");
    assert!(
        notes
            .iter()
            .any(|n| n.as_str().unwrap().contains("rdma system set netns shared")),
        "{yaml}"
    );
}

#[test]
fn discover_with_a_bad_config_fails_with_location() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.yaml");
    std::fs::write(
        &cfg,
        "pools:\n  - resourceName: rdma-streams.io/hca\n    slots: 3\n",
    )
    .unwrap();
    let sys = Path::new(EXAMPLE).join("sys");
    let dev = Path::new(EXAMPLE).join("dev");
    let (ok, _, err) = discover(&sys, &dev, &["--config", &cfg.to_string_lossy()]);
    assert!(!ok);
    assert!(err.contains("line 3"), "{err}");
    assert!(err.contains("slots"), "{err}");
}

#[test]
fn discover_errors_name_their_cause() {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path().join("no-such-sys");
    let dev = Path::new(EXAMPLE).join("dev");
    let (ok, _, err) = discover(&sys, &dev, &[]);
    assert!(!ok);
    let want = format!(
        "rdma-device-plugin: sysfs root {} is not readable: No such file or directory (os error 2)\n",
        sys.display()
    );
    assert!(err.ends_with(&want), "{err}");

    // A config path that is a directory: the reason is the kernel's.
    let sys = Path::new(EXAMPLE).join("sys");
    let (ok, _, err) = discover(&sys, &dev, &["--config", &dir.path().to_string_lossy()]);
    assert!(!ok);
    let want = format!(
        "rdma-device-plugin: cannot read config {}: Is a directory (os error 21)\n",
        dir.path().display()
    );
    assert!(err.ends_with(&want), "{err}");
}

fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect admin");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).unwrap();
    let code = buf[9..12].parse().unwrap();
    (code, buf)
}

struct Plugin(Child);

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends SIGTERM to `child` (a drain, as kubelet stops a pod).
fn sigterm(child: &Child) {
    let pid = child.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(sent.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_admin_endpoint_and_drains_on_sigterm() {
    within_async(LIMIT, async {
        let h = Harness::new(Harness::two_hcas()).await;
        let addr = format!("127.0.0.1:{}", free_port());
        let child = h
            .plugin_command(BIN)
            .args(["--admin-listen", &addr, "--log-format", "json"])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn plugin");
        let mut plugin = Plugin(child);
        h.kubelet.wait_registered(RESOURCE, 1, SOON).await.unwrap();
        h.kubelet
            .wait_devices(RESOURCE, SOON, |d| d.len() == 128)
            .await
            .unwrap();

        let a = addr.clone();
        let (live, ready, metrics) = tokio::task::spawn_blocking(move || {
            (
                http_get(&a, "/live"),
                http_get(&a, "/ready"),
                http_get(&a, "/metrics"),
            )
        })
        .await
        .unwrap();
        assert_eq!(live.0, 200);
        assert_eq!(ready.0, 200, "{}", ready.1);
        assert!(
            ready.1.contains("rdma-streams.io/hca registered"),
            "{}",
            ready.1
        );
        assert_eq!(metrics.0, 200);
        for needle in [
            "rdma_dp_devices{resource=\"rdma-streams.io/hca\",health=\"Healthy\"} 128",
            "rdma_dp_registrations_total{resource=\"rdma-streams.io/hca\",result=\"ok\"} 1",
            "rdma_dp_listandwatch_streams{resource=\"rdma-streams.io/hca\"} 1",
            "rdma_dp_registered{resource=\"rdma-streams.io/hca\"} 1",
            "rdma_dp_standby{resource=\"rdma-streams.io/hca\"} 0",
            "rdma_dp_netns_exclusive 0",
            "rdma_dp_hcas{health=\"Healthy\"} 2",
            "rdma_dp_config_reloads_total 0",
        ] {
            assert!(
                metrics.1.contains(needle),
                "missing {needle} in\n{}",
                metrics.1
            );
        }
        // Every family exported is in the docs' metrics table, and every row and every name the
        // docs mention is a metric the code registers.
        let exported = docs::metric_families(&metrics.1);
        let page = docs::read("device-plugin.md");
        let table = docs::table(&page, &["metric", "type", "labels", "meaning"]);
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        docs::check_metrics_table("device-plugin.md", &table, &exported, "rdma_dp_", &[&src]);
        docs::check_metrics_mentioned("rdma_dp_", &exported, &[&src]);

        let sock = h.kubelet.endpoint(RESOURCE).unwrap();
        assert!(sock.exists());
        // SIGTERM: streams end, the socket goes, exit 0.
        sigterm(&plugin.0);
        let status = tokio::task::spawn_blocking(move || {
            let s = plugin.0.wait().unwrap();
            let mut err = String::new();
            plugin
                .0
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            (s, err)
        })
        .await
        .unwrap();
        assert!(status.0.success(), "exit: {:?}\n{}", status.0, status.1);
        assert!(!sock.exists(), "socket removed on SIGTERM");
        assert!(
            status.1.lines().any(|l| l.contains("\"draining\"")),
            "{}",
            status.1
        );
        // Every log line is JSON.
        for line in status.1.lines() {
            serde_json::from_str::<serde_json::Value>(line)
                .unwrap_or_else(|e| panic!("{e}: {line}"));
        }
        h.kubelet
            .wait_for("the stream to end", SOON, |k| !k.stream_open(RESOURCE))
            .await
            .unwrap();
    })
    .await;
}

#[test]
fn bad_flag_value_is_a_clear_error() {
    let out = Command::new(BIN)
        .args(["--registration", "guess"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("kubelet-sock") && err.contains("plugin-watcher"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_log_pipe_does_not_kill_the_plugin() {
    within_async(LIMIT, async {
        let h = Harness::new(Harness::two_hcas()).await;
        let mut child = h
            .plugin_command(BIN)
            .args(["--log-level", "debug"])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn plugin");
        // The log reader goes away: every later log line hits a broken pipe.
        drop(child.stderr.take());
        h.kubelet.wait_registered(RESOURCE, 1, SOON).await.unwrap();
        h.tree
            .set_port_state("mlx5_0", 1, "DOWN", "Disabled")
            .unwrap();
        h.kubelet
            .wait_devices(RESOURCE, SOON, |d| common::all_of(d, "mlx5_0", "Unhealthy"))
            .await
            .unwrap();
        assert!(
            child.try_wait().unwrap().is_none(),
            "plugin died on a closed stderr"
        );
        sigterm(&child);
        let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
            .await
            .unwrap();
        assert!(status.success(), "{status:?}");
    })
    .await;
}

/// GETs `path` from the admin endpoint at `addr` until `done` holds for the answer.
async fn wait_admin(
    addr: &str,
    path: &'static str,
    what: &str,
    done: impl Fn(u16, &str) -> bool,
) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let a = addr.to_owned();
        let answer = tokio::task::spawn_blocking(move || {
            TcpStream::connect(&a).ok().map(|_| http_get(&a, path))
        })
        .await
        .unwrap();
        if let Some((code, body)) = answer
            && done(code, &body)
        {
            return body;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: never");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_stands_by_and_takes_over_when_the_first_exits() {
    within_async(LIMIT, async {
        let h = Harness::new(Harness::two_hcas()).await;
        let spawn = |addr: &str| {
            Plugin(
                h.plugin_command(BIN)
                    .args(["--admin-listen", addr, "--socket-poll-ms", "200"])
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("spawn plugin"),
            )
        };
        let (addr_a, addr_b) = (
            format!("127.0.0.1:{}", free_port()),
            format!("127.0.0.1:{}", free_port()),
        );
        let first = spawn(&addr_a);
        h.kubelet.wait_registered(RESOURCE, 1, SOON).await.unwrap();
        let sock = h.kubelet.endpoint(RESOURCE).unwrap();
        let sock_id = rdma_streams_common::file_id::file_id(&sock);

        // A second instance (a maxSurge rollout): ready, but standing by.
        let _second = spawn(&addr_b);
        let ready = wait_admin(
            &addr_b,
            "/ready",
            "the second instance ready",
            |code, body| code == 200 && body.contains("standby"),
        )
        .await;
        assert!(ready.contains("rdma-streams.io/hca standby"), "{ready}");
        wait_admin(&addr_b, "/metrics", "the standby gauge", |_, body| {
            body.contains("rdma_dp_standby{resource=\"rdma-streams.io/hca\"} 1")
                && body.contains("rdma_dp_registered{resource=\"rdma-streams.io/hca\"} 0")
        })
        .await;
        // It leaves the first one's socket and registration alone (without the lock it would
        // take the socket, and both would re-register in a loop).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(h.kubelet.registrations(RESOURCE), 1);
        assert_eq!(rdma_streams_common::file_id::file_id(&sock), sock_id);
        assert!(h.kubelet.stream_open(RESOURCE));

        // The first one ends (SIGTERM drain): the second takes over within a poll interval.
        sigterm(&first.0);
        h.kubelet.wait_registered(RESOURCE, 2, SOON).await.unwrap();
        h.kubelet
            .wait_devices(RESOURCE, SOON, |d| d.len() == 128)
            .await
            .unwrap();
        let ready = wait_admin(
            &addr_b,
            "/ready",
            "the second instance registered",
            |code, body| code == 200 && body.contains("rdma-streams.io/hca registered"),
        )
        .await;
        assert!(!ready.contains("standby"), "{ready}");
        wait_admin(
            &addr_b,
            "/metrics",
            "the standby gauge back at 0",
            |_, body| {
                body.contains("rdma_dp_standby{resource=\"rdma-streams.io/hca\"} 0")
                    && body.contains("rdma_dp_registered{resource=\"rdma-streams.io/hca\"} 1")
            },
        )
        .await;
        drop(first);
    })
    .await;
}

/// The names of the devices in a CDI spec file.
fn cdi_devices(path: &Path) -> Vec<String> {
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_instance_leaves_the_holders_cdi_specs_alone() {
    within_async(LIMIT, async {
        let h = Harness::new(Harness::two_hcas()).await;
        let cdi_dir = h.dir.path().join("cdi");
        let cdi = cdi_dir.to_string_lossy().into_owned();
        // The holder serves every HCA; the second instance (another config, as in a rollout
        // that changes it) would serve mlx5_0 only, and has a second, unrelated spec to keep.
        let narrow = h.dir.path().join("narrow.yaml");
        std::fs::write(
            &narrow,
            "pools:\n  - resourceName: rdma-streams.io/hca\n    selectors: {rdmaDevices: [mlx5_0]}\n",
        )
        .unwrap();
        let spawn = |extra: &[&str]| {
            Plugin(
                h.plugin_command(BIN)
                    .args(["--cdi", "--cdi-dir", &cdi, "--socket-poll-ms", "200"])
                    .args(extra)
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("spawn plugin"),
            )
        };
        let first = spawn(&[]);
        h.kubelet.wait_registered(RESOURCE, 1, SOON).await.unwrap();
        let spec = cdi_dir.join("rdma-streams-dp_rdma-streams.io_hca.json");
        assert_eq!(cdi_devices(&spec), ["mlx5_0", "mlx5_1"]);

        let addr = format!("127.0.0.1:{}", free_port());
        let narrow_arg = narrow.to_string_lossy().into_owned();
        let _second = spawn(&["--config", &narrow_arg, "--admin-listen", &addr]);
        wait_admin(&addr, "/ready", "the second instance standing by", |code, body| {
            code == 200 && body.contains("standby")
        })
        .await;
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(
            cdi_devices(&spec),
            ["mlx5_0", "mlx5_1"],
            "the standby rewrote the holder's spec: mlx5_1's containers would not start"
        );

        // The holder goes: the new holder writes its own spec.
        sigterm(&first.0);
        h.kubelet.wait_registered(RESOURCE, 2, SOON).await.unwrap();
        wait_admin(&addr, "/ready", "the second instance registered", |code, body| {
            code == 200 && body.contains("rdma-streams.io/hca registered")
        })
        .await;
        assert_eq!(cdi_devices(&spec), ["mlx5_0"]);
        drop(first);
    })
    .await;
}
