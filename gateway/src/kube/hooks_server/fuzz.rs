//! Fuzzing of what a node hook call carries: the gRPC request message
//! (`ExecuteNodeHookRequest`, protobuf) over arbitrary bytes, and its `vmi` field (the
//! VirtualMachineInstance as JSON) over arbitrary bytes, over the migrating VMI virt-handler
//! sends with bytes mutated, and with any value replaced by an arbitrary JSON value or a raw
//! hostile token.
//!
//! Whatever the call: the server answers (success, a message, a bounded metric label), a
//! request that decodes re-encodes to the same request, and a migration a hook starts is
//! well-formed (ports sorted, distinct, not 0) and the very `Started` the VMI watch builds for
//! the same VMI (so the core de-duplicates the two triggers). A VMI nested ten thousand deep
//! and one of almost 4 MiB (tonic's default message limit) are answered in bounded time.

use proptest::prelude::*;
use proptest::sample::select;
use prost::Message;
use rdma_streams_testkit::fuzz;
use serde_json::json;

use super::*;
use crate::{
    events::Role,
    kube::{
        hooks::{NodeHookCall, event_for_hook},
        hooks_api::{
            HOOK_POINTS, PRE_MIGRATION_SOURCE, PRE_MIGRATION_TARGET, v1alpha1::NodeContext,
        },
        vmi::{VirtualMachineInstance, VmiView, events_for},
    },
    testing::migrating_vmi,
};

const LIMIT: Duration = Duration::from_secs(60);
const BOUND: Duration = Duration::from_secs(20);

fn runtime() -> &'static tokio::runtime::Runtime {
    rdma_streams_testkit::shared_runtime()
}

/// Answers `request` with a server on `node` whose core is gone (a call that would start a
/// migration is answered at once, as when the gateway stops).
fn answer(node: &str, request: ExecuteNodeHookRequest) -> ExecuteNodeHookResponse {
    let (tx, rx) = mpsc::channel(1);
    drop(rx);
    let server = NodeHookServer::new(node.to_owned(), tx, Metrics::default());
    runtime()
        .block_on(server.execute_node_hook(Request::new(request)))
        .expect("the server always answers")
        .into_inner()
}

/// The properties in the module docs, for one call.
fn check(hook_point: &str, vmi: &[u8], node: &str) -> Result<(), TestCaseError> {
    let label = hook_label(hook_point);
    prop_assert!(label == "other" || HOOK_POINTS.contains(&label));

    let call = NodeHookCall {
        hook_point,
        vmi,
        node_name: node,
    };
    let started = event_for_hook(call);
    if ![PRE_MIGRATION_SOURCE, PRE_MIGRATION_TARGET].contains(&hook_point) {
        prop_assert!(matches!(started, Ok(None)), "{:?}", started);
    }
    if let Ok(Some(start)) = &started {
        let m = &start.migration;
        let want = if hook_point == PRE_MIGRATION_SOURCE {
            Role::Source
        } else {
            Role::Target
        };
        prop_assert_eq!(m.role, want);
        prop_assert!(
            !m.ports.is_empty() && !m.ports.contains(&0),
            "{:?}",
            m.ports
        );
        prop_assert!(m.ports.windows(2).all(|w| w[0] < w[1]), "{:?}", m.ports);
        // The VMI watch builds the same Started for the same VMI.
        let parsed: VirtualMachineInstance = serde_json::from_slice(vmi).expect("it parsed");
        let watched = events_for(node, None, &VmiView::of(&parsed));
        prop_assert!(
            watched.contains(&MigrationEvent::Started(m.clone())),
            "hook {:?}, watch {:?}",
            m,
            watched
        );
    }

    let request = ExecuteNodeHookRequest {
        hook_point: hook_point.to_owned(),
        vmi: vmi.to_vec(),
        node_context: Some(NodeContext {
            node_name: node.to_owned(),
        }),
    };
    let response = answer(node, request);
    prop_assert!(response.success);
    prop_assert!(response.message.starts_with("rdma-migration-gateway: "));
    Ok(())
}

/// The VMI virt-handler sends at PreMigration, with a published target (IPv4, bracketed IPv6)
/// or none yet, opted in or not.
fn vmis() -> Vec<serde_json::Value> {
    let mut v6 = migrating_vmi(true, Some("[fd00::7]"));
    v6["status"]["migrationState"]["targetDirectMigrationNodePorts"] =
        json!({"65535": 0, "1": 49152, " 40000 ": 49153});
    vec![
        migrating_vmi(true, Some("10.244.2.7")),
        migrating_vmi(true, None),
        migrating_vmi(false, Some("10.244.2.7")),
        v6,
    ]
}

fn hook_point() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(vec![PRE_MIGRATION_SOURCE, PRE_MIGRATION_TARGET]).prop_map(str::to_owned),
        1 => select(HOOK_POINTS.to_vec()).prop_map(str::to_owned),
        1 => ".{0,20}",
    ]
}

fn node() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(vec!["node-a", "node-b"]).prop_map(str::to_owned),
        1 => Just(String::new()),
        1 => ".{0,12}",
    ]
}

#[test]
fn requests_of_arbitrary_bytes_decode_or_fail_and_decoded_ones_are_answered() {
    // What tonic hands the service: the protobuf message, from any bytes (also a valid call
    // with bytes mutated).
    let valid: Vec<Vec<u8>> = vmis()
        .iter()
        .map(|vmi| {
            ExecuteNodeHookRequest {
                hook_point: PRE_MIGRATION_SOURCE.into(),
                vmi: serde_json::to_vec(vmi).unwrap(),
                node_context: Some(NodeContext {
                    node_name: "node-a".into(),
                }),
            }
            .encode_to_vec()
        })
        .collect();
    fuzz::run(
        "node hook request bytes",
        1_000,
        LIMIT,
        move || {
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..256),
                fuzz::mutated(
                    valid,
                    &["\u{8}", "\u{12}", "\u{1a}", "\u{ff}\u{ff}\u{ff}\u{ff}\u{f}"]
                ),
            ]
        },
        |bytes| {
            let Ok(request) = ExecuteNodeHookRequest::decode(bytes.as_slice()) else {
                return Ok(());
            };
            let again = ExecuteNodeHookRequest::decode(request.encode_to_vec().as_slice());
            prop_assert_eq!(again.as_ref(), Ok(&request));
            let node = request
                .node_context
                .as_ref()
                .map_or(String::new(), |c| c.node_name.clone());
            check(&request.hook_point, &request.vmi, &node)
        },
    );
}

#[test]
fn vmis_of_arbitrary_bytes_are_answered() {
    fuzz::run(
        "node hook vmi bytes",
        1_000,
        LIMIT,
        || {
            (
                hook_point(),
                proptest::collection::vec(any::<u8>(), 0..256),
                node(),
            )
        },
        |(hook, vmi, node)| check(&hook, &vmi, &node),
    );
}

#[test]
fn mutated_vmis_are_answered() {
    let seeds: Vec<Vec<u8>> = vmis()
        .iter()
        .map(|v| serde_json::to_vec_pretty(v).unwrap())
        .collect();
    fuzz::run(
        "node hook mutated vmis",
        1_000,
        LIMIT,
        move || (hook_point(), fuzz::mutated(seeds, fuzz::TOKENS), node()),
        |(hook, vmi, node)| check(&hook, &vmi, &node),
    );
}

#[test]
fn vmis_with_a_hostile_value_anywhere_are_answered() {
    fuzz::run(
        "node hook hostile values",
        1_000,
        LIMIT,
        || {
            let vmi = prop_oneof![
                select(vmis())
                    .prop_flat_map(fuzz::transplanted)
                    .prop_map(|v| serde_json::to_vec(&v).unwrap()),
                select(vmis())
                    .prop_flat_map(fuzz::replaced_text)
                    .prop_map(String::into_bytes),
            ];
            (hook_point(), vmi, node())
        },
        |(hook, vmi, node)| check(&hook, &vmi, &node),
    );
}

#[test]
fn hostile_target_ports_and_addresses_never_start_a_malformed_migration() {
    let port_key = prop_oneof![
        any::<u16>().prop_map(|p| p.to_string()),
        any::<i64>().prop_map(|p| p.to_string()),
        select(fuzz::TOKENS.to_vec()).prop_map(str::to_owned),
        ".{0,8}",
    ];
    let address = prop_oneof![
        any::<std::net::IpAddr>().prop_map(|ip| ip.to_string()),
        any::<std::net::Ipv6Addr>().prop_map(|ip| format!("[{ip}]")),
        select(fuzz::TOKENS.to_vec()).prop_map(str::to_owned),
        ".{0,20}",
    ];
    fuzz::run(
        "node hook target ports and addresses",
        1_000,
        LIMIT,
        move || {
            (
                proptest::collection::btree_map(port_key, fuzz::hostile_json(), 0..6),
                address,
                select(vec![PRE_MIGRATION_SOURCE, PRE_MIGRATION_TARGET]),
            )
        },
        |(ports, address, hook)| {
            let mut vmi = migrating_vmi(true, Some(&address));
            vmi["status"]["migrationState"]["targetDirectMigrationNodePorts"] = json!(ports);
            let node = if hook == PRE_MIGRATION_SOURCE {
                "node-a"
            } else {
                "node-b"
            };
            check(hook, &serde_json::to_vec(&vmi).unwrap(), node)
        },
    );
}

#[test]
fn a_vmi_nested_ten_thousand_deep_or_of_almost_four_mebibytes_is_answered_in_time() {
    let deep = 10_000;
    let mut huge = migrating_vmi(true, Some("10.244.2.7"));
    for n in 0..30_000 {
        huge["metadata"]["annotations"][format!("a{n}")] = json!("x".repeat(120));
    }
    let huge = serde_json::to_vec(&huge).unwrap();
    // Just under tonic's default limit of a decoded message (4 MiB).
    assert!((3 << 20..4 << 20).contains(&huge.len()), "{}", huge.len());
    let cases = [
        (
            "node hook vmi nested 10000 deep".to_owned(),
            fuzz::nested_text(deep, false).into_bytes(),
            false,
        ),
        (
            "node hook vmi with a status nested 10000 deep".to_owned(),
            format!(
                r#"{{"metadata":{{"uid":"u"}},"status":{{"migrationState":{}}}}}"#,
                fuzz::nested_text(deep, true)
            )
            .into_bytes(),
            false,
        ),
        (format!("node hook vmi of {} bytes", huge.len()), huge, true),
    ];
    for (what, vmi, starts) in cases {
        let (started, _) = fuzz::timed(&what, BOUND, move || {
            let call = NodeHookCall {
                hook_point: PRE_MIGRATION_SOURCE,
                vmi: &vmi,
                node_name: "node-a",
            };
            let started = event_for_hook(call).map(|s| s.is_some());
            let response = answer(
                "node-a",
                ExecuteNodeHookRequest {
                    hook_point: PRE_MIGRATION_SOURCE.into(),
                    vmi,
                    node_context: None,
                },
            );
            assert!(response.success);
            started.map_err(|e| e.to_string())
        });
        // A status of an unexpected shape is read as no migration, as the watch does.
        assert_eq!(started.unwrap_or(false), starts, "{what}");
    }
}
