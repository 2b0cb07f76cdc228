//! Property tests over generated pods: random container counts and names (foreign injectors
//! included), env (LD_PRELOAD literal, empty, already shimmed, valueFrom, name only),
//! resources (the RDMA resource already requested or not), securityContexts (privileged,
//! IPC_LOCK present, drop ALL), mounts (including one at the shim path), annotations (profile,
//! targets, default container, Multus in both forms, a garbage status), labels and namespace
//! Pod Security levels. Whatever the plan decides, it never fails internally; when it patches,
//! the patch applies, the result is a Pod, every invariant holds, and re-planning is a no-op.

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::{select, subsequence};
use serde_json::{Map, Value, json};

use super::support::{config, ns, run};
use super::{invariants, reinvocation};
use crate::core::{Decision, NamespaceFacts};

const CONTAINER_NAMES: &[&str] = &[
    "app",
    "worker",
    "sidecar",
    "db",
    "metrics",
    "istio-proxy",
    "linkerd-proxy",
    "compute",
];
const INIT_NAMES: &[&str] = &["init-db", "istio-init", "rdma-streams-shim"];

fn ld_preload() -> impl Strategy<Value = Value> {
    select(vec![
        json!({"name": "LD_PRELOAD", "value": "/usr/lib/libjemalloc.so"}),
        json!({"name": "LD_PRELOAD", "value": "/a.so /b.so"}),
        json!({"name": "LD_PRELOAD", "value": "/a.so:"}),
        json!({"name": "LD_PRELOAD", "value": ""}),
        json!({"name": "LD_PRELOAD", "value": "/opt/rdma-streams/lib/libstreamshim.so"}),
        json!({"name": "LD_PRELOAD", "valueFrom": {"configMapKeyRef": {"name": "p", "key": "k"}}}),
        json!({"name": "LD_PRELOAD"}),
    ])
}

fn env() -> impl Strategy<Value = Option<Value>> {
    (
        option::of(ld_preload()),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0..3u8,
    )
        .prop_map(|(preload, mode, foo, pod_ip, shape)| {
            let mut entries = Vec::new();
            if foo {
                entries.push(json!({"name": "FOO", "value": "bar"}));
            }
            if let Some(preload) = preload {
                entries.push(preload);
            }
            if mode {
                entries.push(json!({"name": "STREAMSHIM_MODE", "value": "direct"}));
            }
            if pod_ip {
                entries.push(json!({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}));
            }
            match (entries.is_empty(), shape) {
                (true, 0) => None,
                (true, 1) => Some(Value::Null),
                _ => Some(Value::Array(entries)),
            }
        })
}

fn resources() -> impl Strategy<Value = Option<Value>> {
    option::of(select(vec![
        json!({}),
        json!({"requests": {"cpu": "100m"}}),
        json!({"limits": {"memory": "1Gi"}, "requests": {"memory": "1Gi"}}),
        json!({"requests": {"rdma-streams.io/hca": "1"}, "limits": {"rdma-streams.io/hca": "1"}}),
        json!({"limits": {"rdma-streams.io/hca": "2"}}),
        json!({"requests": {"example.com/rdma-vf": "1"}, "limits": {"example.com/rdma-vf": "1"}}),
        json!({"requests": null}),
    ]))
}

fn security_context() -> impl Strategy<Value = Option<Value>> {
    option::of(select(vec![
        json!({}),
        json!({"privileged": true}),
        json!({"privileged": false, "capabilities": {"add": ["IPC_LOCK"]}}),
        json!({"capabilities": {"add": ["CAP_IPC_LOCK", "NET_ADMIN"]}}),
        json!({"capabilities": {"drop": ["ALL"]}}),
        json!({"capabilities": null}),
        json!({"runAsNonRoot": true, "allowPrivilegeEscalation": false}),
    ]))
}

fn mounts() -> impl Strategy<Value = Option<Value>> {
    option::of(select(vec![
        json!([]),
        json!([{"name": "data", "mountPath": "/data"}]),
        json!([{"name": "data", "mountPath": "/opt/rdma-streams"}]),
        json!([{"name": "data", "mountPath": "/data", "readOnly": true, "subPath": "x"}]),
    ]))
}

fn container_body() -> impl Strategy<Value = Map<String, Value>> {
    (
        env(),
        resources(),
        security_context(),
        mounts(),
        any::<bool>(),
    )
        .prop_map(|(env, resources, security_context, mounts, future)| {
            let mut body = Map::new();
            body.insert("image".to_owned(), json!("registry.example/x:1"));
            for (key, value) in [
                ("env", env),
                ("resources", resources),
                ("securityContext", security_context),
                ("volumeMounts", mounts),
            ] {
                if let Some(value) = value {
                    body.insert(key.to_owned(), value);
                }
            }
            if future {
                body.insert("futureContainerField".to_owned(), json!({"x": [1, 2]}));
            }
            body
        })
}

fn named(names: Vec<&'static str>, bodies: Vec<Map<String, Value>>) -> Value {
    Value::Array(
        names
            .into_iter()
            .zip(bodies)
            .map(|(name, mut body)| {
                body.insert("name".to_owned(), json!(name));
                Value::Object(body)
            })
            .collect(),
    )
}

fn containers() -> impl Strategy<Value = Value> {
    subsequence(CONTAINER_NAMES.to_vec(), 1..=4)
        .prop_shuffle()
        .prop_flat_map(|names| {
            let n = names.len();
            (Just(names), vec(container_body(), n))
        })
        .prop_map(|(names, bodies)| named(names, bodies))
}

fn init_containers() -> impl Strategy<Value = Option<Value>> {
    subsequence(INIT_NAMES.to_vec(), 0..=2).prop_flat_map(|names| {
        let n = names.len();
        (Just(names), vec(resources(), n)).prop_map(|(names, resources)| {
            if names.is_empty() {
                return None;
            }
            let bodies = resources
                .into_iter()
                .map(|r| {
                    let mut body = Map::new();
                    body.insert("image".to_owned(), json!("busybox:1"));
                    if let Some(r) = r {
                        body.insert("resources".to_owned(), r);
                    }
                    body
                })
                .collect();
            Some(named(names, bodies))
        })
    })
}

fn label_value() -> impl Strategy<Value = Option<&'static str>> {
    option::of(select(vec!["true", "false"]))
}

fn annotations() -> impl Strategy<Value = Map<String, Value>> {
    (
        option::of(select(vec![
            "default", "degrade", "hostpath", "image", "net", "no-ipc", "turbo",
        ])),
        option::of(subsequence([CONTAINER_NAMES, &["ghost"]].concat(), 1..=3)),
        option::of(select(CONTAINER_NAMES.to_vec())),
        option::of(select(vec![
            "",
            "macvlan",
            "a, infra/rdma-net@net1",
            "infra/other@net2,",
            r#"[{"name":"macvlan","ips":["10.0.0.2/24"]}]"#,
            r#"[{"name":"rdma-net","namespace":"infra"}]"#,
        ])),
        any::<bool>(),
        label_value(),
    )
        .prop_map(
            |(profile, targets, default, multus, garbage_status, inject)| {
                let mut map = Map::new();
                if let Some(profile) = profile {
                    map.insert("rdma-streams.io/profile".to_owned(), json!(profile));
                }
                if let Some(targets) = targets {
                    map.insert(
                        "rdma-streams.io/containers".to_owned(),
                        json!(targets.join(",")),
                    );
                }
                if let Some(default) = default {
                    map.insert(
                        "kubectl.kubernetes.io/default-container".to_owned(),
                        json!(default),
                    );
                }
                if let Some(multus) = multus {
                    map.insert("k8s.v1.cni.cncf.io/networks".to_owned(), json!(multus));
                }
                if garbage_status {
                    map.insert("rdma-streams.io/status".to_owned(), json!("not json"));
                }
                if let Some(inject) = inject {
                    map.insert("rdma-streams.io/inject".to_owned(), json!(inject));
                }
                map
            },
        )
}

prop_compose! {
    fn pod()(
        containers in containers(),
        init_containers in init_containers(),
        annotations in annotations(),
        inject in label_value(),
        launcher in prop::bool::weighted(0.15),
        migration in option::of(select(vec!["rdma", "tcp"])),
        named in any::<bool>(),
        namespaced in any::<bool>(),
        data_volume in any::<bool>(),
        future in any::<bool>(),
    ) -> Value {
        let mut labels = Map::new();
        labels.insert("app".to_owned(), json!("generated"));
        if let Some(inject) = inject {
            labels.insert("rdma-streams.io/inject".to_owned(), json!(inject));
        }
        if launcher {
            labels.insert("kubevirt.io".to_owned(), json!("virt-launcher"));
        }
        if let Some(migration) = migration {
            labels.insert("rdma-streams.io/migration".to_owned(), json!(migration));
        }
        let mut metadata = Map::new();
        if named {
            metadata.insert("name".to_owned(), json!("generated"));
        } else {
            metadata.insert("generateName".to_owned(), json!("generated-"));
        }
        if namespaced {
            metadata.insert("namespace".to_owned(), json!("team-a"));
        }
        metadata.insert("labels".to_owned(), Value::Object(labels));
        if !annotations.is_empty() {
            metadata.insert("annotations".to_owned(), Value::Object(annotations));
        }
        let mounts_data = containers
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["volumeMounts"].as_array().is_some_and(|m| !m.is_empty()));
        let mut spec = Map::new();
        spec.insert("containers".to_owned(), containers);
        if let Some(init) = init_containers {
            spec.insert("initContainers".to_owned(), init);
        }
        if mounts_data || data_volume {
            spec.insert("volumes".to_owned(), json!([{"name": "data", "emptyDir": {}}]));
        }
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec});
        if future {
            pod["spec"]["futurePodField"] = json!({"enabled": true});
        }
        pod
    }
}

fn namespace() -> impl Strategy<Value = NamespaceFacts> {
    (
        any::<bool>(),
        option::of(select(vec!["privileged", "baseline", "restricted"])),
    )
        .prop_map(|(enabled, level)| {
            let mut labels = Vec::new();
            if enabled {
                labels.push(("rdma-streams.io/inject", "enabled"));
            }
            if let Some(level) = level {
                labels.push(("pod-security.kubernetes.io/enforce", level));
            }
            ns("team-a", &labels)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn generated_pods_keep_every_invariant(pod in pod(), namespace in namespace()) {
        let config = config();
        if let Decision::Patch(plan) = run(&pod, &namespace, &config) {
            let result = invariants::check(&pod, &plan, &config);
            reinvocation::check(&result, &namespace, &config);
        }
    }
}

/// The generator reaches every kind of decision (guards against a generator that only ever
/// produces skips).
#[test]
fn generator_covers_patch_skip_and_deny() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let config = config();
    let mut runner = TestRunner::deterministic();
    let (mut patches, mut skips, mut denies, mut migrations) = (0, 0, 0, 0);
    for _ in 0..400 {
        let pod = pod().new_tree(&mut runner).expect("tree").current();
        let namespace = namespace().new_tree(&mut runner).expect("tree").current();
        match run(&pod, &namespace, &config) {
            Decision::Patch(plan) => {
                patches += 1;
                if plan.audit["mode"] == "kubevirt-migration" {
                    migrations += 1;
                }
            }
            Decision::Skip { .. } => skips += 1,
            Decision::Deny { .. } => denies += 1,
        }
    }
    assert!(
        patches >= 60,
        "patches {patches}, skips {skips}, denies {denies}"
    );
    assert!(
        skips >= 20 && denies >= 20,
        "patches {patches}, skips {skips}, denies {denies}"
    );
    assert!(migrations >= 3, "migrations {migrations}");
}
