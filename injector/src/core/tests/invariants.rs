//! What must hold after applying any plan.
//!
//! - the patch uses only `add`, `test` and `test`-guarded `replace` (LD_PRELOAD value and the
//!   Multus annotation only), with escaped pointers;
//! - the result deserialises as a k8s-openapi `Pod`;
//! - nothing changed outside the intended paths: the result is diffed against the input and
//!   every difference must be one we mean (an added shim volume, an added env entry of ours, the
//!   LD_PRELOAD literal extended by exactly the shim, ...). Everything else, unknown future
//!   fields included, must be identical;
//! - semantic rules the API server enforces and schemas cannot express: unique names, mounts of
//!   existing volumes, unique mount paths, extended resources with requests == limits;
//! - one shim volume, one mount per target, LD_PRELOAD holding the shim once, IPC_LOCK at most
//!   once (and present where expected), the status annotation matching the plan.

use std::collections::{BTreeMap, BTreeSet};

use json_patch::PatchOperation;
use serde_json::Value;

use crate::core::env::preload_entries;
use crate::core::multus;
use crate::core::names;
use crate::core::{InjectionStatus, Plan, apply};
use crate::profile::{Config, ShimDelivery};

/// A difference between input and output.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Change {
    Added(Vec<String>),
    Changed(Vec<String>),
    Removed(Vec<String>),
}

fn diff(before: &Value, after: &Value, path: &mut Vec<String>, out: &mut Vec<Change>) {
    match (before, after) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                path.push(key.clone());
                match b.get(key) {
                    Some(other) => diff(value, other, path, out),
                    None => out.push(Change::Removed(path.clone())),
                }
                path.pop();
            }
            for key in b.keys().filter(|k| !a.contains_key(*k)) {
                path.push(key.clone());
                out.push(Change::Added(path.clone()));
                path.pop();
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            if b.len() < a.len() {
                out.push(Change::Removed(path.clone()));
                return;
            }
            for (index, (x, y)) in a.iter().zip(b).enumerate() {
                path.push(index.to_string());
                diff(x, y, path, out);
                path.pop();
            }
            for index in a.len()..b.len() {
                path.push(index.to_string());
                out.push(Change::Added(path.clone()));
                path.pop();
            }
        }
        (Value::Null, b) if !b.is_null() => out.push(Change::Added(path.clone())),
        (a, b) if a != b => out.push(Change::Changed(path.clone())),
        _ => {}
    }
}

fn at<'a>(value: &'a Value, path: &[String]) -> &'a Value {
    path.iter().fold(value, |v, token| match v {
        Value::Array(items) => token
            .parse::<usize>()
            .ok()
            .and_then(|i| items.get(i))
            .unwrap_or(&Value::Null),
        _ => v.get(token).unwrap_or(&Value::Null),
    })
}

/// Applies the plan to `original`, checks every invariant, returns the patched pod.
pub(super) fn check(original: &Value, plan: &Plan, config: &Config) -> Value {
    check_ops(plan);
    let result =
        apply(original, &plan.patch).expect("the patch applies to the pod it was planned on");
    let typed: Result<k8s_openapi::api::core::v1::Pod, _> = serde_json::from_value(result.clone());
    assert!(
        typed.is_ok(),
        "result is not a Pod: {:?}\n{result:#}",
        typed.err()
    );

    let status = result["metadata"]["annotations"][names::STATUS_ANNOTATION]
        .as_str()
        .and_then(InjectionStatus::parse)
        .expect("status annotation present and readable");
    assert_eq!(status, plan.status, "status annotation matches the plan");

    let profile = config
        .profile(&plan.status.profile)
        .expect("status names a configured profile");
    let migration = result["metadata"]["labels"][names::KUBEVIRT_LABEL] == names::VIRT_LAUNCHER;
    let targets: Vec<usize> = plan
        .status
        .containers
        .iter()
        .map(|name| {
            container_names(&result)
                .iter()
                .position(|n| n == name)
                .unwrap_or_else(|| panic!("target {name} is a container"))
        })
        .collect();
    assert!(!targets.is_empty(), "at least one target");
    let ctx = Ctx {
        original,
        result: &result,
        plan,
        resource: &profile.resource.name,
        library: profile.shim.library_path(),
        env_names: profile.env.keys().cloned().collect(),
        migration,
        targets: &targets,
    };

    check_diff(&ctx);
    check_semantics(original, &result);
    if migration {
        check_migration(&ctx);
    } else {
        let expect_ipc = profile.ipc_lock && !plan.audit.contains_key("pod-security");
        check_app(&ctx, expect_ipc);
    }
    check_resource(&ctx);
    result
}

struct Ctx<'a> {
    original: &'a Value,
    result: &'a Value,
    plan: &'a Plan,
    resource: &'a str,
    library: String,
    env_names: BTreeSet<String>,
    migration: bool,
    targets: &'a [usize],
}

fn container_names(pod: &Value) -> Vec<String> {
    super::support::container_names(pod, "containers")
}

fn check_ops(plan: &Plan) {
    let ops = &plan.patch.0;
    for (i, op) in ops.iter().enumerate() {
        let path = op.path().as_str();
        assert!(
            !path.contains("rdma-streams.io/")
                && !path.contains("cncf.io/")
                && !path.contains("example.com/"),
            "pointer {path} is not escaped"
        );
        match op {
            PatchOperation::Add(_) => {}
            PatchOperation::Test(_) => {
                let next = ops.get(i + 1).expect("a test guards a following op");
                assert_eq!(
                    next.path(),
                    op.path(),
                    "a test guards the op on its own path"
                );
                assert!(matches!(
                    next,
                    PatchOperation::Replace(_) | PatchOperation::Add(_)
                ));
            }
            PatchOperation::Replace(_) => {
                let guarded =
                    i > 0 && matches!(&ops[i - 1], PatchOperation::Test(t) if t.path == *op.path());
                assert!(guarded, "replace at {path} is not guarded by a test");
                let tokens: Vec<String> = op
                    .path()
                    .tokens()
                    .map(|t| t.decoded().into_owned())
                    .collect();
                let ld_preload = tokens.len() == 6
                    && tokens[0] == "spec"
                    && tokens[1] == "containers"
                    && tokens[3] == "env"
                    && tokens[5] == "value";
                let multus = path == "/metadata/annotations/k8s.v1.cni.cncf.io~1networks";
                assert!(
                    ld_preload || multus,
                    "replace only of LD_PRELOAD or Multus, not {path}"
                );
            }
            other => panic!("only add, test and replace are allowed, got {other:?}"),
        }
    }
}

fn check_diff(ctx: &Ctx<'_>) {
    let mut changes = Vec::new();
    diff(ctx.original, ctx.result, &mut Vec::new(), &mut changes);
    for change in &changes {
        let (path, changed) = match change {
            Change::Removed(path) => panic!("removed {path:?}: nothing may be removed"),
            Change::Added(path) => (path, false),
            Change::Changed(path) => (path, true),
        };
        assert!(
            allowed(ctx, path, changed),
            "{change:?} is outside the intended paths\nbefore: {:#}\nafter: {:#}",
            at(ctx.original, path),
            at(ctx.result, path)
        );
    }
}

fn allowed(ctx: &Ctx<'_>, path: &[String], changed: bool) -> bool {
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    let added = !changed;
    let new = at(ctx.result, path);
    let app = !ctx.migration;
    match p.as_slice() {
        ["metadata"] | ["metadata", "annotations"] => added,
        ["metadata", "annotations", key] => match *key {
            names::STATUS_ANNOTATION => true,
            names::MIGRATION => added && ctx.migration && *new == names::MIGRATION_RDMA,
            names::MULTUS_NETWORKS => app && multus_extended(ctx, path),
            _ => false,
        },
        ["spec", "volumes"] | ["spec", "initContainers"] => added && app,
        ["spec", "volumes", _] => added && app && new["name"] == names::SHIM_VOLUME,
        ["spec", "initContainers", _] => added && app && new["name"] == names::SHIM_INIT_CONTAINER,
        ["spec", "containers", index, rest @ ..] => {
            let Ok(index) = index.parse::<usize>() else {
                return false;
            };
            let Some(position) = ctx.targets.iter().position(|&t| t == index) else {
                return false;
            };
            let first = position == 0;
            match rest {
                ["resources"] | ["resources", "requests" | "limits"] => added && first,
                ["resources", "requests" | "limits", name] => {
                    added && first && *name == ctx.resource
                }
                _ if ctx.migration => false,
                ["env"] | ["volumeMounts"] => added,
                ["env", _] => {
                    let name = new["name"].as_str().unwrap_or_default();
                    added && (name == names::LD_PRELOAD || ctx.env_names.contains(name))
                }
                ["env", n, "value"] => {
                    let entry = at(ctx.result, &path[..path.len() - 1]);
                    entry["name"] == names::LD_PRELOAD && preload_extended(ctx, path, n)
                }
                ["volumeMounts", _] => added && new["name"] == names::SHIM_VOLUME,
                ["securityContext"]
                | ["securityContext", "capabilities"]
                | ["securityContext", "capabilities", "add"] => added,
                ["securityContext", "capabilities", "add", _] => added && *new == names::IPC_LOCK,
                _ => false,
            }
        }
        _ => false,
    }
}

/// The LD_PRELOAD literal gained exactly the shim at the end.
fn preload_extended(ctx: &Ctx<'_>, path: &[String], _index: &str) -> bool {
    let old = at(ctx.original, path).as_str().unwrap_or_default();
    let new = at(ctx.result, path).as_str().unwrap_or_default();
    let mut expected: Vec<&str> = preload_entries(old).collect();
    expected.push(&ctx.library);
    preload_entries(new).collect::<Vec<_>>() == expected && new.starts_with(old)
}

/// The Multus annotation kept its form and gained exactly one network at the end.
fn multus_extended(ctx: &Ctx<'_>, path: &[String]) -> bool {
    let old = at(ctx.original, path).as_str().unwrap_or_default();
    let Some(new) = at(ctx.result, path).as_str() else {
        return false;
    };
    let (Ok(before), Ok(after)) = (multus::parse(old), multus::parse(new)) else {
        return false;
    };
    match (before, after) {
        (multus::Networks::Empty, multus::Networks::Csv(refs)) => refs.len() == 1,
        (multus::Networks::Csv(a), multus::Networks::Csv(b)) => {
            b.len() == a.len() + 1
                && b[..a.len()] == a[..]
                && new.starts_with(old.trim_end().trim_end_matches(','))
        }
        (multus::Networks::Json(a, _), multus::Networks::Json(b, _)) => {
            b.len() == a.len() + 1 && b[..a.len()] == a[..]
        }
        _ => false,
    }
}

/// Rules the API server enforces beyond the schema.
fn check_semantics(original: &Value, result: &Value) {
    let spec = &result["spec"];
    let mut all_names = BTreeSet::new();
    for list in ["initContainers", "containers"] {
        for name in super::support::container_names(result, list) {
            assert!(
                all_names.insert(name.clone()),
                "container name {name} is not unique"
            );
        }
    }
    let volumes: Vec<&str> = spec["volumes"]
        .as_array()
        .map(|v| v.iter().filter_map(|v| v["name"].as_str()).collect())
        .unwrap_or_default();
    let unique: BTreeSet<&str> = volumes.iter().copied().collect();
    assert_eq!(
        unique.len(),
        volumes.len(),
        "volume names are unique: {volumes:?}"
    );

    for list in ["initContainers", "containers"] {
        let Some(containers) = spec[list].as_array() else {
            continue;
        };
        for (index, container) in containers.iter().enumerate() {
            let name = container["name"].as_str().unwrap_or_default();
            let mut paths = BTreeSet::new();
            for mount in container["volumeMounts"].as_array().into_iter().flatten() {
                let volume = mount["name"].as_str().unwrap_or_default();
                assert!(
                    unique.contains(volume),
                    "{name}: mount of missing volume {volume}"
                );
                let path = mount["mountPath"].as_str().unwrap_or_default();
                assert!(
                    paths.insert(path),
                    "{name}: mount path {path} is not unique"
                );
            }
            let before = &original["spec"][list][index]["env"];
            let mut counts = BTreeMap::<&str, usize>::new();
            for entry in container["env"].as_array().into_iter().flatten() {
                *counts
                    .entry(entry["name"].as_str().unwrap_or_default())
                    .or_default() += 1;
            }
            for (env, count) in counts {
                let had = before
                    .as_array()
                    .map(|e| e.iter().filter(|x| x["name"] == env).count())
                    .unwrap_or(0);
                assert!(
                    count <= had.max(1),
                    "{name}: env {env} duplicated by the injection"
                );
            }
            let requests = &container["resources"]["requests"];
            let limits = &container["resources"]["limits"];
            if let (Some(requests), Some(limits)) = (requests.as_object(), limits.as_object()) {
                for (resource, value) in requests {
                    let extended =
                        resource.contains('/') && !resource.starts_with("kubernetes.io/");
                    if extended && let Some(limit) = limits.get(resource) {
                        assert_eq!(value, limit, "{name}: {resource} requests == limits");
                    }
                }
            }
        }
    }
}

fn caps_count(container: &Value) -> usize {
    container["securityContext"]["capabilities"]["add"]
        .as_array()
        .map(|add| {
            add.iter()
                .filter(|c| crate::core::capabilities::is_ipc_lock(c))
                .count()
        })
        .unwrap_or(0)
}

fn check_app(ctx: &Ctx<'_>, expect_ipc: bool) {
    let result = ctx.result;
    let shim_volumes: Vec<&Value> = result["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["name"] == names::SHIM_VOLUME)
        .collect();
    assert_eq!(shim_volumes.len(), 1, "exactly one shim volume");
    let delivery = ctx.plan.audit.get("delivery").map(String::as_str);
    let inits: Vec<&Value> = result["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["name"] == names::SHIM_INIT_CONTAINER)
        .collect();
    let had_init = super::support::container_names(ctx.original, "initContainers")
        .iter()
        .any(|n| n == names::SHIM_INIT_CONTAINER);
    if delivery == Some(ShimDelivery::InitCopy.as_str()) {
        assert_eq!(inits.len(), 1, "one init-copy container");
    }
    if delivery == Some(ShimDelivery::InitCopy.as_str()) && !had_init {
        let sc = &inits[0]["securityContext"];
        assert_eq!(sc["runAsNonRoot"], true);
        assert_eq!(sc["allowPrivilegeEscalation"], false);
        assert_eq!(sc["readOnlyRootFilesystem"], true);
        assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
        assert_eq!(
            inits[0]["resources"]["requests"],
            inits[0]["resources"]["limits"]
        );
    }

    let containers = result["spec"]["containers"].as_array().expect("containers");
    for (index, container) in containers.iter().enumerate() {
        let name = container["name"].as_str().unwrap_or_default();
        let original = &ctx.original["spec"]["containers"][index];
        let ipc = caps_count(container);
        assert!(
            ipc <= caps_count(original).max(1),
            "{name}: IPC_LOCK at most once"
        );
        if !ctx.targets.contains(&index) {
            continue;
        }
        let mounts = container["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["name"] == names::SHIM_VOLUME)
            .count();
        let conflict = ctx
            .plan
            .warnings
            .iter()
            .any(|w| w.contains("already mounts"));
        assert!(
            mounts == 1 || (mounts == 0 && conflict),
            "{name}: one shim mount, got {mounts}"
        );

        let preload =
            super::support::env_value(container, names::LD_PRELOAD).expect("LD_PRELOAD entry");
        if preload.get("valueFrom").is_some_and(|v| !v.is_null()) {
            assert!(
                ctx.plan.warnings.iter().any(|w| w.contains("valueFrom")),
                "valueFrom warned"
            );
        } else {
            let value = preload["value"].as_str().expect("literal LD_PRELOAD");
            let count = preload_entries(value).filter(|e| *e == ctx.library).count();
            assert_eq!(count, 1, "{name}: LD_PRELOAD {value:?} holds the shim once");
        }
        let privileged = container["securityContext"]["privileged"] == true;
        if expect_ipc && !privileged {
            assert_eq!(ipc, 1, "{name}: IPC_LOCK added once");
        } else {
            assert_eq!(ipc, caps_count(original), "{name}: IPC_LOCK untouched");
        }
    }
}

fn check_migration(ctx: &Ctx<'_>) {
    let result = ctx.result;
    assert_eq!(
        result["metadata"]["annotations"][names::MIGRATION],
        names::MIGRATION_RDMA
    );
    assert_eq!(ctx.plan.status.containers, [names::COMPUTE_CONTAINER]);
    let volumes = result["spec"]["volumes"].as_array().into_iter().flatten();
    assert!(
        volumes.clone().all(|v| v["name"] != names::SHIM_VOLUME),
        "no shim volume"
    );
    for container in result["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
    {
        assert_eq!(
            super::support::env_value(container, names::LD_PRELOAD),
            super::support::env_value(
                super::support::container(
                    ctx.original,
                    container["name"].as_str().unwrap_or_default()
                ),
                names::LD_PRELOAD
            ),
            "LD_PRELOAD never changes in virt-launcher"
        );
    }
}

/// Some container requests the resource; where we added it, requests == limits == count.
fn check_resource(ctx: &Ctx<'_>) {
    let requested = ["initContainers", "containers"].iter().any(|list| {
        ctx.result["spec"][list]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["resources"]["requests"].get(ctx.resource).is_some()
                    || c["resources"]["limits"].get(ctx.resource).is_some()
            })
    });
    assert!(requested, "some container requests {}", ctx.resource);
    let first = &ctx.result["spec"]["containers"][ctx.targets[0]];
    if let Some(request) = first["resources"]["requests"].get(ctx.resource) {
        assert_eq!(
            Some(request),
            first["resources"]["limits"].get(ctx.resource)
        );
    }
}

/// The checker itself must catch what it claims to.
mod checker {
    use json_patch::jsonptr::PointerBuf;
    use json_patch::{AddOperation, PatchOperation};
    use serde_json::json;

    use super::check;
    use crate::core::tests::support::{config, expect_plan, fixture, ns, run};

    fn bare_plan_with(
        path: &str,
        value: serde_json::Value,
    ) -> (serde_json::Value, crate::core::Plan) {
        let pod = fixture("bare");
        let mut plan = expect_plan(run(&pod, &ns("team-a", &[]), &config()));
        plan.patch.0.push(PatchOperation::Add(AddOperation {
            path: PointerBuf::parse(path).expect("pointer"),
            value,
        }));
        (pod, plan)
    }

    #[test]
    #[should_panic(expected = "outside the intended paths")]
    fn catches_a_stray_field() {
        let (pod, plan) = bare_plan_with("/spec/hostNetwork", json!(true));
        check(&pod, &plan, &config());
    }

    #[test]
    #[should_panic(expected = "nothing may be removed")]
    fn catches_a_removal() {
        let (pod, plan) = bare_plan_with("/metadata/labels", json!({}));
        check(&pod, &plan, &config());
    }

    #[test]
    #[should_panic(expected = "duplicated by the injection")]
    fn catches_a_duplicate_env_entry() {
        let (pod, plan) = bare_plan_with(
            "/spec/containers/0/env/-",
            json!({"name": "LD_PRELOAD", "value": "/opt/rdma-streams/lib/libstreamshim.so"}),
        );
        check(&pod, &plan, &config());
    }
}
