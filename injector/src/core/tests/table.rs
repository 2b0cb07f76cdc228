//! Table tests over pod shapes. Every case that yields a patch also goes through the invariant
//! checks, the reinvocation scenarios, and a dry-run comparison.

use serde_json::{Value, json};

use super::support::{
    baseline, config, container, container_names, env_value, expect_plan, fixture, ns, op_paths,
    restricted, run, set_annotation, set_label,
};
use super::{invariants, reinvocation};
use crate::core::{Decision, DenyReason, NamespaceFacts, Plan, SkipReason, names};

const LIB: &str = "/opt/rdma-streams/lib/libstreamshim.so";

/// Expected outcome.
pub(super) enum Expect {
    Patch(fn(&Check<'_>)),
    Skip(SkipReason),
    Deny(DenyReason, &'static [&'static str]),
}

/// What a patch check sees.
pub(super) struct Check<'a> {
    pub original: &'a Value,
    pub result: &'a Value,
    pub plan: &'a Plan,
}

/// One row.
pub(super) struct Case {
    pub name: &'static str,
    pub pod: Value,
    pub namespace: NamespaceFacts,
    pub expect: Expect,
    /// Valid against the published schemas (no invented fields).
    pub schema_valid: bool,
}

fn case(name: &'static str, pod: Value, namespace: NamespaceFacts, expect: Expect) -> Case {
    Case {
        name,
        pod,
        namespace,
        expect,
        schema_valid: true,
    }
}

fn with(mut pod: Value, edit: impl FnOnce(&mut Value)) -> Value {
    edit(&mut pod);
    pod
}

fn profile(pod: Value, name: &str) -> Value {
    with(pod, |p| {
        set_annotation(p, names::PROFILE_ANNOTATION, Some(name))
    })
}

fn plain() -> NamespaceFacts {
    ns("team-a", &[])
}

fn enabled() -> NamespaceFacts {
    ns("rdma-enabled", &[("rdma-streams.io/inject", "enabled")])
}

fn has_warning(plan: &Plan, needle: &str) -> bool {
    plan.warnings.iter().any(|w| w.contains(needle))
}

fn caps(container: &Value) -> Value {
    container["securityContext"]["capabilities"]["add"].clone()
}

/// Every case.
pub(super) fn cases() -> Vec<Case> {
    let mut cases = vec![
        case(
            "bare pod",
            fixture("bare"),
            plain(),
            Expect::Patch(|c| {
                assert_eq!(
                    op_paths(c.plan),
                    [
                        "add /spec/volumes",
                        "add /spec/volumes/-",
                        "add /spec/initContainers",
                        "add /spec/initContainers/-",
                        "add /spec/containers/0/volumeMounts",
                        "add /spec/containers/0/volumeMounts/-",
                        "add /spec/containers/0/env",
                        "add /spec/containers/0/env/-",
                        "add /spec/containers/0/env/-",
                        "add /spec/containers/0/env/-",
                        "add /spec/containers/0/securityContext",
                        "add /spec/containers/0/securityContext/capabilities",
                        "add /spec/containers/0/securityContext/capabilities/add",
                        "add /spec/containers/0/securityContext/capabilities/add/-",
                        "add /spec/containers/0/resources",
                        "add /spec/containers/0/resources/requests",
                        "add /spec/containers/0/resources/requests/rdma-streams.io~1hca",
                        "add /spec/containers/0/resources/limits",
                        "add /spec/containers/0/resources/limits/rdma-streams.io~1hca",
                        "add /metadata/annotations",
                        "add /metadata/annotations/rdma-streams.io~1status",
                    ]
                );
                let iperf = container(c.result, "iperf");
                assert_eq!(
                    iperf["env"],
                    json!([
                        {"name": "STREAMSHIM_LOG", "value": "info"},
                        {"name": "STREAMSHIM_MODE", "value": "proxy"},
                        {"name": "LD_PRELOAD", "value": LIB},
                    ])
                );
                assert_eq!(
                    iperf["volumeMounts"],
                    json!([{"name": "rdma-streams-shim", "mountPath": "/opt/rdma-streams", "readOnly": true}])
                );
                assert_eq!(
                    c.result["spec"]["volumes"],
                    json!([{"name": "rdma-streams-shim", "emptyDir": {}}])
                );
                assert_eq!(
                    c.result["spec"]["initContainers"][0]["command"],
                    json!(["cp", "-R", "/bundle/.", "/opt/rdma-streams"])
                );
                assert_eq!(
                    c.result["spec"]["initContainers"][0]["image"],
                    "rdma-streams/shim-bundle:0.1.0"
                );
                assert_eq!(caps(iperf), json!(["IPC_LOCK"]));
                assert_eq!(
                    iperf["resources"],
                    json!({"requests": {"rdma-streams.io/hca": "1"}, "limits": {"rdma-streams.io/hca": "1"}})
                );
                assert!(c.plan.warnings.is_empty(), "{:?}", c.plan.warnings);
                assert_eq!(c.plan.audit["profile"], "default");
                assert_eq!(c.plan.audit["containers"], "iperf");
                assert_eq!(c.plan.audit["delivery"], "init-copy");
                assert_eq!(c.plan.audit["mode"], "app");
                assert_eq!(c.plan.status.containers, ["iperf"]);
                assert_eq!(c.plan.status.version, env!("CARGO_PKG_VERSION"));
                assert_eq!(c.plan.status.hash.len(), 16);
            }),
        ),
        case(
            "controller-made pod in an opted-in namespace",
            fixture("controller-made"),
            enabled(),
            Expect::Patch(|c| {
                assert!(
                    c.result["metadata"].get("name").is_none(),
                    "no name invented"
                );
                assert!(
                    c.result["metadata"].get("namespace").is_none(),
                    "no namespace invented"
                );
                let web = container(c.result, "web");
                assert_eq!(
                    web["resources"]["requests"],
                    json!({"cpu": "250m", "memory": "128Mi", "rdma-streams.io/hca": "1"})
                );
                assert_eq!(
                    web["resources"]["limits"],
                    json!({"memory": "256Mi", "rdma-streams.io/hca": "1"})
                );
                assert_eq!(web["volumeMounts"].as_array().map(Vec::len), Some(2));
                assert_eq!(c.result["spec"]["volumes"][1]["name"], "rdma-streams-shim");
            }),
        ),
        case(
            "controller-made pod, namespace not opted in",
            fixture("controller-made"),
            plain(),
            Expect::Skip(SkipReason::NotOptedIn),
        ),
        case(
            "LD_PRELOAD literal",
            fixture("ld-preload-literal"),
            ns("cache", &[]),
            Expect::Patch(|c| {
                let redis = container(c.result, "redis");
                assert_eq!(
                    env_value(redis, "LD_PRELOAD").map(|e| e["value"].clone()),
                    Some(json!(format!(
                        "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2:{LIB}"
                    )))
                );
                let ops = op_paths(c.plan);
                let replace = ops
                    .iter()
                    .position(|p| p == "replace /spec/containers/0/env/0/value")
                    .expect("replace");
                assert_eq!(ops[replace - 1], "test /spec/containers/0/env/0/value");
                assert_eq!(
                    redis["env"].as_array().map(Vec::len),
                    Some(4),
                    "two profile vars appended"
                );
            }),
        ),
        case(
            "LD_PRELOAD from a ConfigMap",
            fixture("ld-preload-valuefrom"),
            plain(),
            Expect::Patch(|c| {
                let app = container(c.result, "app");
                assert_eq!(app["env"][0], c.original["spec"]["containers"][0]["env"][0]);
                assert!(has_warning(c.plan, "valueFrom"));
                assert!(env_value(app, "STREAMSHIM_MODE").is_some());
            }),
        ),
        case(
            "explicit target list",
            fixture("multi-container-targets"),
            plain(),
            Expect::Patch(|c| {
                assert_eq!(c.plan.status.containers, ["producer", "consumer"]);
                assert_eq!(
                    container(c.result, "metrics"),
                    container(c.original, "metrics")
                );
                let producer = container(c.result, "producer");
                let consumer = container(c.result, "consumer");
                assert_eq!(producer["resources"]["limits"]["rdma-streams.io/hca"], "1");
                assert!(
                    consumer.get("resources").is_none(),
                    "the resource goes to the first target only"
                );
                assert_eq!(caps(consumer), json!(["IPC_LOCK"]));
                assert_eq!(
                    env_value(consumer, "MODE").map(|e| e["value"].clone()),
                    Some(json!("fast"))
                );
                assert_eq!(
                    env_value(consumer, "LD_PRELOAD").map(|e| e["value"].clone()),
                    Some(json!(LIB))
                );
            }),
        ),
        case(
            "several containers, no target list",
            with(fixture("multi-container-targets"), |p| {
                set_annotation(p, names::CONTAINERS_ANNOTATION, None)
            }),
            plain(),
            Expect::Patch(|c| {
                assert_eq!(c.plan.status.containers, ["producer"]);
                assert_eq!(
                    container(c.result, "consumer"),
                    container(c.original, "consumer")
                );
            }),
        ),
        case(
            "default-container annotation",
            fixture("multi-container-default"),
            ns("ml", &[]),
            Expect::Patch(|c| {
                assert_eq!(c.plan.status.containers, ["trainer"]);
                assert_eq!(
                    container(c.result, "log-shipper"),
                    container(c.original, "log-shipper")
                );
                let trainer = container(c.result, "trainer");
                assert_eq!(
                    trainer["securityContext"]["capabilities"],
                    json!({"drop": ["ALL"], "add": ["IPC_LOCK"]})
                );
                assert_eq!(
                    container_names(c.result, "initContainers"),
                    ["fetch-data", "rdma-streams-shim"]
                );
            }),
        ),
        case(
            "default-container names a foreign container",
            with(fixture("istio-proxy"), |p| {
                set_annotation(p, names::DEFAULT_CONTAINER_ANNOTATION, Some("istio-proxy"))
            }),
            ns("mesh", &[]),
            Expect::Patch(|c| {
                assert_eq!(c.plan.status.containers, ["reviews"]);
                assert!(has_warning(c.plan, "another injector"));
            }),
        ),
        case(
            "istio-proxy first",
            fixture("istio-proxy"),
            ns("mesh", &[]),
            Expect::Patch(|c| {
                assert_eq!(c.plan.status.containers, ["reviews"]);
                assert_eq!(
                    container(c.result, "istio-proxy"),
                    container(c.original, "istio-proxy")
                );
                assert_eq!(
                    c.result["spec"]["initContainers"][0],
                    c.original["spec"]["initContainers"][0]
                );
                assert_eq!(
                    container_names(c.result, "initContainers"),
                    ["istio-init", "rdma-streams-shim"]
                );
            }),
        ),
        case(
            "target list names istio-proxy",
            with(fixture("istio-proxy"), |p| {
                set_annotation(p, names::CONTAINERS_ANNOTATION, Some("reviews,istio-proxy"))
            }),
            ns("mesh", &[]),
            Expect::Deny(
                DenyReason::InvalidTarget,
                &["istio-proxy", "another injector"],
            ),
        ),
        case(
            "only foreign containers",
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "labels": {"rdma-streams.io/inject": "true"}},
                   "spec": {"containers": [{"name": "istio-proxy", "image": "istio/proxyv2:1"}]}}),
            plain(),
            Expect::Skip(SkipReason::NoTargetContainer),
        ),
        case(
            "resource requested by another container",
            fixture("resource-elsewhere"),
            plain(),
            Expect::Patch(|c| {
                let app = container(c.result, "app");
                assert!(app.get("resources").is_none(), "not requested twice");
                assert_eq!(
                    container(c.result, "nvmeof-agent"),
                    container(c.original, "nvmeof-agent")
                );
                assert!(has_warning(c.plan, "nvmeof-agent"));
                assert_eq!(
                    env_value(app, "LD_PRELOAD").map(|e| e["value"].clone()),
                    Some(json!(LIB))
                );
            }),
        ),
        case(
            "virt-launcher of an RDMA-migration VM",
            fixture("virt-launcher"),
            ns("vms", &[]),
            Expect::Patch(|c| {
                assert_eq!(
                    op_paths(c.plan),
                    [
                        "add /spec/containers/0/resources/requests/rdma-streams.io~1hca",
                        "add /spec/containers/0/resources/limits/rdma-streams.io~1hca",
                        "add /metadata/annotations/rdma-streams.io~1migration",
                        "add /metadata/annotations/rdma-streams.io~1status",
                    ]
                );
                assert_eq!(c.plan.audit["mode"], "kubevirt-migration");
                assert!(!c.plan.audit.contains_key("delivery"));
                assert_eq!(
                    c.result["metadata"]["annotations"][names::MULTUS_NETWORKS],
                    c.original["metadata"]["annotations"][names::MULTUS_NETWORKS],
                    "KubeVirt's networks annotation untouched"
                );
            }),
        ),
        case(
            "virt-launcher opted in by the pod label only",
            with(fixture("virt-launcher"), |p| {
                set_label(p, names::MIGRATION, None);
                set_label(p, names::INJECT, Some("true"));
            }),
            ns("vms", &[]),
            Expect::Patch(|c| {
                assert_eq!(c.plan.audit["mode"], "kubevirt-migration");
                assert!(env_value(container(c.result, "compute"), "LD_PRELOAD").is_none());
            }),
        ),
        case(
            "virt-launcher opted in by annotation",
            with(fixture("virt-launcher"), |p| {
                set_label(p, names::MIGRATION, None);
                set_annotation(p, names::MIGRATION, Some("rdma"));
            }),
            ns("vms", &[]),
            Expect::Patch(|c| {
                assert!(
                    !op_paths(c.plan).iter().any(|p| p.contains("migration")),
                    "annotation already there"
                );
            }),
        ),
        case(
            "virt-launcher without opt-in",
            with(fixture("virt-launcher"), |p| {
                set_label(p, names::MIGRATION, None)
            }),
            ns("vms", &[]),
            Expect::Skip(SkipReason::NotOptedIn),
        ),
        case(
            "virt-launcher in an opted-in namespace, VM not opted in",
            with(fixture("virt-launcher"), |p| {
                set_label(p, names::MIGRATION, None)
            }),
            enabled(),
            Expect::Skip(SkipReason::NotOptedIn),
        ),
        case(
            "virt-launcher with an unknown migration transport",
            with(fixture("virt-launcher"), |p| {
                set_label(p, names::MIGRATION, Some("tcp"))
            }),
            ns("vms", &[]),
            Expect::Deny(DenyReason::BadAnnotation, &["tcp"]),
        ),
        case(
            "virt-launcher in a restricted namespace",
            fixture("virt-launcher"),
            restricted("vms"),
            Expect::Patch(|c| assert!(!c.plan.audit.contains_key("pod-security"))),
        ),
        case(
            "virt-launcher without compute",
            with(fixture("virt-launcher"), |p| {
                p["spec"]["containers"][0]["name"] = json!("qemu")
            }),
            ns("vms", &[]),
            Expect::Deny(DenyReason::InvalidTarget, &["compute"]),
        ),
        case(
            "baseline namespace, profile deny",
            fixture("bare"),
            baseline("team-a"),
            Expect::Deny(
                DenyReason::PodSecurity,
                &[
                    "\"baseline\"",
                    "IPC_LOCK",
                    "pod-security.kubernetes.io/enforce=privileged",
                    "podSecurity: degrade",
                    "rdma-streams.io/inject=false",
                ],
            ),
        ),
        case(
            "restricted namespace, profile deny",
            fixture("controller-made"),
            ns(
                "rdma-enabled",
                &[
                    ("rdma-streams.io/inject", "enabled"),
                    ("pod-security.kubernetes.io/enforce", "restricted"),
                ],
            ),
            Expect::Deny(DenyReason::PodSecurity, &["\"restricted\"", "IPC_LOCK"]),
        ),
        case(
            "unknown Pod Security level is read as restricted",
            fixture("bare"),
            ns(
                "team-a",
                &[("pod-security.kubernetes.io/enforce", "strict")],
            ),
            Expect::Deny(DenyReason::PodSecurity, &["\"restricted\""]),
        ),
        case(
            "baseline namespace, profile degrade",
            profile(fixture("bare"), "degrade"),
            baseline("team-a"),
            Expect::Patch(|c| {
                let iperf = container(c.result, "iperf");
                assert!(iperf.get("securityContext").is_none(), "no IPC_LOCK");
                assert!(has_warning(c.plan, "without IPC_LOCK"));
                assert_eq!(c.plan.audit["pod-security"], "degraded:baseline");
            }),
        ),
        case(
            "restricted namespace, profile degrade",
            profile(fixture("bare"), "degrade"),
            restricted("team-a"),
            Expect::Patch(|c| {
                assert!(
                    container(c.result, "iperf")
                        .get("securityContext")
                        .is_none()
                );
                assert_eq!(c.plan.audit["pod-security"], "degraded:restricted");
            }),
        ),
        case(
            "host-path in a privileged namespace",
            profile(fixture("bare"), "hostpath"),
            plain(),
            Expect::Patch(|c| {
                assert_eq!(
                    c.result["spec"]["volumes"],
                    json!([{"name": "rdma-streams-shim", "hostPath": {"path": "/opt/rdma-streams/0.1.0", "type": "Directory"}}])
                );
                assert!(c.result["spec"].get("initContainers").is_none());
                assert_eq!(caps(container(c.result, "iperf")), json!(["IPC_LOCK"]));
            }),
        ),
        case(
            "host-path degraded to init-copy",
            profile(fixture("bare"), "hostpath"),
            baseline("team-a"),
            Expect::Patch(|c| {
                assert_eq!(
                    c.result["spec"]["volumes"],
                    json!([{"name": "rdma-streams-shim", "emptyDir": {}}])
                );
                assert_eq!(
                    container_names(c.result, "initContainers"),
                    ["rdma-streams-shim"]
                );
                assert_eq!(c.plan.audit["delivery"], "init-copy");
                assert!(has_warning(c.plan, "init-copy instead of host-path"));
            }),
        ),
        case(
            "host-path without an image in a baseline namespace",
            profile(fixture("bare"), "hostpath-only"),
            baseline("team-a"),
            Expect::Deny(DenyReason::PodSecurity, &["hostPath", "shim.image"]),
        ),
        case(
            "no IPC_LOCK profile in a baseline namespace",
            profile(fixture("bare"), "no-ipc"),
            baseline("team-a"),
            Expect::Patch(|c| {
                assert!(c.plan.warnings.is_empty());
                assert!(!c.plan.audit.contains_key("pod-security"));
            }),
        ),
        case(
            "image volume under restricted v1.32",
            profile(fixture("bare"), "image"),
            ns(
                "team-a",
                &[
                    ("pod-security.kubernetes.io/enforce", "restricted"),
                    ("pod-security.kubernetes.io/enforce-version", "v1.32"),
                ],
            ),
            Expect::Deny(DenyReason::PodSecurity, &["image volumes", "v1.32"]),
        ),
        case(
            "annotation opt-in, image volume",
            fixture("annotation-opt-in"),
            ns("team-b", &[]),
            Expect::Patch(|c| {
                assert_eq!(
                    c.result["spec"]["volumes"],
                    json!([{"name": "rdma-streams-shim", "image": {"reference": "rdma-streams/shim:0.1.0", "pullPolicy": "IfNotPresent"}}])
                );
                let app = container(c.result, "app");
                assert_eq!(
                    app["volumeMounts"][0]["mountPath"],
                    "/usr/local/rdma-streams"
                );
                assert_eq!(app["resources"]["requests"]["example.com/rdma-vf"], "2");
                assert!(op_paths(c.plan).contains(
                    &"add /spec/containers/0/resources/limits/example.com~1rdma-vf".to_owned()
                ));
                assert_eq!(
                    env_value(app, "LD_PRELOAD").map(|e| e["value"].clone()),
                    Some(json!("/usr/local/rdma-streams/lib/libstreamshim.so"))
                );
                assert_eq!(
                    env_value(app, "STREAMSHIM_DISABLE").map(|e| e["value"].clone()),
                    Some(json!("0"))
                );
            }),
        ),
        case(
            "Multus comma form",
            fixture("multus-csv"),
            plain(),
            Expect::Patch(|c| {
                assert_eq!(
                    c.result["metadata"]["annotations"][names::MULTUS_NETWORKS],
                    "macvlan-conf, infra/sriov-net@net3,infra/rdma-net@net1"
                );
                let ops = op_paths(c.plan);
                let replace = ops
                    .iter()
                    .position(|p| p == "replace /metadata/annotations/k8s.v1.cni.cncf.io~1networks")
                    .expect("replace");
                assert!(ops[replace - 1].starts_with("test "));
            }),
        ),
        case(
            "Multus JSON form",
            fixture("multus-json"),
            plain(),
            Expect::Patch(|c| {
                let text = c.result["metadata"]["annotations"][names::MULTUS_NETWORKS]
                    .as_str()
                    .expect("text");
                let list: Value = serde_json::from_str(text).expect("still JSON");
                assert_eq!(
                    list,
                    json!([
                        {"name": "macvlan-conf", "ips": ["10.1.1.5/24"]},
                        {"name": "rdma-net", "namespace": "infra", "interface": "net1"},
                    ])
                );
            }),
        ),
        case(
            "Multus network already listed",
            with(fixture("multus-csv"), |p| {
                set_annotation(p, names::MULTUS_NETWORKS, Some("infra/rdma-net@net7"))
            }),
            plain(),
            Expect::Patch(|c| {
                assert!(!op_paths(c.plan).iter().any(|p| p.contains("networks")));
            }),
        ),
        case(
            "Multus network already listed in JSON form",
            with(fixture("multus-json"), |p| {
                set_annotation(
                    p,
                    names::MULTUS_NETWORKS,
                    Some(r#"[{"name":"rdma-net","namespace":"infra"}]"#),
                )
            }),
            plain(),
            Expect::Patch(|c| {
                assert!(!op_paths(c.plan).iter().any(|p| p.contains("networks")));
            }),
        ),
        case(
            "Multus annotation absent",
            profile(fixture("bare"), "net"),
            plain(),
            Expect::Patch(|c| {
                assert_eq!(
                    c.result["metadata"]["annotations"][names::MULTUS_NETWORKS],
                    "infra/rdma-net@net1"
                );
            }),
        ),
        case(
            "Multus annotation unreadable",
            with(fixture("multus-json"), |p| {
                set_annotation(p, names::MULTUS_NETWORKS, Some("[{\"name\": "))
            }),
            plain(),
            Expect::Deny(DenyReason::BadAnnotation, &["k8s.v1.cni.cncf.io/networks"]),
        ),
        Case {
            schema_valid: false,
            ..case(
                "invented future fields",
                fixture("future-field"),
                plain(),
                Expect::Patch(|c| {
                    assert_eq!(
                        c.result["metadata"]["futureMetadataField"],
                        json!({"since": "v1.99"})
                    );
                    assert_eq!(
                        c.result["spec"]["futureSchedulingGate"],
                        c.original["spec"]["futureSchedulingGate"]
                    );
                    let app = container(c.result, "app");
                    assert_eq!(app["futureContainerField"], true);
                    assert_eq!(app["env"][0]["futureEnvField"], "x");
                    assert_eq!(
                        app["resources"]["futureResourceField"],
                        json!({"gpuSlices": 2})
                    );
                    assert_eq!(
                        app["securityContext"]["capabilities"]["futureCapabilityField"],
                        7
                    );
                    assert_eq!(
                        app["securityContext"]["capabilities"]["add"],
                        json!(["NET_ADMIN", "IPC_LOCK"])
                    );
                    assert_eq!(
                        c.result["spec"]["volumes"][0]["futureVolumeField"],
                        json!({"tier": "hot"})
                    );
                    assert_eq!(c.result["status"], c.original["status"]);
                }),
            )
        },
        case(
            "partly injected pod",
            fixture("partly-injected"),
            plain(),
            Expect::Patch(|c| {
                let app = container(c.result, "app");
                assert_eq!(
                    env_value(app, "STREAMSHIM_MODE").map(|e| e["value"].clone()),
                    Some(json!("direct")),
                    "user value kept"
                );
                assert!(has_warning(c.plan, "STREAMSHIM_MODE"));
                assert_eq!(caps(app), json!(["CAP_IPC_LOCK"]), "CAP_IPC_LOCK counts");
                assert_eq!(app["volumeMounts"].as_array().map(Vec::len), Some(1));
                assert_eq!(
                    c.result["spec"]["volumes"].as_array().map(Vec::len),
                    Some(1)
                );
                assert_eq!(
                    op_paths(c.plan),
                    [
                        "add /spec/initContainers",
                        "add /spec/initContainers/-",
                        "add /spec/containers/0/env/-",
                        "add /spec/containers/0/resources",
                        "add /spec/containers/0/resources/requests",
                        "add /spec/containers/0/resources/requests/rdma-streams.io~1hca",
                        "add /spec/containers/0/resources/limits",
                        "add /spec/containers/0/resources/limits/rdma-streams.io~1hca",
                        "test /metadata/annotations/rdma-streams.io~1status",
                        "add /metadata/annotations/rdma-streams.io~1status",
                    ]
                );
            }),
        ),
        case(
            "privileged container, env: null",
            fixture("privileged"),
            ns("lab", &[]),
            Expect::Patch(|c| {
                let perftest = container(c.result, "perftest");
                assert_eq!(
                    perftest["securityContext"],
                    json!({"privileged": true}),
                    "no IPC_LOCK for privileged"
                );
                assert!(perftest["env"].is_array());
            }),
        ),
        case(
            "mount path already taken",
            with(fixture("bare"), |p| {
                p["spec"]["containers"][0]["volumeMounts"] =
                    json!([{"name": "own", "mountPath": "/opt/rdma-streams/"}]);
                p["spec"]["volumes"] = json!([{"name": "own", "emptyDir": {}}]);
            }),
            plain(),
            Expect::Patch(|c| {
                assert!(has_warning(c.plan, "already mounts"));
                assert_eq!(
                    container(c.result, "iperf")["volumeMounts"]
                        .as_array()
                        .map(Vec::len),
                    Some(1)
                );
            }),
        ),
        case(
            "not opted in",
            fixture("not-opted-in"),
            plain(),
            Expect::Skip(SkipReason::NotOptedIn),
        ),
        case(
            "opted out in an opted-in namespace",
            fixture("opted-out"),
            enabled(),
            Expect::Skip(SkipReason::OptedOut),
        ),
        case(
            "annotation opt-out in an opted-in namespace",
            with(fixture("not-opted-in"), |p| {
                set_annotation(p, names::INJECT, Some("false"))
            }),
            enabled(),
            Expect::Skip(SkipReason::OptedOut),
        ),
        case(
            "label beats annotation",
            with(fixture("bare"), |p| {
                set_annotation(p, names::INJECT, Some("false"))
            }),
            plain(),
            Expect::Patch(|_| {}),
        ),
        case(
            "unreadable opt-in value",
            with(fixture("bare"), |p| {
                set_label(p, names::INJECT, Some("yes"))
            }),
            plain(),
            Expect::Deny(
                DenyReason::BadAnnotation,
                &["\"yes\"", "\"true\"", "\"false\""],
            ),
        ),
        case(
            "unknown profile",
            profile(fixture("bare"), "turbo"),
            plain(),
            Expect::Deny(
                DenyReason::UnknownProfile,
                &[
                    "\"turbo\"",
                    "default, degrade, hostpath, hostpath-only, image, net, no-ipc",
                ],
            ),
        ),
        case(
            "empty profile annotation",
            profile(fixture("bare"), " "),
            plain(),
            Expect::Deny(DenyReason::BadAnnotation, &["empty"]),
        ),
        case(
            "target list names a missing container",
            with(fixture("multi-container-targets"), |p| {
                set_annotation(p, names::CONTAINERS_ANNOTATION, Some("producer,ghost"))
            }),
            plain(),
            Expect::Deny(
                DenyReason::InvalidTarget,
                &["\"ghost\"", "producer, metrics, consumer"],
            ),
        ),
        case(
            "target list names an init container",
            with(fixture("multi-container-default"), |p| {
                set_annotation(p, names::CONTAINERS_ANNOTATION, Some("fetch-data"))
            }),
            ns("ml", &[]),
            Expect::Deny(DenyReason::InvalidTarget, &["init container"]),
        ),
        case(
            "empty target list",
            with(fixture("bare"), |p| {
                set_annotation(p, names::CONTAINERS_ANNOTATION, Some(" , "))
            }),
            plain(),
            Expect::Deny(DenyReason::BadAnnotation, &["rdma-streams.io/containers"]),
        ),
        case(
            "a container named like our init container",
            with(fixture("bare"), |p| {
                p["spec"]["containers"][0]["name"] = json!("rdma-streams-shim")
            }),
            plain(),
            Expect::Skip(SkipReason::NoTargetContainer),
        ),
        case(
            "a second container named like our init container",
            with(fixture("bare"), |p| {
                p["spec"]["containers"]
                    .as_array_mut()
                    .expect("containers")
                    .push(json!({"name": "rdma-streams-shim", "image": "x:1"}));
            }),
            plain(),
            Expect::Deny(DenyReason::Conflict, &["rename"]),
        ),
        case(
            "env is not a list",
            with(fixture("bare"), |p| {
                p["spec"]["containers"][0]["env"] = json!("A=1")
            }),
            plain(),
            Expect::Deny(
                DenyReason::MalformedPod,
                &["/spec/containers/0/env", "a list"],
            ),
        ),
        case(
            "a label value is not a string",
            with(fixture("bare"), |p| p["metadata"]["labels"]["n"] = json!(1)),
            plain(),
            Expect::Deny(DenyReason::MalformedPod, &["/metadata/labels/n"]),
        ),
        case(
            "a Deployment is not a pod",
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"labels": {"rdma-streams.io/inject": "true"}}, "spec": {}}),
            plain(),
            Expect::Skip(SkipReason::NotAPod),
        ),
        case(
            "a string is not a pod",
            json!("pod"),
            plain(),
            Expect::Skip(SkipReason::NotAPod),
        ),
    ];
    for case in &mut cases {
        if let Value::Object(_) = case.pod {
            continue;
        }
        case.schema_valid = false;
    }
    cases
}

/// Runs one case; returns the patched pod for cases that patch.
pub(super) fn run_case(case: &Case) -> Option<Value> {
    let config = config();
    let decision = run(&case.pod, &case.namespace, &config);
    match (&case.expect, decision) {
        (Expect::Patch(check), Decision::Patch(plan)) => {
            let result = invariants::check(&case.pod, &plan, &config);
            check(&Check {
                original: &case.pod,
                result: &result,
                plan: &plan,
            });
            reinvocation::check(&result, &case.namespace, &config);
            Some(result)
        }
        (
            Expect::Skip(reason),
            Decision::Skip {
                reason: got,
                message,
            },
        ) => {
            assert_eq!(*reason, got, "{}: {message}", case.name);
            assert!(!message.is_empty());
            None
        }
        (
            Expect::Deny(reason, needles),
            Decision::Deny {
                reason: got,
                message,
            },
        ) => {
            assert_eq!(*reason, got, "{}: {message}", case.name);
            for needle in *needles {
                assert!(
                    message.contains(needle),
                    "{}: {message:?} lacks {needle:?}",
                    case.name
                );
            }
            None
        }
        (_, other) => panic!("{}: unexpected decision {other:?}", case.name),
    }
}

#[test]
fn table() {
    let cases = cases();
    let mut names = std::collections::BTreeSet::new();
    for case in &cases {
        assert!(names.insert(case.name), "duplicate case name {}", case.name);
        run_case(case);
    }
}

#[test]
fn every_fixture_is_used() {
    let cases = cases();
    for fixture in super::support::FIXTURES {
        let pod: Value = serde_json::from_str(fixture.json).expect("fixture JSON");
        assert!(
            cases.iter().any(|c| c.pod == pod),
            "fixture {} is not used unchanged by any case",
            fixture.name
        );
    }
}

#[test]
fn plans_are_deterministic() {
    let config = config();
    let pod = fixture("multus-json");
    let first = expect_plan(run(&pod, &plain(), &config));
    let second = expect_plan(run(&pod, &plain(), &config));
    assert_eq!(first, second);
}

#[test]
fn hash_depends_on_profile_targets_and_degrade() {
    let config = config();
    let hash = |pod: &Value, namespace: &NamespaceFacts| {
        expect_plan(run(pod, namespace, &config)).status.hash
    };
    let bare = fixture("bare");
    let base = hash(&bare, &plain());
    assert_eq!(
        base,
        hash(&bare, &ns("other", &[])),
        "the namespace name is not hashed"
    );
    assert_ne!(base, hash(&profile(bare.clone(), "no-ipc"), &plain()));
    let degrade = profile(bare.clone(), "degrade");
    assert_ne!(
        hash(&degrade, &plain()),
        hash(&degrade, &baseline("team-a"))
    );
    let targets = fixture("multi-container-targets");
    let renamed = with(targets.clone(), |p| {
        set_annotation(p, names::CONTAINERS_ANNOTATION, Some("producer"))
    });
    assert_ne!(hash(&targets, &plain()), hash(&renamed, &plain()));
}

#[test]
fn a_status_from_another_profile_is_replanned() {
    let config = config();
    let injected = {
        let pod = fixture("bare");
        let plan = expect_plan(run(&pod, &plain(), &config));
        crate::core::apply(&pod, &plan.patch).expect("apply")
    };
    let switched = profile(injected, "no-ipc");
    let plan = expect_plan(run(&switched, &plain(), &config));
    let paths = op_paths(&plan);
    assert_eq!(
        paths,
        [
            "test /metadata/annotations/rdma-streams.io~1status",
            "add /metadata/annotations/rdma-streams.io~1status",
        ],
        "everything else is already there"
    );
    assert_eq!(plan.status.profile, "no-ipc");
}

#[test]
fn the_builtin_default_config_injects() {
    let config = crate::profile::Config::builtin_default();
    let pod = fixture("bare");
    let plan = expect_plan(run(&pod, &plain(), &config));
    let result = invariants::check(&pod, &plan, &config);
    assert_eq!(
        env_value(container(&result, "iperf"), "STREAMSHIM_MODE").map(|e| e["value"].clone()),
        Some(json!("proxy"))
    );
    reinvocation::check(&result, &plain(), &config);
}
