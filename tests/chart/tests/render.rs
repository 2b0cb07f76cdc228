//! `helm template` over every value set, with assertions on what the chart renders: security
//! contexts, selectors, webhook scoping, RBAC, mounts, certificate modes and the optional parts.

// An integration test: its helpers panic to fail the test, as its `#[test]` functions may.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rdma_streams_chart_tests::{
    NAMESPACE, RELEASE, Rendered, SYSTEM_NAMESPACES, all_containers, decode_base64, env_map,
    every_set, helm, ident, named, parse_peer_keys, render, render_error, repo_root, selects,
    value_set,
};
use rdma_streams_testkit::within;
use serde_json::{Map, Value, json};

const LIMIT: Duration = Duration::from_secs(240);

/// Renders `set` (with `extra` flags), or `None` when helm is missing and not required.
fn rendered(set: &str, extra: &[&str]) -> Option<Rendered> {
    let helm = helm()?;
    Some(render(&helm, value_set(set), extra))
}

fn pod_spec(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

fn labels(v: &Value) -> &Map<String, Value> {
    v.as_object().expect("labels map")
}

#[test]
fn default_install_renders_the_expected_objects() {
    within(LIMIT, || {
        let Some(r) = rendered("default", &[]) else {
            return;
        };
        let objects: BTreeSet<String> = r.docs.iter().map(ident).collect();
        let expected: BTreeSet<String> = [
            "ConfigMap/rdma-streams-device-plugin",
            "ConfigMap/rdma-streams-injector",
            "ServiceAccount/rdma-streams-device-plugin",
            "ServiceAccount/rdma-streams-injector",
            "ClusterRole/rdma-streams-injector",
            "ClusterRoleBinding/rdma-streams-injector",
            "Secret/rdma-streams-injector-tls",
            "Service/rdma-streams-injector",
            "DaemonSet/rdma-streams-device-plugin",
            "Deployment/rdma-streams-injector",
            "PodDisruptionBudget/rdma-streams-injector",
            "MutatingWebhookConfiguration/rdma-streams-injector",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(objects, expected);
    });
}

#[test]
fn every_container_is_hardened() {
    within(LIMIT, || {
        let Some(sets) = every_set() else { return };
        let gateway_caps = ["NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE", "IPC_LOCK"];
        for (set, r) in &sets {
            for w in r.workloads() {
                let spec = pod_spec(w);
                let pod_seccomp = &spec["securityContext"]["seccompProfile"]["type"];
                for c in all_containers(spec) {
                    let at = format!("{set}: {} container {}", ident(w), c["name"]);
                    let sc = &c["securityContext"];
                    assert!(sc.is_object(), "{at}: no securityContext");
                    assert_eq!(sc["readOnlyRootFilesystem"], true, "{at}");
                    if sc["privileged"] == true {
                        assert_eq!(
                            (*set, ident(w).as_str()),
                            ("everything", "DaemonSet/rdma-streams-device-plugin"),
                            "{at}: only the device plugin may run privileged, and only on request"
                        );
                        continue;
                    }
                    assert_eq!(sc["allowPrivilegeEscalation"], false, "{at}");
                    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"], "{at}");
                    let added = strings(&sc["capabilities"]["add"]);
                    if ident(w) == "DaemonSet/rdma-streams-gateway" {
                        assert_eq!(added, gateway_caps, "{at}");
                    } else {
                        assert!(added.is_empty(), "{at}: adds {added:?}");
                    }
                    assert!(
                        sc["seccompProfile"]["type"] == "RuntimeDefault"
                            || *pod_seccomp == "RuntimeDefault",
                        "{at}: no RuntimeDefault seccomp profile"
                    );
                }
                let host_ns = ["hostPID", "hostIPC"]
                    .iter()
                    .filter(|k| spec[**k] == true)
                    .count();
                if ident(w) != "DaemonSet/rdma-streams-gateway" {
                    assert_eq!(host_ns, 0, "{set}: {} shares host namespaces", ident(w));
                }
            }
        }
    });
}

#[test]
fn injector_is_non_root_highly_available_and_probed() {
    within(LIMIT, || {
        let Some(r) = rendered("default", &[]) else {
            return;
        };
        let d = r.get("Deployment", &named("injector"));
        assert_eq!(d["spec"]["replicas"], 2);
        let spec = pod_spec(d);
        assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
        assert_ne!(spec["securityContext"]["runAsUser"], 0);
        assert_eq!(spec["priorityClassName"], "system-cluster-critical");
        assert_eq!(spec["automountServiceAccountToken"], true);
        let pod_labels = labels(&d["spec"]["template"]["metadata"]["labels"]);

        let anti = &spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            [0]["podAffinityTerm"];
        assert_eq!(anti["topologyKey"], "kubernetes.io/hostname");
        assert!(selects(&anti["labelSelector"], pod_labels));

        let pdb = r.get("PodDisruptionBudget", &named("injector"));
        assert_eq!(pdb["spec"]["maxUnavailable"], 1);
        assert!(selects(&pdb["spec"]["selector"], pod_labels));

        let c = &spec["containers"][0];
        let env = env_map(c);
        let admin_port = env["RDMA_INJECTOR_ADMIN_LISTEN"]
            .rsplit(':')
            .next()
            .unwrap()
            .parse::<u64>()
            .unwrap();
        let port_of = |name: &str| {
            c["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == name)
                .map(|p| p["containerPort"].as_u64().unwrap())
                .unwrap_or_else(|| panic!("no port {name}"))
        };
        assert_eq!(port_of("admin"), admin_port);
        assert_eq!(
            env["RDMA_INJECTOR_LISTEN"],
            format!("0.0.0.0:{}", port_of("webhook"))
        );
        for (probe, path) in [
            ("readinessProbe", "/ready"),
            ("livenessProbe", "/live"),
            ("startupProbe", "/live"),
        ] {
            assert_eq!(c[probe]["httpGet"]["path"], path, "{probe}");
            assert_eq!(c[probe]["httpGet"]["port"], "admin", "{probe}");
        }
        // The TLS Secret is mounted where --tls-cert/--tls-key point.
        assert_eq!(env["RDMA_INJECTOR_TLS_CERT"], "/tls/tls.crt");
        assert_eq!(env["RDMA_INJECTOR_TLS_KEY"], "/tls/tls.key");
        let mount = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == "/tls")
            .expect("/tls mount");
        assert_eq!(mount["readOnly"], true);
        let volume = spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .expect("tls volume");
        assert_eq!(volume["secret"]["secretName"], named("injector-tls"));
        r.get("Secret", &named("injector-tls"));
        // Grace period covers the shutdown delay and the 15 s drain.
        let delay: u64 = env["RDMA_INJECTOR_SHUTDOWN_DELAY_MS"].parse().unwrap();
        let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap();
        assert!(grace * 1000 >= delay + 15_000);
    });
}

#[test]
fn selectors_match_their_own_pods_only() {
    within(LIMIT, || {
        let Some(sets) = every_set() else { return };
        for (set, r) in &sets {
            let workloads = r.workloads();
            for w in &workloads {
                let selector = &w["spec"]["selector"];
                for other in &workloads {
                    let pod_labels = labels(&other["spec"]["template"]["metadata"]["labels"]);
                    assert_eq!(
                        selects(selector, pod_labels),
                        ident(w) == ident(other),
                        "{set}: selector of {} against the pods of {}",
                        ident(w),
                        ident(other)
                    );
                }
            }
            let pods_of = |selector: &Value| -> Vec<String> {
                workloads
                    .iter()
                    .filter(|w| {
                        selects(
                            &json!({"matchLabels": selector}),
                            labels(&w["spec"]["template"]["metadata"]["labels"]),
                        )
                    })
                    .map(|w| ident(w))
                    .collect()
            };
            for svc in r.all("Service") {
                let owners = pods_of(&svc["spec"]["selector"]);
                assert_eq!(owners.len(), 1, "{set}: {} selects {owners:?}", ident(svc));
                let w = r
                    .workloads()
                    .into_iter()
                    .find(|w| ident(w) == owners[0])
                    .unwrap();
                for port in svc["spec"]["ports"].as_array().unwrap() {
                    let target = port["targetPort"].as_str().expect("named targetPort");
                    let exposed = all_containers(pod_spec(w)).iter().any(|c| {
                        c["ports"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|p| p["name"] == target)
                    });
                    assert!(exposed, "{set}: {} targets {target}", ident(svc));
                }
            }
            for pdb in r.all("PodDisruptionBudget") {
                let owners = pods_of(&pdb["spec"]["selector"]["matchLabels"]);
                assert_eq!(owners, ["Deployment/rdma-streams-injector"], "{set}");
            }
            for sm in r.all("ServiceMonitor") {
                let services: Vec<_> = r
                    .all("Service")
                    .into_iter()
                    .filter(|s| selects(&sm["spec"]["selector"], labels(&s["metadata"]["labels"])))
                    .collect();
                assert_eq!(
                    services.len(),
                    1,
                    "{set}: {} selects {services:?}",
                    ident(sm)
                );
                assert!(
                    services[0]["spec"]["ports"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|p| p["name"] == sm["spec"]["endpoints"][0]["port"]),
                    "{set}: {} scrapes a port its Service lacks",
                    ident(sm)
                );
            }
            for np in r.all("NetworkPolicy") {
                let owners = pods_of(&np["spec"]["podSelector"]["matchLabels"]);
                assert_eq!(owners.len(), 1, "{set}: {} selects {owners:?}", ident(np));
            }
        }
    });
}

/// The webhook entries that would be called for a pod, by their object and namespace selectors
/// (matchConditions are checked separately, they are CEL).
fn entries_for(
    mwc: &Value,
    namespace: &str,
    ns_labels: &[(&str, &str)],
    pod_labels: &[(&str, &str)],
) -> Vec<String> {
    let mut ns: Map<String, Value> = ns_labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    ns.insert("kubernetes.io/metadata.name".into(), json!(namespace));
    let pod: Map<String, Value> = pod_labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    mwc["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| selects(&w["namespaceSelector"], &ns) && selects(&w["objectSelector"], &pod))
        .map(|w| {
            w["name"]
                .as_str()
                .unwrap()
                .split('.')
                .next()
                .unwrap()
                .to_string()
        })
        .collect()
}

#[test]
fn webhook_is_scoped_to_opted_in_pods_and_safe() {
    within(LIMIT, || {
        let Some(sets) = every_set() else { return };
        for (set, r) in &sets {
            let mwc = r.get("MutatingWebhookConfiguration", &named("injector"));
            let svc = r.get("Service", &named("injector"));
            let svc_port = svc["spec"]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["targetPort"] == "webhook")
                .expect("webhook port");
            let mut names = Vec::new();
            for w in mwc["webhooks"].as_array().unwrap() {
                let at = format!("{set}: webhook {}", w["name"]);
                names.push(w["name"].as_str().unwrap().to_string());
                assert_eq!(w["failurePolicy"], "Fail", "{at}");
                assert_eq!(w["timeoutSeconds"], 5, "{at}");
                assert_eq!(w["sideEffects"], "None", "{at}");
                assert_eq!(w["reinvocationPolicy"], "IfNeeded", "{at}");
                assert_eq!(strings(&w["admissionReviewVersions"]), ["v1"], "{at}");
                assert_eq!(
                    w["rules"],
                    json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                            "resources": ["pods"], "scope": "Namespaced"}]),
                    "{at}"
                );
                let target = &w["clientConfig"]["service"];
                assert_eq!(target["name"], svc["metadata"]["name"], "{at}");
                assert_eq!(target["namespace"], NAMESPACE, "{at}");
                assert_eq!(target["path"], "/mutate", "{at}");
                assert_eq!(target["port"], svc_port["port"], "{at}");
                assert!(w["objectSelector"].is_object(), "{at}: no objectSelector");
                let excluded = w["namespaceSelector"]["matchExpressions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|e| e["key"] == "kubernetes.io/metadata.name")
                    .unwrap_or_else(|| panic!("{at}: no namespace exclusion"));
                assert_eq!(excluded["operator"], "NotIn", "{at}");
                for ns in SYSTEM_NAMESPACES.iter().chain([&NAMESPACE]) {
                    assert!(strings(&excluded["values"]).contains(ns), "{at}: {ns}");
                }
                for cond in w["matchConditions"].as_array().into_iter().flatten() {
                    let expr = cond["expression"].as_str().unwrap();
                    assert!(
                        expr.starts_with("has(object.metadata.annotations) && "),
                        "{at}: unguarded matchCondition {expr}"
                    );
                }
            }
            let mut expected = vec![
                "label.inject.rdma-streams.io",
                "namespace.inject.rdma-streams.io",
                "annotation.inject.rdma-streams.io",
            ];
            if r.find("DaemonSet", &named("gateway")).is_some() {
                expected.push("migration.inject.rdma-streams.io");
            }
            assert_eq!(names, expected, "{set}");
        }
    });
}

/// (case, namespace, namespace labels, pod labels, webhook entries expected)
type RoutingCase<'a> = (&'a str, &'a str, Labels<'a>, Labels<'a>, &'a [&'a str]);
type Labels<'a> = &'a [(&'a str, &'a str)];

#[test]
fn opt_in_forms_reach_exactly_one_webhook_entry() {
    within(LIMIT, || {
        let Some(r) = rendered("kubevirt", &[]) else {
            return;
        };
        let mwc = r.get("MutatingWebhookConfiguration", &named("injector"));
        let enabled = [("rdma-streams.io/inject", "enabled")];
        let launcher = ("kubevirt.io", "virt-launcher");
        let cases: &[RoutingCase<'_>] = &[
            (
                "pod label",
                "apps",
                &[],
                &[("rdma-streams.io/inject", "true")],
                &["label"],
            ),
            (
                "pod opt-out",
                "apps",
                &enabled,
                &[("rdma-streams.io/inject", "false")],
                &[],
            ),
            // A typo is sent, so the injector denies it with a message instead of silence.
            (
                "pod label typo",
                "apps",
                &[],
                &[("rdma-streams.io/inject", "yes")],
                &["label"],
            ),
            ("namespace label", "apps", &enabled, &[], &["namespace"]),
            (
                "namespace label, launcher",
                "apps",
                &enabled,
                &[launcher],
                &[],
            ),
            (
                "VM migration label",
                "vms",
                &enabled,
                &[launcher, ("rdma-streams.io/migration", "rdma")],
                &["migration"],
            ),
            // No label: only the annotation entry's selectors pass; its guarded CEL decides.
            ("no label", "apps", &[], &[], &["annotation"]),
            (
                "kube-system",
                "kube-system",
                &enabled,
                &[("rdma-streams.io/inject", "true")],
                &[],
            ),
            (
                "kube-node-lease",
                "kube-node-lease",
                &[],
                &[("rdma-streams.io/inject", "true")],
                &[],
            ),
            (
                "own namespace",
                NAMESPACE,
                &enabled,
                &[("rdma-streams.io/inject", "true")],
                &[],
            ),
        ];
        for (case, ns, ns_labels, pod_labels, expected) in cases {
            assert_eq!(
                entries_for(mwc, ns, ns_labels, pod_labels),
                *expected,
                "{case}"
            );
        }
        let annotation = mwc["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["name"] == "annotation.inject.rdma-streams.io")
            .unwrap();
        assert_eq!(
            annotation["matchConditions"][0]["expression"],
            "has(object.metadata.annotations) && \
             (('rdma-streams.io/inject' in object.metadata.annotations && \
             object.metadata.annotations['rdma-streams.io/inject'] != 'false') || \
             'rdma-streams.io/migration' in object.metadata.annotations)"
        );
    });
}

fn rules_of<'a>(r: &'a Rendered, kind: &str, name: &str) -> &'a Vec<Value> {
    r.get(kind, name)["rules"].as_array().expect("rules")
}

#[test]
fn rbac_is_least_privilege() {
    within(LIMIT, || {
        let Some(sets) = every_set() else { return };
        for (set, r) in &sets {
            let mut roles = r.all("ClusterRole");
            roles.extend(r.all("Role"));
            for role in roles {
                for rule in role["rules"].as_array().unwrap() {
                    let at = format!("{set}: {} rule {rule}", ident(role));
                    for key in ["verbs", "resources", "apiGroups", "resourceNames"] {
                        assert!(
                            !strings(&rule[key]).iter().any(|s| s.contains('*')),
                            "{at}: wildcard in {key}"
                        );
                    }
                    assert!(rule.get("nonResourceURLs").is_none(), "{at}");
                    let verbs = strings(&rule["verbs"]);
                    for forbidden in [
                        "escalate",
                        "bind",
                        "impersonate",
                        "delete",
                        "deletecollection",
                    ] {
                        assert!(!verbs.contains(&forbidden), "{at}: {forbidden}");
                    }
                    if strings(&rule["resources"]).contains(&"secrets") {
                        assert_eq!(
                            *set, "injector-certs",
                            "{at}: secrets only for injector certs"
                        );
                        assert_eq!(role["kind"], "Role", "{at}: secrets only in our namespace");
                        if verbs != ["create"] {
                            // list and watch too, but only of the CA Secret (by name): the
                            // injector follows it (CA rotation without a restart).
                            assert_eq!(verbs, ["get", "list", "watch"], "{at}");
                            assert_eq!(
                                strings(&rule["resourceNames"]),
                                [named("injector-ca").as_str()],
                                "{at}"
                            );
                        }
                    }
                }
            }
            // Every binding names a rendered role and the rendered service account.
            let mut bindings = r.all("ClusterRoleBinding");
            bindings.extend(r.all("RoleBinding"));
            for b in bindings {
                let role_kind = b["roleRef"]["kind"].as_str().unwrap();
                r.get(role_kind, b["roleRef"]["name"].as_str().unwrap());
                for s in b["subjects"].as_array().unwrap() {
                    assert_eq!(s["kind"], "ServiceAccount", "{set}: {}", ident(b));
                    assert_eq!(s["namespace"], NAMESPACE, "{set}: {}", ident(b));
                    let sa = s["name"].as_str().unwrap();
                    r.get("ServiceAccount", sa);
                    assert_ne!(
                        sa,
                        named("device-plugin"),
                        "{set}: the device plugin needs no RBAC"
                    );
                }
            }
            let injector = r.find("ClusterRole", &named("injector"));
            match *set {
                "no-cluster-access" => {
                    assert!(injector.is_none(), "{set}: RBAC without cluster access");
                    let d = r.get("Deployment", &named("injector"));
                    assert_eq!(pod_spec(d)["automountServiceAccountToken"], false);
                }
                "injector-certs" => {
                    assert_eq!(
                        *rules_of(r, "ClusterRole", &named("injector")),
                        vec![
                            json!({"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}),
                            json!({"apiGroups": ["admissionregistration.k8s.io"],
                                   "resources": ["mutatingwebhookconfigurations"],
                                   "resourceNames": [named("injector")],
                                   "verbs": ["get", "list", "watch", "patch"]}),
                        ]
                    );
                    assert_eq!(
                        *rules_of(r, "Role", &named("injector-ca")),
                        vec![
                            json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}),
                            json!({"apiGroups": [""], "resources": ["secrets"],
                                   "resourceNames": [named("injector-ca")], "verbs": ["get", "list", "watch"]}),
                        ]
                    );
                }
                _ => {
                    assert_eq!(
                        *rules_of(r, "ClusterRole", &named("injector")),
                        vec![
                            json!({"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]})
                        ],
                        "{set}"
                    );
                    assert!(r.all("Role").is_empty(), "{set}");
                }
            }
            if r.find("DaemonSet", &named("gateway")).is_some() {
                assert_eq!(
                    *rules_of(r, "ClusterRole", &named("gateway")),
                    vec![
                        json!({"apiGroups": ["kubevirt.io"], "resources": ["virtualmachineinstances"],
                               "verbs": ["list", "watch"]}),
                        json!({"apiGroups": [""], "resources": ["nodes"],
                               "verbs": ["list", "watch", "patch"]}),
                    ],
                    "{set}"
                );
            }
        }
    });
}

#[test]
fn nothing_targets_system_namespaces() {
    within(LIMIT, || {
        let Some(sets) = every_set() else { return };
        let cluster_scoped = [
            "Namespace",
            "ClusterRole",
            "ClusterRoleBinding",
            "MutatingWebhookConfiguration",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ];
        for (set, r) in &sets {
            for doc in &r.docs {
                let kind = doc["kind"].as_str().unwrap();
                let ns = &doc["metadata"]["namespace"];
                if cluster_scoped.contains(&kind) {
                    assert!(ns.is_null(), "{set}: {} has a namespace", ident(doc));
                    if kind == "Namespace" {
                        assert_eq!(doc["metadata"]["name"], NAMESPACE, "{set}");
                    }
                } else {
                    assert_eq!(ns, NAMESPACE, "{set}: {}", ident(doc));
                }
            }
            let text = &r.text;
            for sys in SYSTEM_NAMESPACES {
                // System namespaces appear only in the webhook's exclusion lists.
                for (i, line) in text.lines().enumerate() {
                    if line.contains(sys) {
                        assert_eq!(
                            line.trim(),
                            format!("- {sys}"),
                            "{set}: line {} mentions {sys}: {line}",
                            i + 1
                        );
                    }
                }
            }
        }
    });
}

fn host_paths(spec: &Value) -> BTreeMap<String, String> {
    spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let path = v["hostPath"]["path"].as_str()?;
            Some((v["name"].as_str().unwrap().to_string(), path.to_string()))
        })
        .collect()
}

fn mounts(c: &Value) -> BTreeMap<String, (String, bool)> {
    c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["name"].as_str().unwrap().to_string(),
                (
                    m["mountPath"].as_str().unwrap().to_string(),
                    m["readOnly"] == true,
                ),
            )
        })
        .collect()
}

#[test]
fn device_plugin_has_minimal_host_access() {
    within(LIMIT, || {
        let Some(helm) = helm() else { return };
        let default = render(&helm, value_set("default"), &[]);
        let ds = default.get("DaemonSet", &named("device-plugin"));
        let spec = pod_spec(ds);
        assert_eq!(spec["automountServiceAccountToken"], false);
        assert!(spec["hostNetwork"].is_null() && spec["hostPID"].is_null());
        assert_eq!(spec["priorityClassName"], "system-node-critical");
        assert_eq!(
            host_paths(spec),
            BTreeMap::from([
                (
                    "device-plugins".into(),
                    "/var/lib/kubelet/device-plugins".into()
                ),
                ("dev-infiniband".into(), "/dev/infiniband".into()),
                ("sys".into(), "/sys".into()),
            ])
        );
        let c = &spec["containers"][0];
        let m = mounts(c);
        assert_eq!(
            m["device-plugins"],
            ("/var/lib/kubelet/device-plugins".into(), false)
        );
        assert_eq!(m["dev-infiniband"], ("/dev/infiniband".into(), true));
        assert_eq!(m["sys"], ("/sys".into(), true));
        assert_eq!(m["config"], ("/etc/rdma-device-plugin".into(), true));
        let env = env_map(c);
        assert_eq!(env["RDMA_DP_CONFIG"], "/etc/rdma-device-plugin/config.yaml");
        assert_eq!(env["RDMA_DP_KUBELET_ROOT_DIR"], "/var/lib/kubelet");
        assert_eq!(env["RDMA_DP_REGISTRATION"], "kubelet-sock");
        assert_eq!(env["RDMA_DP_CDI"], "false");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/ready");
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/live");
        assert_ne!(c["securityContext"]["privileged"], true);

        let cdi = render(&helm, value_set("cdi"), &[]);
        let spec = pod_spec(cdi.get("DaemonSet", &named("device-plugin")));
        assert_eq!(host_paths(spec)["cdi"], "/var/run/cdi");
        let c = &spec["containers"][0];
        assert_eq!(mounts(c)["cdi"], ("/var/run/cdi".into(), false));
        assert_eq!(env_map(c)["RDMA_DP_CDI"], "true");
        assert_eq!(env_map(c)["RDMA_DP_CDI_DIR"], "/var/run/cdi");

        // plugin-watcher on k0s: only plugins_registry, under the custom kubelet root.
        let all = render(&helm, value_set("everything"), &[]);
        let spec = pod_spec(all.get("DaemonSet", &named("device-plugin")));
        assert_eq!(
            host_paths(spec)["plugins-registry"],
            "/var/lib/k0s/kubelet/plugins_registry"
        );
        assert!(!host_paths(spec).contains_key("device-plugins"));
        let c = &spec["containers"][0];
        assert_eq!(
            mounts(c)["plugins-registry"].0,
            "/var/lib/k0s/kubelet/plugins_registry"
        );
        assert_eq!(
            env_map(c)["RDMA_DP_KUBELET_ROOT_DIR"],
            "/var/lib/k0s/kubelet"
        );
        assert_eq!(env_map(c)["RDMA_DP_REGISTRATION"], "plugin-watcher");
        assert_eq!(
            c["image"],
            "registry.example.com/rdma-streams/rdma-device-plugin:0.1.0"
        );
        assert_eq!(spec["imagePullSecrets"], json!([{"name": "regcred"}]));
    });
}

#[test]
fn helm_certificates_verify_for_the_service_name() {
    within(LIMIT, || {
        let Some(r) = rendered("default", &[]) else {
            return;
        };
        let secret = r.get("Secret", &named("injector-tls"));
        assert_eq!(secret["type"], "kubernetes.io/tls");
        let data = |k: &str| {
            secret["data"][k]
                .as_str()
                .unwrap_or_else(|| panic!("no {k}"))
        };
        let mwc = r.get("MutatingWebhookConfiguration", &named("injector"));
        for w in mwc["webhooks"].as_array().unwrap() {
            assert_eq!(
                w["clientConfig"]["caBundle"],
                data("ca.crt"),
                "{}",
                w["name"]
            );
        }
        let dns = format!("{}.{NAMESPACE}.svc", named("injector"));
        tls::verify(data("ca.crt"), data("tls.crt"), data("tls.key"), &dns);
    });
}

/// Checks a serving certificate the way the API server does: chain to the caBundle, name match.
mod tls {
    use std::sync::Arc;

    use rustls::RootCertStore;
    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

    fn pem(b64: &str) -> Vec<u8> {
        super::decode_base64(b64).expect("standard base64")
    }

    fn certs(b64: &str) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(&pem(b64))
            .collect::<Result<_, _>>()
            .expect("PEM certificates")
    }

    pub fn verify(ca: &str, crt: &str, key: &str, dns: &str) {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        for c in certs(ca) {
            roots.add(c).expect("CA certificate");
        }
        let verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .expect("verifier");
        let chain = certs(crt);
        let name = ServerName::try_from(dns.to_string()).expect("server name");
        verifier
            .verify_server_cert(&chain[0], &chain[1..], &name, &[], UnixTime::now())
            .unwrap_or_else(|e| panic!("certificate does not verify for {dns}: {e}"));
        let key = PrivateKeyDer::from_pem_slice(&pem(key)).expect("a PEM key");
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocols")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("certificate and key match");
    }
}

#[test]
fn cert_manager_mode_issues_from_a_ca_issuer_and_injects_the_ca() {
    within(LIMIT, || {
        let Some(r) = rendered("cert-manager", &[]) else {
            return;
        };
        assert!(r.find("Secret", &named("injector-tls")).is_none());
        let mwc = r.get("MutatingWebhookConfiguration", &named("injector"));
        let cert = r.get("Certificate", &named("injector-tls"));
        assert_eq!(
            mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            format!("{NAMESPACE}/{}", named("injector-tls"))
        );
        for w in mwc["webhooks"].as_array().unwrap() {
            assert!(w["clientConfig"].get("caBundle").is_none(), "{}", w["name"]);
        }
        let dns = strings(&cert["spec"]["dnsNames"]);
        assert!(dns.contains(&format!("{}.{NAMESPACE}.svc", named("injector")).as_str()));
        // Leaf from a CA Issuer whose secret is the long-lived self-signed root.
        let issuer = r.get(
            "Issuer",
            cert["spec"]["issuerRef"]["name"].as_str().unwrap(),
        );
        let root = r
            .all("Certificate")
            .into_iter()
            .find(|c| c["spec"]["isCA"] == true)
            .expect("root certificate");
        assert_eq!(
            issuer["spec"]["ca"]["secretName"],
            root["spec"]["secretName"]
        );
        assert!(
            r.get(
                "Issuer",
                root["spec"]["issuerRef"]["name"].as_str().unwrap()
            )["spec"]["selfSigned"]
                .is_object()
        );
        let d = r.get("Deployment", &named("injector"));
        let volume = pod_spec(d)["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "tls")
            .unwrap();
        assert_eq!(volume["secret"]["secretName"], cert["spec"]["secretName"]);
        assert_eq!(
            env_map(&pod_spec(d)["containers"][0])["RDMA_INJECTOR_CERT_MODE"],
            "external"
        );
    });
}

#[test]
fn injector_cert_mode_renders_no_certificate() {
    within(LIMIT, || {
        let Some(r) = rendered("injector-certs", &[]) else {
            return;
        };
        assert!(r.all("Secret").is_empty());
        assert!(!r.text.contains("BEGIN CERTIFICATE") && !r.text.contains("LS0tLS1CRUdJTi"));
        let mwc = r.get("MutatingWebhookConfiguration", &named("injector"));
        for w in mwc["webhooks"].as_array().unwrap() {
            assert!(w["clientConfig"].get("caBundle").is_none());
        }
        let d = r.get("Deployment", &named("injector"));
        let c = &pod_spec(d)["containers"][0];
        let env = env_map(c);
        assert_eq!(env["RDMA_INJECTOR_CERT_MODE"], "self-managed");
        assert_eq!(env["RDMA_INJECTOR_CLUSTER_ACCESS"], "on");
        assert_eq!(env["RDMA_INJECTOR_SERVICE"], named("injector"));
        assert_eq!(
            env["RDMA_INJECTOR_SERVICE"],
            r.get("Service", &named("injector"))["metadata"]["name"]
                .as_str()
                .unwrap()
        );
        assert_eq!(
            env["RDMA_INJECTOR_WEBHOOK_CONFIG"],
            mwc["metadata"]["name"].as_str().unwrap()
        );
        let tls = pod_spec(d)["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "tls")
            .unwrap();
        assert!(
            tls["emptyDir"].is_object(),
            "the injector writes its certificate"
        );
        assert_eq!(mounts(c)["tls"], ("/tls".into(), false));
    });
}

#[test]
fn rendering_is_deterministic_except_helm_certificates() {
    within(LIMIT, || {
        let Some(helm) = helm() else { return };
        // Peer keys from the admin's Secret, as manifests/ renders them: the chart's own Secret
        // gets a new key on every `helm template` (checked below).
        let peer_keys = "gateway.peerAuth.existingSecret=gw-keys";
        let kubevirt = ["--set", "injector.certs.mode=injector", "--set", peer_keys];
        let everything = ["--set", peer_keys];
        for (set, extra) in [
            ("injector-certs", &[][..]),
            ("cert-manager", &[][..]),
            ("kubevirt", &kubevirt[..]),
            ("everything", &everything[..]),
        ] {
            let a = render(&helm, value_set(set), extra);
            let b = render(&helm, value_set(set), extra);
            assert!(a.text == b.text, "{set} renders differently each time");
        }
        // Helm mode cannot look up the Secret in `helm template`: a new pair each render. This
        // is why manifests/ is rendered in injector mode.
        let a = render(&helm, value_set("default"), &[]);
        let b = render(&helm, value_set("default"), &[]);
        assert!(
            a.text != b.text,
            "helm mode rendered the same certificate twice"
        );
        let key =
            |r: &Rendered| r.get("Secret", &named("gateway-peer-keys"))["data"]["keys"].clone();
        let a = render(&helm, value_set("kubevirt"), &kubevirt[..2]);
        let b = render(&helm, value_set("kubevirt"), &kubevirt[..2]);
        assert_ne!(
            key(&a),
            key(&b),
            "a new peer key each render without a cluster"
        );
        assert_eq!(
            a.text.replace(key(&a).as_str().unwrap(), ""),
            b.text.replace(key(&b).as_str().unwrap(), ""),
            "and nothing else differs"
        );
    });
}

#[test]
fn kubevirt_gateway_is_a_documented_host_agent() {
    within(LIMIT, || {
        let Some(r) = rendered("kubevirt", &[]) else {
            return;
        };
        let ds = r.get("DaemonSet", &named("gateway"));
        let spec = pod_spec(ds);
        assert_eq!(spec["hostNetwork"], true);
        assert_eq!(spec["hostPID"], true);
        assert_eq!(spec["dnsPolicy"], "ClusterFirstWithHostNet");
        assert_eq!(
            spec["nodeSelector"],
            json!({"kubevirt.io/schedulable": "true"})
        );
        assert!(
            host_paths(spec).is_empty(),
            "RDMA devices come from the device plugin"
        );
        let c = &spec["containers"][0];
        assert_ne!(c["securityContext"]["privileged"], true);
        assert_eq!(c["resources"]["limits"]["rdma-streams.io/hca"], "1");
        assert_eq!(c["resources"]["requests"]["rdma-streams.io/hca"], "1");
        let env = env_map(c);
        assert_eq!(env["RDMA_GW_NODE_NAME"], "<valueFrom>");
        assert_eq!(env["RDMA_GW_PROVIDER"], "librdmacm.so.1");
        let doc = r
            .text
            .split("---")
            .find(|d| d.contains("kind: DaemonSet") && d.contains("name: rdma-streams-gateway"))
            .unwrap();
        for why in [
            "hostNetwork",
            "hostPID",
            "capabilities",
            "RDMA",
            "peer keys",
        ] {
            assert!(doc.contains(&format!("#   {why}")), "undocumented {why}");
        }
        assert!(r.find("DaemonSet", &named("shim-installer")).is_none());
        // Without KubeVirt there is no gateway at all.
        let default = rendered("default", &[]).unwrap();
        assert!(default.find("DaemonSet", &named("gateway")).is_none());
        assert!(default.find("ClusterRole", &named("gateway")).is_none());
    });
}

#[test]
fn gateway_node_hooks_mount_only_their_socket_dir() {
    within(LIMIT, || {
        let Some(r) = rendered(
            "kubevirt",
            &[
                "--set",
                "gateway.nodeHooks.enabled=true",
                "--set",
                "gateway.nodeHooks.socketDir=/var/run/kubevirt/plugins/gw/",
            ],
        ) else {
            return;
        };
        let spec = pod_spec(r.get("DaemonSet", &named("gateway")));
        let dir = "/var/run/kubevirt/plugins/gw";
        assert_eq!(
            host_paths(spec),
            BTreeMap::from([("node-hooks".to_string(), dir.to_string())]),
            "the socket directory and nothing else"
        );
        let volume = spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "node-hooks")
            .unwrap();
        assert_eq!(volume["hostPath"]["type"], "DirectoryOrCreate");
        let c = &spec["containers"][0];
        assert_eq!(
            mounts(c)["node-hooks"],
            (dir.to_string(), false),
            "mounted where virt-handler sees it"
        );
        assert_eq!(
            env_map(c)["RDMA_GW_NODE_HOOKS_SOCKET"],
            format!("{dir}/node.sock")
        );
        // Off by default: no socket, no mount.
        let off = rendered("kubevirt", &[]).unwrap();
        let spec = pod_spec(off.get("DaemonSet", &named("gateway")));
        assert!(host_paths(spec).is_empty(), "{spec}");
        assert!(!mounts(&spec["containers"][0]).contains_key("node-hooks"));
        assert!(!env_map(&spec["containers"][0]).contains_key("RDMA_GW_NODE_HOOKS_SOCKET"));
    });
}

#[test]
fn host_path_delivery_installs_the_bundle_and_the_policy() {
    within(LIMIT, || {
        let Some(r) = rendered("host-path", &[]) else {
            return;
        };
        let profiles: Value =
            rdma_streams_yaml::from_str(r.configmap_data(&named("injector"), "profiles.yaml"))
                .unwrap();
        let shim = &profiles["profiles"]["default"]["shim"];
        assert_eq!(shim["delivery"], "host-path");
        assert_eq!(shim["hostPath"], "/opt/rdma-streams/shim/0.1.0");
        assert_eq!(
            profiles["allowedHostPathRoots"],
            json!(["/opt/rdma-streams", "/var/lib/rdma-streams"])
        );
        assert_eq!(
            profiles["profiles"]["default"]["env"]["STREAMSHIM_POLICY"],
            "/opt/rdma-streams/streamshim-policy.yaml"
        );
        let ds = r.get("DaemonSet", &named("shim-installer"));
        let spec = pod_spec(ds);
        assert_eq!(spec["automountServiceAccountToken"], false);
        assert_eq!(
            spec["volumes"][0]["hostPath"],
            json!({"path": "/opt/rdma-streams/shim/0.1.0", "type": "DirectoryOrCreate"})
        );
        assert_eq!(
            spec["volumes"][1]["configMap"]["name"],
            named("shim-policy")
        );
        let script = spec["initContainers"][0]["command"][2].as_str().unwrap();
        assert!(script.contains("streamshim-policy.yaml"));
        assert!(
            script.contains(".rdma-streams-installed"),
            "never rewrites a bundle"
        );
        assert!(
            r.configmap_data(&named("shim-policy"), "policy.yaml")
                .contains("10.0.0.0/8")
        );
    });
}

#[test]
fn image_volume_and_extra_profiles_reach_the_injector_config() {
    within(LIMIT, || {
        let Some(r) = rendered("image-volume", &[]) else {
            return;
        };
        let profiles: Value =
            rdma_streams_yaml::from_str(r.configmap_data(&named("injector"), "profiles.yaml"))
                .unwrap();
        let default = &profiles["profiles"]["default"];
        assert_eq!(default["shim"]["delivery"], "image-volume");
        assert_eq!(default["podSecurity"], "degrade");
        assert_eq!(
            default["network"],
            json!({"name": "rdma-net", "namespace": "infra", "interface": "net1"})
        );
        assert_eq!(profiles["profiles"]["no-ipc"]["ipcLock"], false);
        assert!(r.find("DaemonSet", &named("shim-installer")).is_none());
    });
}

#[test]
fn optional_monitoring_and_network_policies() {
    within(LIMIT, || {
        let Some(helm) = helm() else { return };
        let r = render(&helm, value_set("everything"), &[]);
        let monitors: BTreeSet<String> = r.all("ServiceMonitor").into_iter().map(ident).collect();
        assert_eq!(
            monitors,
            ["device-plugin", "gateway", "injector"]
                .iter()
                .map(|c| format!("ServiceMonitor/{}", named(c)))
                .collect()
        );
        let np = r.get("NetworkPolicy", &named("injector"));
        let ports: Vec<u64> = np["spec"]["ingress"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["ports"][0]["port"].as_u64().unwrap())
            .collect();
        assert_eq!(ports, [10443, 10080]);
        assert_eq!(
            np["spec"]["egress"][0]["to"],
            json!([{"ipBlock": {"cidr": "10.96.0.1/32"}}, {"ipBlock": {"cidr": "192.168.0.0/24"}}])
        );
        let dp = r.get("NetworkPolicy", &named("device-plugin"));
        assert_eq!(
            dp["spec"]["egress"],
            json!([]),
            "the device plugin calls nothing"
        );
        assert_eq!(
            r.get("Namespace", NAMESPACE)["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
            "privileged"
        );

        let rule = r.get("PrometheusRule", RELEASE);
        let groups: Vec<&str> = rule["spec"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            groups,
            [
                "rdma-streams.device-plugin",
                "rdma-streams.injector",
                "rdma-streams.gateway"
            ]
        );
        let alerts = checked_alerts(rule);
        assert!(alerts.len() >= 9, "{alerts:?}");
        assert!(exported("rdma_dp_devices") && !exported("rdma_dp_no_such_thing_total"));
        assert!(
            !alerts.contains(&"RdmaInjectorCaExpiresSoon".to_owned()),
            "cert-manager mode"
        );
        // The injector's own CA mode adds the CA expiry alert.
        let own_ca = render(
            &helm,
            value_set("injector-certs"),
            &[
                "--set",
                "metrics.prometheusRule.enabled=true",
                "--set",
                "metrics.prometheusRule.alertLabels.team=platform",
            ],
        );
        let alerts = checked_alerts(own_ca.get("PrometheusRule", RELEASE));
        assert!(
            alerts.contains(&"RdmaInjectorCaExpiresSoon".to_owned()),
            "{alerts:?}"
        );

        let off = render(&helm, value_set("no-cluster-access"), &[]);
        let np = off.get("NetworkPolicy", &named("injector"));
        assert_eq!(np["spec"]["egress"], json!([]), "no API server, no egress");
        assert!(off.all("ServiceMonitor").is_empty());

        let default = render(&helm, value_set("default"), &[]);
        assert!(default.all("NetworkPolicy").is_empty());
        assert!(default.all("ServiceMonitor").is_empty());
        assert!(default.all("PrometheusRule").is_empty());
    });
}

/// The alert names of a PrometheusRule, after checking each alert: severity, the extra label
/// `team`, a summary, metrics that a component registers, Prometheus templates intact.
fn checked_alerts(rule: &Value) -> Vec<String> {
    let mut names = Vec::new();
    for alert in rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
    {
        let name = alert["alert"].as_str().unwrap();
        assert!(alert["labels"]["severity"].is_string(), "{name}");
        assert_eq!(alert["labels"]["team"], "platform", "{name}");
        assert!(alert["annotations"]["summary"].is_string(), "{name}");
        let expr = alert["expr"].as_str().unwrap();
        for metric in metric_names(expr) {
            assert!(
                exported(&metric),
                "{name}: {metric} is not a metric any component exports"
            );
        }
        let description = alert["annotations"]["description"].as_str().unwrap();
        assert!(!description.contains("{{`"), "{name}: {description}");
        names.push(name.to_owned());
    }
    names
}

/// The `rdma_*` metric names an alert expression uses.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("rdma_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// True if `metric` (as Prometheus sees it: prefix, name, unit and `_total` suffixes) is
/// registered by the component its prefix names, read from that component's metrics sources.
fn exported(metric: &str) -> bool {
    let sources: &[(&str, &[&str])] = &[
        (
            "rdma_dp_",
            &[
                "device-plugin/src/metrics.rs",
                "common/src/reload_metrics.rs",
            ],
        ),
        (
            "rdma_stream_injector_",
            &[
                "injector/src/server/metrics.rs",
                "injector/src/certs/metrics.rs",
                "common/src/reload_metrics.rs",
            ],
        ),
        ("rdma_gw_", &["gateway/src/metrics.rs"]),
    ];
    let Some((prefix, files)) = sources.iter().find(|(p, _)| metric.starts_with(p)) else {
        return false;
    };
    let name = &metric[prefix.len()..];
    let base = name
        .strip_suffix("_total")
        .or_else(|| name.strip_suffix("_seconds"))
        .unwrap_or(name);
    files.iter().any(|file| {
        let text = std::fs::read_to_string(repo_root().join(file)).unwrap();
        text.contains(&format!("\"{base}\"")) || text.contains(&format!("_{base}\""))
    })
}

#[test]
fn cert_manager_can_use_an_existing_issuer() {
    within(LIMIT, || {
        let issuer = r#"injector.certs.certManager.issuerRef={"name":"corp-ca","kind":"ClusterIssuer","group":"cert-manager.io"}"#;
        let Some(r) = rendered("cert-manager", &["--set-json", issuer]) else {
            return;
        };
        assert!(
            r.all("Issuer").is_empty(),
            "no chart-owned issuers with issuerRef"
        );
        let certs = r.all("Certificate");
        assert_eq!(certs.len(), 1);
        assert_eq!(
            certs[0]["spec"]["issuerRef"],
            json!({"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"})
        );
    });
}

#[test]
fn availability_knobs_render_as_asked() {
    within(LIMIT, || {
        let Some(helm) = helm() else { return };
        let r = render(&helm, value_set("everything"), &[]);
        let spec = pod_spec(r.get("Deployment", &named("injector")));
        let hard = &spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            [0];
        assert_eq!(hard["topologyKey"], "kubernetes.io/hostname");
        assert_eq!(spec["hostNetwork"], true);
        assert_eq!(spec["dnsPolicy"], "ClusterFirstWithHostNet");

        let r = render(
            &helm,
            value_set("default"),
            &[
                "--set",
                "injector.antiAffinity=none",
                "--set",
                "injector.podDisruptionBudget.enabled=false",
                "--set",
                "webhook.annotationOptIn=false",
                "--set",
                "injector.replicas=3",
            ],
        );
        let d = r.get("Deployment", &named("injector"));
        assert_eq!(d["spec"]["replicas"], 3);
        assert!(pod_spec(d)["affinity"].is_null());
        assert!(r.all("PodDisruptionBudget").is_empty());
        let names: Vec<&str> =
            r.get("MutatingWebhookConfiguration", &named("injector"))["webhooks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w["name"].as_str().unwrap())
                .collect();
        assert_eq!(
            names,
            [
                "label.inject.rdma-streams.io",
                "namespace.inject.rdma-streams.io"
            ]
        );
    });
}

#[test]
fn the_bundled_provider_is_used_unless_turned_off() {
    within(LIMIT, || {
        let Some(r) = rendered("default", &[]) else {
            return;
        };
        let profiles: Value =
            rdma_streams_yaml::from_str(r.configmap_data(&named("injector"), "profiles.yaml"))
                .unwrap();
        let env = &profiles["profiles"]["default"]["env"];
        assert_eq!(
            env["STREAMSHIM_PROVIDER"],
            "/opt/rdma-streams/lib/librdmacm.so.1"
        );
        let drivers = env["RDMAV_DRIVERS"].as_str().unwrap();
        assert!(
            drivers
                .split(':')
                .all(|d| d.starts_with("/opt/rdma-streams/lib/libibverbs/lib")),
            "{drivers}"
        );
        assert!(
            drivers.contains("/libmlx5") && drivers.contains("/librxe"),
            "{drivers}"
        );
        let Some(off) = rendered("default", &["--set", "shim.bundledProvider=false"]) else {
            return;
        };
        let profiles: Value =
            rdma_streams_yaml::from_str(off.configmap_data(&named("injector"), "profiles.yaml"))
                .unwrap();
        let env = &profiles["profiles"]["default"]["env"];
        assert!(env.get("STREAMSHIM_PROVIDER").is_none(), "{env}");
        assert!(env.get("RDMAV_DRIVERS").is_none(), "{env}");
    });
}

#[test]
fn service_cidrs_reach_the_shim_env_unless_env_sets_them() {
    within(LIMIT, || {
        let env_of = |args: &[&str]| {
            let r = rendered("default", args)?;
            let profiles: Value =
                rdma_streams_yaml::from_str(r.configmap_data(&named("injector"), "profiles.yaml"))
                    .unwrap();
            Some(profiles["profiles"]["default"]["env"].clone())
        };
        let Some(unset) = env_of(&[]) else { return };
        assert!(unset.get("STREAMSHIM_SERVICE_CIDRS").is_none(), "{unset}");
        let set = env_of(&[
            "--set-json",
            r#"shim.serviceCIDRs=["10.96.0.0/12","fd00:10:96::/112"]"#,
        ])
        .unwrap();
        assert_eq!(
            set["STREAMSHIM_SERVICE_CIDRS"],
            "10.96.0.0/12,fd00:10:96::/112"
        );
        let own = env_of(&[
            "--set-json",
            r#"shim.serviceCIDRs=["10.96.0.0/12"]"#,
            "--set",
            "shim.env.STREAMSHIM_SERVICE_CIDRS=172.30.0.0/16",
        ])
        .unwrap();
        assert_eq!(own["STREAMSHIM_SERVICE_CIDRS"], "172.30.0.0/16");
        let refused = render_error(
            &helm().unwrap(),
            value_set("default"),
            &["--set-json", r#"shim.serviceCIDRs=["10.96.0.0"]"#],
        );
        assert!(refused.contains("serviceCIDRs"), "{refused}");
    });
}

#[test]
fn gateway_reads_its_peer_keys_from_a_read_only_secret() {
    within(LIMIT, || {
        let Some(helm) = helm() else { return };
        let dir = "/etc/rdma-streams/gateway/peer-keys";
        let check = |r: &Rendered, secret: &str| {
            let spec = pod_spec(r.get("DaemonSet", &named("gateway")));
            let c = &spec["containers"][0];
            assert_eq!(env_map(c)["RDMA_GW_PEER_KEYS_FILE"], format!("{dir}/keys"));
            assert_eq!(mounts(c)["peer-keys"], (dir.to_string(), true));
            let mount = c["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["name"] == "peer-keys")
                .unwrap();
            assert!(
                mount.get("subPath").is_none(),
                "a subPath mount never sees the Secret change"
            );
            let volume = spec["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == "peer-keys")
                .unwrap();
            assert_eq!(
                volume["secret"],
                json!({"secretName": secret, "defaultMode": 0o400})
            );
        };
        // The chart's own Secret: one fresh key, valid by the keys file contract.
        let r = render(&helm, value_set("kubevirt"), &[]);
        check(&r, &named("gateway-peer-keys"));
        let secret = r.get("Secret", &named("gateway-peer-keys"));
        assert_eq!(secret["type"], "Opaque");
        let file = decode_base64(secret["data"]["keys"].as_str().unwrap()).unwrap();
        let keys = parse_peer_keys(std::str::from_utf8(&file).unwrap()).unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].len(), 32);

        // The admin's own Secret: referenced, never rendered.
        let r = render(
            &helm,
            value_set("kubevirt"),
            &["--set", "gateway.peerAuth.existingSecret=corp-gw-keys"],
        );
        check(&r, "corp-gw-keys");
        assert!(
            r.all("Secret")
                .iter()
                .all(|s| s["metadata"]["name"] != "corp-gw-keys")
        );
        assert!(r.find("Secret", &named("gateway-peer-keys")).is_none());

        // manifests/: a Secret the admin creates under the chart's default name.
        let text =
            std::fs::read_to_string(repo_root().join("manifests/rdma-streams-kubevirt.yaml"))
                .unwrap();
        let m = Rendered::parse(&text).unwrap();
        check(&m, &named("gateway-peer-keys"));
        assert!(
            m.find("Secret", &named("gateway-peer-keys")).is_none(),
            "no key in a checked-in file"
        );
    });
}
