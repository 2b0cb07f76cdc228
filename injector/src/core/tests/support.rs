//! Shared test helpers: profiles, fixtures, namespaces, planning shortcuts.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::core::{Decision, NamespaceFacts, Plan, PlanInput, plan};
use crate::profile::Config;

/// The test profiles.
pub(super) const PROFILES_YAML: &str = include_str!("../../../tests/data/config/profiles.yaml");

pub(super) fn config() -> Config {
    crate::profile::parse(PROFILES_YAML, "profiles.yaml").expect("test profiles are valid")
}

/// A pod fixture file.
pub(super) struct Fixture {
    pub name: &'static str,
    pub json: &'static str,
}

macro_rules! fixtures {
    ($($name:literal),* $(,)?) => {
        &[$(Fixture {
            name: $name,
            json: include_str!(concat!("../../../tests/data/pods/", $name, ".json")),
        }),*]
    };
}

/// Every file in `tests/data/pods`.
pub(super) const FIXTURES: &[Fixture] = fixtures!(
    "annotation-opt-in",
    "bare",
    "controller-made",
    "future-field",
    "istio-proxy",
    "ld-preload-literal",
    "ld-preload-valuefrom",
    "multi-container-default",
    "multi-container-targets",
    "multus-csv",
    "multus-json",
    "not-opted-in",
    "opted-out",
    "partly-injected",
    "privileged",
    "resource-elsewhere",
    "virt-launcher",
);

pub(super) fn fixture(name: &str) -> Value {
    let fixture = FIXTURES
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no fixture {name}"));
    serde_json::from_str(fixture.json).unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

pub(super) fn ns(name: &str, labels: &[(&str, &str)]) -> NamespaceFacts {
    NamespaceFacts {
        name: name.to_owned(),
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
    }
}

pub(super) fn baseline(name: &str) -> NamespaceFacts {
    ns(name, &[("pod-security.kubernetes.io/enforce", "baseline")])
}

pub(super) fn restricted(name: &str) -> NamespaceFacts {
    ns(
        name,
        &[("pod-security.kubernetes.io/enforce", "restricted")],
    )
}

pub(super) fn run(pod: &Value, namespace: &NamespaceFacts, config: &Config) -> Decision {
    plan(&PlanInput {
        pod,
        namespace,
        config,
    })
    .expect("plan never fails with an internal error")
}

pub(super) fn expect_plan(decision: Decision) -> Plan {
    match decision {
        Decision::Patch(plan) => plan,
        other => panic!("expected a patch, got {other:?}"),
    }
}

/// Sets (or removes, with `None`) an annotation on a pod value.
pub(super) fn set_annotation(pod: &mut Value, key: &str, value: Option<&str>) {
    set_meta(pod, "annotations", key, value);
}

/// Sets (or removes) a label on a pod value.
pub(super) fn set_label(pod: &mut Value, key: &str, value: Option<&str>) {
    set_meta(pod, "labels", key, value);
}

fn set_meta(pod: &mut Value, section: &str, key: &str, value: Option<&str>) {
    let metadata = pod
        .as_object_mut()
        .expect("pod object")
        .entry("metadata")
        .or_insert_with(|| Value::Object(Default::default()));
    let map = metadata
        .as_object_mut()
        .expect("metadata object")
        .entry(section)
        .or_insert_with(|| Value::Object(Default::default()))
        .as_object_mut()
        .expect("map");
    match value {
        Some(value) => {
            map.insert(key.to_owned(), Value::String(value.to_owned()));
        }
        None => {
            map.remove(key);
        }
    }
}

/// `spec.containers[*].name`.
pub(super) fn container_names(pod: &Value, list: &str) -> Vec<String> {
    pod["spec"][list]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|c| c["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// A container by name.
pub(super) fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["spec"]["containers"]
        .as_array()
        .and_then(|items| items.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The value of the last env entry `name` of a container, if literal.
pub(super) fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["env"]
        .as_array()?
        .iter()
        .rev()
        .find(|e| e["name"] == name)
}

/// The op kinds and paths of a patch, for compact assertions.
pub(super) fn op_paths(plan: &Plan) -> Vec<String> {
    plan.patch
        .iter()
        .map(|op| {
            let kind = match op {
                json_patch::PatchOperation::Add(_) => "add",
                json_patch::PatchOperation::Remove(_) => "remove",
                json_patch::PatchOperation::Replace(_) => "replace",
                json_patch::PatchOperation::Move(_) => "move",
                json_patch::PatchOperation::Copy(_) => "copy",
                json_patch::PatchOperation::Test(_) => "test",
            };
            format!("{kind} {}", op.path())
        })
        .collect()
}
