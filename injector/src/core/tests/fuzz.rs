//! Hostile pods straight into the pure core: every pod fixture with any value replaced by an
//! arbitrary one (wrong types, integer limits, long and unicode strings, nesting as deep as
//! the server's JSON parser lets through), our annotations (profile, target containers, status,
//! Multus networks, default container) holding mutated values, and namespaces with hostile
//! labels (opt-in, Pod Security level and version).
//!
//! Whatever the pod: the plan never fails internally (a `CoreError` is a bug), a patch applies
//! to the pod as received, and planning the patched pod again changes nothing (a second
//! webhook invocation would otherwise inject twice).

use std::time::Duration;

use proptest::prelude::*;
use proptest::sample::select;
use rdma_streams_testkit::fuzz;
use serde_json::{Value, json};

use super::support::{FIXTURES, config, ns};
use crate::core::{Decision, NamespaceFacts, PlanInput, SkipReason, apply, plan};

const LIMIT: Duration = Duration::from_secs(60);

fn fixtures() -> Vec<Value> {
    FIXTURES
        .iter()
        .map(|f| serde_json::from_str(f.json).expect("fixture"))
        .collect()
}

/// Plans `pod` in `namespace` and checks the properties in the module docs.
fn check(pod: &Value, namespace: &NamespaceFacts) -> Result<(), TestCaseError> {
    let config = config();
    let input = |pod| PlanInput {
        pod,
        namespace,
        config: &config,
    };
    let decision = match plan(&input(pod)) {
        Ok(decision) => decision,
        Err(e) => {
            return Err(TestCaseError::fail(format!(
                "internal error {e:?} for {pod}"
            )));
        }
    };
    if let Decision::Patch(planned) = decision {
        let patched = match apply(pod, &planned.patch) {
            Ok(patched) => patched,
            Err(e) => return Err(TestCaseError::fail(format!("{e:?}: {pod}"))),
        };
        let again = plan(&input(&patched));
        prop_assert!(
            matches!(
                again,
                Ok(Decision::Skip {
                    reason: SkipReason::AlreadyInjected,
                    ..
                })
            ),
            "planned again: {:?}\npod {}\npatched {}",
            again,
            pod,
            patched
        );
    }
    Ok(())
}

fn plain_namespace() -> NamespaceFacts {
    ns("team-a", &[])
}

#[test]
fn pods_with_a_hostile_value_anywhere_are_planned_without_internal_errors() {
    fuzz::run(
        "core hostile values",
        1_500,
        LIMIT,
        || select(fixtures()).prop_flat_map(fuzz::transplanted),
        |pod| check(&pod, &plain_namespace()),
    );
}

/// Valid values of the annotations the core reads, to be mutated.
fn annotation_seeds() -> Vec<(&'static str, Vec<String>)> {
    // A real status annotation: what an injection of the first opted-in fixture writes.
    let pod = fixtures()
        .into_iter()
        .find(|p| p["metadata"]["labels"]["rdma-streams.io/inject"] == "true")
        .expect("an opted-in fixture");
    let config = config();
    let namespace = plain_namespace();
    let Ok(Decision::Patch(planned)) = plan(&PlanInput {
        pod: &pod,
        namespace: &namespace,
        config: &config,
    }) else {
        panic!("the fixture is injected");
    };
    let status = planned.status.to_annotation().expect("status");
    vec![
        ("rdma-streams.io/status", vec![status]),
        (
            "rdma-streams.io/containers",
            vec!["app".into(), "app, worker,sidecar".into()],
        ),
        (
            "rdma-streams.io/profile",
            vec!["default".into(), " net ".into(), "hostpath".into()],
        ),
        (
            "k8s.v1.cni.cncf.io/networks",
            vec![
                "macvlan, infra/rdma-net@net1".into(),
                r#"[{"name":"rdma-net","namespace":"infra","interface":"net1","ips":["10.0.0.2/24"]}]"#
                    .into(),
            ],
        ),
        (
            "kubectl.kubernetes.io/default-container",
            vec!["app".into()],
        ),
        ("rdma-streams.io/inject", vec!["true".into(), "false".into()]),
    ]
}

#[test]
fn hostile_annotation_values_are_planned_without_internal_errors() {
    let cases: Vec<(&'static str, Vec<String>)> = annotation_seeds();
    fuzz::run(
        "core hostile annotations",
        1_500,
        LIMIT,
        move || {
            let value = select(cases).prop_flat_map(|(key, seeds)| {
                let mutated = fuzz::mutated_text(seeds, fuzz::TOKENS);
                (Just(key), prop_oneof![mutated, fuzz::hostile_token()])
            });
            (select(fixtures()), value, any::<bool>())
        },
        |(mut pod, (key, value), as_label)| {
            let section = if as_label { "labels" } else { "annotations" };
            let metadata = pod["metadata"].as_object_mut().expect("metadata");
            let map = metadata.entry(section).or_insert_with(|| json!({}));
            if let Some(map) = map.as_object_mut() {
                map.insert(key.to_owned(), Value::String(value));
            }
            check(&pod, &plain_namespace())
        },
    );
}

#[test]
fn namespaces_with_hostile_labels_are_planned_without_internal_errors() {
    let keys = vec![
        "rdma-streams.io/inject",
        "pod-security.kubernetes.io/enforce",
        "pod-security.kubernetes.io/enforce-version",
    ];
    let value = prop_oneof![
        select(vec![
            "enabled",
            "privileged",
            "baseline",
            "restricted",
            "latest",
            "v1.33",
            "v1.",
            "v1.99999999999999999999",
            "v0.0",
        ])
        .prop_map(str::to_owned),
        fuzz::hostile_token(),
    ];
    fuzz::run(
        "core hostile namespaces",
        1_000,
        LIMIT,
        move || {
            (
                select(fixtures()),
                proptest::collection::vec((select(keys), value), 0..4),
            )
        },
        |(pod, labels)| {
            let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            check(&pod, &ns("team-a", &labels))
        },
    );
}
