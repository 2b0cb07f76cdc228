//! Idempotency: planning an injected pod again changes nothing, also after another webhook
//! touched it in between (`reinvocationPolicy: IfNeeded`), and after the status annotation was
//! lost or went stale, the plan re-adds nothing that is already there.

use serde_json::{Value, json};

use super::support::{op_paths, run, set_annotation};
use crate::core::{Decision, NamespaceFacts, SkipReason, names};
use crate::profile::Config;

fn assert_already_injected(decision: &Decision, what: &str) {
    assert!(
        matches!(
            decision,
            Decision::Skip {
                reason: SkipReason::AlreadyInjected,
                ..
            }
        ),
        "{what}: expected Skip(AlreadyInjected), got {decision:?}"
    );
}

/// Every op only touches the status annotation (and a guard on it).
fn assert_status_only(decision: Decision, what: &str) {
    let plan = super::support::expect_plan(decision);
    let status = "/metadata/annotations/rdma-streams.io~1status";
    for path in op_paths(&plan) {
        assert!(
            path.ends_with(status),
            "{what}: re-plan must only rewrite the status, got {path}"
        );
    }
}

fn push_container(pod: &mut Value, list: &str, container: Value, front: bool) {
    let spec = pod["spec"].as_object_mut().expect("spec");
    let items = spec
        .entry(list)
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .expect("list");
    if front {
        items.insert(0, container);
    } else {
        items.push(container);
    }
}

/// Runs every reinvocation scenario on an injected pod.
pub(super) fn check(injected: &Value, namespace: &NamespaceFacts, config: &Config) {
    assert_already_injected(&run(injected, namespace, config), "plan(apply(plan(p)))");

    // Another webhook appends a sidecar and an annotation, then we are invoked again.
    let mut appended = injected.clone();
    push_container(
        &mut appended,
        "containers",
        json!({"name": "other-sidecar", "image": "x/other:1"}),
        false,
    );
    set_annotation(&mut appended, "other.example/injected", Some("yes"));
    assert_already_injected(
        &run(&appended, namespace, config),
        "after a container was appended",
    );

    // Another webhook puts a generic container first: "the first container" must not move.
    let mut prepended = injected.clone();
    push_container(
        &mut prepended,
        "containers",
        json!({"name": "zz-front", "image": "x/front:1"}),
        true,
    );
    assert_already_injected(
        &run(&prepended, namespace, config),
        "after a container was prepended",
    );

    // Istio injects after us.
    let mut istio = injected.clone();
    push_container(
        &mut istio,
        "containers",
        json!({"name": "istio-proxy", "image": "istio/proxyv2:1"}),
        true,
    );
    push_container(
        &mut istio,
        "initContainers",
        json!({"name": "istio-init", "image": "istio/proxyv2:1"}),
        false,
    );
    assert_already_injected(&run(&istio, namespace, config), "after istio injected");

    // The status annotation was lost: everything else is there, so only the status is written.
    let mut lost = injected.clone();
    set_annotation(&mut lost, names::STATUS_ANNOTATION, None);
    assert_status_only(run(&lost, namespace, config), "status removed");

    // Same, after a sidecar was appended.
    let mut lost_appended = appended.clone();
    set_annotation(&mut lost_appended, names::STATUS_ANNOTATION, None);
    assert_status_only(
        run(&lost_appended, namespace, config),
        "status removed, sidecar appended",
    );

    // A stale status (older injector or profile): the overwrite is guarded by a test.
    let mut stale = injected.clone();
    let mut status: Value = serde_json::from_str(
        injected["metadata"]["annotations"][names::STATUS_ANNOTATION]
            .as_str()
            .expect("status"),
    )
    .expect("status JSON");
    status["hash"] = json!("0000000000000000");
    set_annotation(
        &mut stale,
        names::STATUS_ANNOTATION,
        Some(&status.to_string()),
    );
    let decision = run(&stale, namespace, config);
    let plan = super::support::expect_plan(decision.clone());
    assert!(
        op_paths(&plan)
            .first()
            .is_some_and(|p| p.starts_with("test ") && p.ends_with("rdma-streams.io~1status")),
        "stale status is tested before it is overwritten: {:?}",
        op_paths(&plan)
    );
    assert_status_only(decision, "stale status");
}
