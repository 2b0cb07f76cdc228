//! The plugin against a fake kubelet on the real protos over real unix sockets.

mod common;

use std::time::Duration;

use common::{Harness, LIMIT, RESOURCE, SOON, TWO_HCA_SLOTS, all_of};
use rdma_device_plugin::{
    api::v1beta1::{self as pb, device_plugin_client::DevicePluginClient},
    instance_lock::{lock_path, try_lock},
};
use rdma_device_plugin_testkit::fixture::HcaSpec;
use rdma_streams_testkit::within_async;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_registration_full_list_with_numa() {
    within_async(LIMIT, async {
        let (mut h, list) = Harness::listed().await;
        assert!(list.iter().all(|d| d.health == "Healthy"));
        let numa = |id: &str| {
            list.iter()
                .find(|d| d.id == id)
                .unwrap()
                .topology
                .as_ref()
                .unwrap()
                .nodes[0]
                .id
        };
        assert_eq!(numa("mlx5_0-0000"), 0);
        assert_eq!(numa("mlx5_1-0063"), 1);
        let opts = h.kubelet.options(RESOURCE).unwrap();
        assert!(opts.get_preferred_allocation_available && !opts.pre_start_required);
        let endpoint = h.kubelet.endpoint(RESOURCE).unwrap();
        assert_eq!(endpoint.file_name().unwrap(), "rdma-streams.io_hca.sock");
        h.stop_plugin().await;
        assert!(!endpoint.exists(), "socket removed on drain");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_kubelet_restarts_each_reregistered_with_full_list() {
    within_async(Duration::from_secs(120), async {
        let mut h = Harness::registered().await;
        for n in 2..=21 {
            h.kubelet.restart().await.unwrap();
            h.kubelet
                .wait_registered(RESOURCE, n, SOON)
                .await
                .unwrap_or_else(|e| panic!("restart {}: {e}", n - 1));
            let updates = h.kubelet.updates(RESOURCE);
            // The new stream delivers the full list at once.
            h.kubelet
                .wait_for("the full list on the new stream", SOON, |k| {
                    k.updates(RESOURCE) > updates
                        || k.devices(RESOURCE).is_some_and(|d| d.len() == 128)
                })
                .await
                .unwrap();
            let list = h.devices(TWO_HCA_SLOTS).await;
            assert!(
                list.iter().all(|d| d.health == "Healthy"),
                "restart {}",
                n - 1
            );
        }
        assert_eq!(h.kubelet.registrations(RESOURCE), 21);
        h.stop_plugin().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_while_a_device_changes() {
    within_async(LIMIT, async {
        let (mut h, _) = Harness::listed().await;
        // kubelet goes away; while it is gone a port goes down and a new HCA appears.
        h.kubelet.stop().await;
        h.tree
            .set_port_state("mlx5_0", 1, "DOWN", "Disabled")
            .unwrap();
        h.tree
            .add_hca(HcaSpec::connectx_ib("mlx5_2", "0000:5e:00.0").numa(0))
            .unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        h.kubelet.restart().await.unwrap();
        h.registrations(2).await;
        // The first list on the new stream already holds the change (regression of
        // k8s-rdma-shared-dev-plugin #48: capacity stuck after a restart).
        let list = h.devices(192).await;
        assert!(all_of(&list, "mlx5_0", "Unhealthy"));
        assert!(all_of(&list, "mlx5_1", "Healthy"));
        assert!(all_of(&list, "mlx5_2", "Healthy"));
        h.stop_plugin().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_failing_then_succeeding() {
    within_async(LIMIT, async {
        let mut h = Harness::new(Harness::two_hcas()).await;
        h.kubelet.reject_next_registrations(3);
        h.start_plugin(&[]);
        h.registrations(1).await;
        assert_eq!(h.kubelet.rejected_registrations(), 3);
        h.devices(TWO_HCA_SLOTS).await;
        h.stop_plugin().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_absent_at_start_then_appears() {
    within_async(LIMIT, async {
        let mut h = Harness::new(Harness::two_hcas()).await;
        h.kubelet.stop().await;
        std::fs::remove_file(h.kubelet.device_plugins_dir().join("kubelet.sock")).unwrap();
        h.start_plugin(&[]);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(h.kubelet.registrations(RESOURCE), 0);
        h.kubelet.restart().await.unwrap();
        h.registrations(1).await;
        h.stop_plugin().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_socket_deleted_underneath() {
    within_async(LIMIT, async {
        let mut h = Harness::registered().await;
        let sock = h.kubelet.endpoint(RESOURCE).unwrap();
        std::fs::remove_file(&sock).unwrap();
        h.registrations(2).await;
        assert!(sock.exists(), "served again on a fresh socket");
        h.devices(TWO_HCA_SLOTS).await;
        h.stop_plugin().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_instance_lock_is_taken_again_or_yielded() {
    within_async(LIMIT, async {
        let mut h = Harness::registered().await;
        let sock = h.kubelet.endpoint(RESOURCE).unwrap();
        let name = sock.file_name().unwrap().to_str().unwrap();
        let lock = lock_path(sock.parent().unwrap(), name);
        assert!(lock.exists(), "{}", lock.display());

        // Deleted (as a cleanup of the folder might): the plugin takes the lock on a new file
        // and serves on.
        std::fs::remove_file(&lock).unwrap();
        h.registrations(2).await;
        assert!(lock.exists(), "lock file re-created");
        assert!(
            try_lock(&lock).unwrap().is_none(),
            "the plugin holds the new lock"
        );

        // Replaced, and another instance holds the new file first: the plugin stands by and
        // serves again once that one lets go.
        std::fs::remove_file(&lock).unwrap();
        let other = try_lock(&lock).unwrap().expect("the new file is free");
        h.kubelet
            .wait_for("the stream to end", SOON, |k| !k.stream_open(RESOURCE))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(
            h.kubelet.registrations(RESOURCE),
            2,
            "registered while standing by"
        );
        drop(other);
        h.registrations(3).await;
        h.devices(TWO_HCA_SLOTS).await;
        h.stop_plugin().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_per_hca_and_unknown_ids() {
    within_async(LIMIT, async {
        let (mut h, _) = Harness::listed().await;
        let dev_root = h.tree.dev_root();

        let ib = h
            .kubelet
            .allocate(RESOURCE, &["mlx5_0-0005"])
            .await
            .unwrap();
        let paths: Vec<_> = ib
            .devices
            .iter()
            .map(|d| d.container_path.as_str())
            .collect();
        assert_eq!(paths[0], "/dev/infiniband/rdma_cm");
        assert!(paths.iter().any(|p| p.starts_with("/dev/infiniband/issm")));
        assert_eq!(ib.envs["RDMA_STREAMS_DEVICES"], "mlx5_0");
        for d in &ib.devices {
            assert_eq!(d.permissions, "rw");
            assert!(
                std::path::Path::new(&d.host_path).starts_with(&dev_root),
                "{d:?}"
            );
            assert!(std::path::Path::new(&d.host_path).exists(), "{d:?}");
        }

        let eth = h
            .kubelet
            .allocate(RESOURCE, &["mlx5_1-0001"])
            .await
            .unwrap();
        let eth_paths: Vec<_> = eth
            .devices
            .iter()
            .map(|d| d.container_path.clone())
            .collect();
        assert!(
            !eth_paths.iter().any(|p| p.contains("issm")),
            "{eth_paths:?}"
        );
        let ib_own: Vec<_> = paths[1..].iter().map(|s| (*s).to_string()).collect();
        assert!(
            eth_paths.iter().all(|p| !ib_own.contains(p)),
            "no device of mlx5_0 leaks"
        );

        let err = h
            .kubelet
            .allocate(RESOURCE, &["mlx5_7-0000"])
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        h.stop_plugin().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_allocation_over_grpc() {
    within_async(LIMIT, async {
        let mut h = Harness::new(vec![
            HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0").numa(0),
            HcaSpec::connectx_ib("mlx5_1", "0000:5e:00.0").numa(0),
            HcaSpec::connectx_ib("mlx5_2", "0000:af:00.0").numa(1),
        ])
        .await;
        std::fs::write(
            h.config_path(),
            "pools:\n  - resourceName: rdma-streams.io/hca\n    slotsPerHca: 4\n",
        )
        .unwrap();
        h.start_plugin(&[]);
        h.registrations(1).await;
        let list = h.devices(12).await;
        let all: Vec<String> = list.iter().map(|d| d.id.clone()).collect();
        let must = vec!["mlx5_2-0001".to_string()];
        let got = h.kubelet.preferred(RESOURCE, &all, &must, 3).await.unwrap();
        assert_eq!(got[0], "mlx5_2-0001");
        assert!(got.iter().all(|id| id.starts_with("mlx5_2-")), "{got:?}");
        let got = h.kubelet.preferred(RESOURCE, &all, &[], 4).await.unwrap();
        let hca = got[0].split('-').next().unwrap().to_string();
        assert!(
            got.iter().all(|id| id.starts_with(&format!("{hca}-"))),
            "{got:?}"
        );
        h.stop_plugin().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_flaps_both_ways() {
    within_async(LIMIT, async {
        let mut h = Harness::registered().await;
        h.devices_where(|d| all_of(d, "mlx5_0", "Healthy")).await;

        h.tree
            .set_port_state("mlx5_0", 1, "DOWN", "Polling")
            .unwrap();
        let list = h.devices_where(|d| all_of(d, "mlx5_0", "Unhealthy")).await;
        assert_eq!(list.len(), 128, "unhealthy devices stay listed");
        assert!(all_of(&list, "mlx5_1", "Healthy"));

        h.tree
            .set_port_state("mlx5_0", 1, "ACTIVE", "LinkUp")
            .unwrap();
        h.devices_where(|d| all_of(d, "mlx5_0", "Healthy")).await;

        // A char device vanishing makes the HCA unhealthy, never drops it.
        let uverbs = h
            .kubelet
            .allocate(RESOURCE, &["mlx5_1-0000"])
            .await
            .unwrap()
            .devices
            .iter()
            .find(|d| d.container_path.contains("uverbs"))
            .map(|d| d.container_path.rsplit('/').next().unwrap().to_string())
            .unwrap();
        h.tree.remove_char_dev(&uverbs).unwrap();
        let list = h.devices_where(|d| all_of(d, "mlx5_1", "Unhealthy")).await;
        assert_eq!(list.len(), 128);
        let err = h
            .kubelet
            .allocate(RESOURCE, &["mlx5_1-0000"])
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        h.tree.add_char_dev(&uverbs).unwrap();
        h.devices_where(|d| all_of(d, "mlx5_1", "Healthy")).await;

        // Hot removal: the HCA's devices leave the list.
        h.tree.remove_hca("mlx5_1").unwrap();
        h.devices(64).await;
        h.stop_plugin().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_loaded_after_start() {
    within_async(LIMIT, async {
        let mut h = Harness::new(vec![]).await;
        h.start_plugin(&[]);
        h.registrations(1).await;
        let list = h.devices_where(|_| true).await;
        assert!(list.is_empty());
        h.tree
            .add_hca(HcaSpec::connectx_eth("mlx5_0", "0000:3b:00.0").numa(0))
            .unwrap();
        h.devices(64).await;
        h.stop_plugin().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_streams_each_get_every_update() {
    within_async(LIMIT, async {
        let mut h = Harness::registered().await;
        let sock = h.kubelet.endpoint(RESOURCE).unwrap();
        let mut streams = Vec::new();
        for _ in 0..2 {
            let ch = rdma_device_plugin::uds::channel(&sock, SOON, None)
                .await
                .unwrap();
            let s = DevicePluginClient::new(ch)
                .list_and_watch(pb::Empty {})
                .await
                .unwrap()
                .into_inner();
            streams.push(s);
        }
        for s in &mut streams {
            let first = s.message().await.unwrap().unwrap();
            assert_eq!(first.devices.len(), 128, "full list at once");
        }
        h.tree
            .set_port_state("mlx5_1", 1, "DOWN", "Disabled")
            .unwrap();
        for s in &mut streams {
            loop {
                let msg = within_async(SOON, s.message()).await.unwrap().unwrap();
                if all_of(&msg.devices, "mlx5_1", "Unhealthy") {
                    break;
                }
            }
        }
        // The kubelet's own stream saw it too: nobody consumed another stream's update.
        h.devices_where(|d| all_of(d, "mlx5_1", "Unhealthy")).await;
        h.stop_plugin().await;
        // Draining ends the extra streams too.
        for s in &mut streams {
            let end = within_async(Duration::from_secs(10), async {
                loop {
                    match s.message().await {
                        Ok(Some(_)) => continue,
                        other => break other,
                    }
                }
            })
            .await;
            assert!(matches!(end, Ok(None) | Err(_)));
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_full_list_resend() {
    within_async(LIMIT, async {
        let mut h = Harness::started(
            Some("resyncSeconds: 1\npools:\n  - resourceName: rdma-streams.io/hca\n"),
            &[],
        )
        .await;
        let before = h.kubelet.updates(RESOURCE);
        h.kubelet
            .wait_for("two re-sends without changes", SOON, |k| {
                k.updates(RESOURCE) >= before + 2
            })
            .await
            .unwrap();
        h.stop_plugin().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_reload_good_and_bad() {
    within_async(LIMIT, async {
        let mut h = Harness::started(
            Some("pools:\n  - resourceName: rdma-streams.io/hca\n    slotsPerHca: 2\n"),
            &[],
        )
        .await;
        let cfg = h.config_path();
        h.devices(4).await;

        // Good: more slots, and a second pool of InfiniBand HCAs only.
        std::fs::write(
            &cfg,
            "pools:\n  - resourceName: rdma-streams.io/hca\n    slotsPerHca: 3\n  \
             - resourceName: rdma-streams.io/ib\n    slotsPerHca: 1\n    selectors:\n      \
             linkLayers: [InfiniBand]\n",
        )
        .unwrap();
        h.devices(6).await;
        h.kubelet
            .wait_registered("rdma-streams.io/ib", 1, SOON)
            .await
            .unwrap();
        let ib = h
            .kubelet
            .wait_devices("rdma-streams.io/ib", SOON, |d| d.len() == 1)
            .await
            .unwrap();
        assert_eq!(ib[0].id, "mlx5_0-0000");

        // Bad: an unknown field. The last good config stays in force.
        std::fs::write(
            &cfg,
            "pools:\n  - resourceName: rdma-streams.io/hca\n    slotsPerHCA: 9\n",
        )
        .unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(h.kubelet.devices(RESOURCE).unwrap().len(), 6);
        assert_eq!(h.kubelet.devices("rdma-streams.io/ib").unwrap().len(), 1);

        // Good again: the second pool goes away, its socket with it.
        std::fs::write(
            &cfg,
            "pools:\n  - resourceName: rdma-streams.io/hca\n    slotsPerHca: 1\n",
        )
        .unwrap();
        h.devices(2).await;
        let ib_sock = h.kubelet.endpoint("rdma-streams.io/ib").unwrap();
        h.kubelet
            .wait_for("the removed pool's socket to go", SOON, |_| {
                !ib_sock.exists()
            })
            .await
            .unwrap();
        h.stop_plugin().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_config_at_start_is_a_clear_error() {
    within_async(Duration::from_secs(30), async {
        let mut h = Harness::new(Harness::two_hcas()).await;
        std::fs::write(h.config_path(), "pools:\n  - resourceName: hca\n").unwrap();
        h.start_plugin(&[]);
        let err = within_async(SOON, h.plugin.take().unwrap())
            .await
            .unwrap()
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("hca"), "{msg}");
        assert_eq!(h.kubelet.registrations("hca"), 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_watcher_mode() {
    within_async(LIMIT, async {
        let mut h = Harness::new(Harness::two_hcas()).await;
        h.kubelet.fail_next_watcher_notifications(1);
        h.kubelet.start_plugin_watcher();
        h.start_plugin(&["--registration", "plugin-watcher"]);
        // First notification reports failure: the plugin re-creates its socket, the watcher
        // finds it again, and the second attempt succeeds.
        h.registrations(2).await;
        let endpoint = h.kubelet.endpoint(RESOURCE).unwrap();
        assert!(
            endpoint.starts_with(h.kubelet.plugins_registry_dir()),
            "{endpoint:?}"
        );
        h.devices(TWO_HCA_SLOTS).await;
        let resp = h
            .kubelet
            .allocate(RESOURCE, &["mlx5_0-0000"])
            .await
            .unwrap();
        assert_eq!(resp.envs["RDMA_STREAMS_DEVICES"], "mlx5_0");
        // Nothing was put in device-plugins/ in this mode.
        let dp: Vec<_> = std::fs::read_dir(h.kubelet.device_plugins_dir())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!dp.iter().any(|n| n.starts_with("rdma-streams")), "{dp:?}");
        h.stop_plugin().await;
        assert!(!endpoint.exists());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdi_mode_spec_and_names() {
    within_async(LIMIT, async {
        let cdi = tempfile::tempdir().unwrap();
        let cdi_dir = cdi.path().to_path_buf();
        let cdi_arg = cdi_dir.to_string_lossy().into_owned();
        let mut h = Harness::started(None, &["--cdi", "--cdi-dir", &cdi_arg]).await;
        h.devices(TWO_HCA_SLOTS).await;
        let resp = h
            .kubelet
            .allocate(RESOURCE, &["mlx5_1-0002", "mlx5_0-0000"])
            .await
            .unwrap();
        let names: Vec<_> = resp.cdi_devices.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["rdma-streams.io/hca=mlx5_0", "rdma-streams.io/hca=mlx5_1"]
        );
        assert!(resp.devices.is_empty());
        let spec_path = cdi_dir.join("rdma-streams-dp_rdma-streams.io_hca.json");
        let spec: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&spec_path).unwrap()).unwrap();
        assert_eq!(spec["kind"], "rdma-streams.io/hca");
        let spec_names: Vec<_> = spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                format!(
                    "{}={}",
                    spec["kind"].as_str().unwrap(),
                    d["name"].as_str().unwrap()
                )
            })
            .collect();
        for n in &names {
            assert!(
                spec_names.contains(&(*n).to_string()),
                "{n} in {spec_names:?}"
            );
        }
        for d in spec["devices"].as_array().unwrap() {
            for node in d["containerEdits"]["deviceNodes"].as_array().unwrap() {
                assert!(std::path::Path::new(node["hostPath"].as_str().unwrap()).exists());
            }
        }
        h.stop_plugin().await;
    })
    .await;
}

/// Kubelets before 1.26, grpc-java and grpcurl send the socket path as `:authority`; Python
/// grpcio >= 1.57 (grpc-core) sends it percent-encoded. The plugin answers them all, on one
/// connection, including fields the client indexed in its HPACK dynamic table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_authority_a_unix_socket_client_sends() {
    use prost::Message;
    use rdma_streams_testkit::h2_raw::{Conn, Field, Outcome, grpc_request};

    within_async(LIMIT, async {
        let mut h = Harness::registered().await;
        let sock = h.kubelet.endpoint(RESOURCE).unwrap();
        let method = "/v1beta1.DevicePlugin/GetDevicePluginOptions";
        let options = |outcome: Outcome, what: &str| match outcome {
            Outcome::Reply(r) => {
                assert_eq!(r.grpc_status(), Some("0"), "{what}: {r:?}");
                pb::DevicePluginOptions::decode(r.message().unwrap()).unwrap()
            }
            other => panic!("{what}: {other:?}"),
        };
        let kubelet_sock = "/var/lib/kubelet/device-plugins/kubelet.sock";
        let grpcio = "%2Fvar%2Flib%2Fkubelet%2Fdevice-plugins%2Fkubelet.sock";
        for authority in ["localhost", kubelet_sock, grpcio, ""] {
            let mut conn = Conn::connect(&sock).await.unwrap();
            let reply = conn.unary(1, &grpc_request(authority, method), &[]).await;
            let opts = options(reply.unwrap(), authority);
            assert!(opts.get_preferred_allocation_available, "{authority:?}");
        }
        // One connection: a valid authority first, then the path, each entered in the
        // dynamic table, then both referred to by index (62 is the newest entry).
        let mut conn = Conn::connect(&sock).await.unwrap();
        let mut fields = grpc_request("", method);
        fields[3] = Field::Indexing(":authority", "localhost");
        fields.push(Field::Indexing("x-client", "a"));
        options(
            conn.unary(1, &fields, &[]).await.unwrap(),
            "localhost, indexed",
        );
        fields[3] = Field::Indexing(":authority", kubelet_sock);
        fields[6] = Field::Indexed(63); // x-client: a
        options(conn.unary(3, &fields, &[]).await.unwrap(), "path, indexed");
        fields[3] = Field::Indexed(62); // the path
        options(conn.unary(5, &fields, &[]).await.unwrap(), "path by index");
        fields[3] = Field::Indexed(64); // localhost
        options(
            conn.unary(7, &fields, &[]).await.unwrap(),
            "localhost by index",
        );
        drop(conn);
        h.stop_plugin().await;
    })
    .await;
}
