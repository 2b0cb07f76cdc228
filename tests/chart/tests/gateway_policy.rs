//! The gateway's Node privileges: its RBAC lets it patch every Node, and the
//! ValidatingAdmissionPolicy the chart renders with it narrows that to the `rdma-streams.io/`
//! annotations of the gateway's own Node.
//!
//! The policy's CEL is evaluated here, offline, with the `cel` crate, against requests shaped
//! like the API server's (an AdmissionRequest's `userInfo`, the Node before and after the
//! gateway's merge patch of gateway/src/kube/node.rs): the gateway on its own node, on another
//! node, without the node-name claim, and patches that touch labels, taints, status, other
//! annotations or other metadata. The API server runs cel-go, not this interpreter: what is
//! checked here is the expressions' meaning on these samples (maps and lists as the API server
//! hands an object to a policy at run time, where `object` is dynamically typed) and that no
//! sample makes an expression fail (with `failurePolicy: Fail` an evaluation error denies).
//! The API server still type-checks the policy when it is created and reports warnings in its
//! status; a syntax error there fails `helm install`.

// An integration test: its helpers panic to fail the test, as its `#[test]` functions may.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use cel::{Context, Program};
use rdma_streams_chart_tests::{NAMESPACE, Rendered, helm, ident, named, render, value_set};
use rdma_streams_testkit::within;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(240);
const CLAIM: &str = "authentication.kubernetes.io/node-name";
/// The annotations the gateway publishes on its Node (gateway/src/kube/node.rs).
const GATEWAY_ADDRESS: &str = "rdma-streams.io/gateway-address";
const VIRT_HANDLER_ADDRESSES: &str = "rdma-streams.io/virt-handler-addresses";

/// The gateway's service account as the API server names its requests.
fn gateway_user() -> String {
    format!("system:serviceaccount:{NAMESPACE}:{}", named("gateway"))
}

#[test]
fn gateway_node_policy_is_bound_and_names_the_gateway_service_account() {
    within(LIMIT, || {
        let Some(helm) = helm() else { return };
        for set in ["kubevirt", "everything"] {
            let r = render(&helm, value_set(set), &[]);
            let policy = r.get("ValidatingAdmissionPolicy", &named("gateway-node-patch"));
            let spec = &policy["spec"];
            assert_eq!(spec["failurePolicy"], "Fail", "{set}");
            assert_eq!(
                spec["matchConstraints"],
                json!({"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                       "operations": ["UPDATE"], "resources": ["nodes"]}]}),
                "{set}: Node updates only (not nodes/status, which kubelets write)"
            );
            // The service account the gateway pods run as, which the ClusterRoleBinding binds.
            let ds = r.get("DaemonSet", &named("gateway"));
            let sa = ds["spec"]["template"]["spec"]["serviceAccountName"]
                .as_str()
                .unwrap();
            r.get("ServiceAccount", sa);
            let binding = r.get("ClusterRoleBinding", &named("gateway"));
            assert_eq!(
                binding["subjects"],
                json!([{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}])
            );
            let conditions = spec["matchConditions"].as_array().unwrap();
            assert_eq!(conditions.len(), 1, "{set}");
            assert_eq!(
                conditions[0]["expression"],
                format!(
                    "has(request.userInfo.username) && request.userInfo.username == \
                     'system:serviceaccount:{NAMESPACE}:{sa}'"
                ),
                "{set}"
            );
            let binding = r.get(
                "ValidatingAdmissionPolicyBinding",
                &named("gateway-node-patch"),
            );
            assert_eq!(
                binding["spec"],
                json!({"policyName": named("gateway-node-patch"), "validationActions": ["Deny"]}),
                "{set}: bound everywhere the policy matches, denying"
            );
            for v in spec["validations"].as_array().unwrap() {
                assert_eq!(v["reason"], "Forbidden", "{set}: {v}");
                assert!(
                    v["message"].is_string() || v["messageExpression"].is_string(),
                    "{set}: {v}"
                );
            }
        }
        let default = render(&helm, value_set("default"), &[]);
        assert!(default.all("ValidatingAdmissionPolicy").is_empty());
        assert!(default.all("ValidatingAdmissionPolicyBinding").is_empty());
    });
}

// === an offline evaluator of one ValidatingAdmissionPolicy ===

struct Compiled {
    source: String,
    program: Program,
}

fn compile(source: &str) -> Compiled {
    let program =
        Program::compile(source).unwrap_or_else(|e| panic!("CEL does not parse: {source}\n{e}"));
    Compiled {
        source: source.to_string(),
        program,
    }
}

struct Validation {
    expression: Compiled,
    message: Option<String>,
    message_expression: Option<Compiled>,
}

struct Policy {
    match_conditions: Vec<Compiled>,
    variables: Vec<(String, Compiled)>,
    validations: Vec<Validation>,
}

/// What the API server would do with one request.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// A match condition is false: the policy does not apply.
    NotMatched,
    Allowed,
    /// The messages of the failed validations.
    Denied(Vec<String>),
}

impl Policy {
    fn from(doc: &Value) -> Policy {
        let spec = &doc["spec"];
        let expr = |v: &Value| compile(v["expression"].as_str().expect("expression"));
        Policy {
            match_conditions: spec["matchConditions"]
                .as_array()
                .unwrap()
                .iter()
                .map(expr)
                .collect(),
            variables: spec["variables"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| (v["name"].as_str().unwrap().to_string(), expr(v)))
                .collect(),
            validations: spec["validations"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| Validation {
                    expression: expr(v),
                    message: v["message"].as_str().map(str::to_string),
                    message_expression: v["messageExpression"].as_str().map(compile),
                })
                .collect(),
        }
    }

    /// Evaluates the policy on an UPDATE of `old` to `new` by `user_info`, the way the API
    /// server does: match conditions, then the variables in order, then every validation.
    /// Any evaluation error fails the test.
    fn evaluate(&self, user_info: &Value, old: &Value, new: &Value) -> Outcome {
        let request = json!({
            "operation": "UPDATE",
            "name": new["metadata"]["name"],
            "kind": {"group": "", "version": "v1", "kind": "Node"},
            "resource": {"group": "", "version": "v1", "resource": "nodes"},
            "userInfo": user_info,
        });
        let mut ctx = Context::default();
        ctx.add_variable_from_value("request", cel::to_value(&request).unwrap());
        ctx.add_variable_from_value("object", cel::to_value(new).unwrap());
        ctx.add_variable_from_value("oldObject", cel::to_value(old).unwrap());
        let run = |ctx: &Context<'_, '_>, c: &Compiled| {
            c.program
                .execute(ctx)
                .unwrap_or_else(|e| panic!("{} fails on {user_info}: {e}", c.source))
        };
        let truth = |ctx: &Context<'_, '_>, c: &Compiled| match run(ctx, c) {
            cel::Value::Bool(b) => b,
            other => panic!("{} is {other:?}, not a bool", c.source),
        };
        for condition in &self.match_conditions {
            if !truth(&ctx, condition) {
                return Outcome::NotMatched;
            }
        }
        let mut variables: HashMap<String, cel::Value> = HashMap::new();
        for (name, expression) in &self.variables {
            let mut scope = Context::default();
            scope.add_variable_from_value("request", cel::to_value(&request).unwrap());
            scope.add_variable_from_value("object", cel::to_value(new).unwrap());
            scope.add_variable_from_value("oldObject", cel::to_value(old).unwrap());
            scope.add_variable_from_value("variables", variables.clone());
            let value = run(&scope, expression);
            variables.insert(name.clone(), value);
        }
        ctx.add_variable_from_value("variables", variables);
        let mut denied = Vec::new();
        for v in &self.validations {
            if truth(&ctx, &v.expression) {
                continue;
            }
            let message = match (&v.message_expression, &v.message) {
                (Some(m), _) => match run(&ctx, m) {
                    cel::Value::String(s) => s.to_string(),
                    other => panic!("{} is {other:?}, not a string", m.source),
                },
                (None, Some(m)) => m.clone(),
                (None, None) => v.expression.source.clone(),
            };
            denied.push(message);
        }
        if denied.is_empty() {
            Outcome::Allowed
        } else {
            Outcome::Denied(denied)
        }
    }
}

// === sample requests ===

/// A Node as the API server holds it: kubelet's labels and annotations, taints, status.
fn node(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": "6f9c1d2e-0000-4000-8000-000000000001",
            "resourceVersion": "4711",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {
                "kubernetes.io/hostname": name,
                "kubevirt.io/schedulable": "true",
                "rdma-streams.io/example": "label",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                GATEWAY_ADDRESS: "10.0.0.1:7471",
                VIRT_HANDLER_ADDRESSES: "10.244.1.5",
            },
            "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                               "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {
            "podCIDR": "10.244.1.0/24",
            "podCIDRs": ["10.244.1.0/24"],
            "taints": [{"key": "rdma", "value": "yes", "effect": "NoSchedule"}],
        },
        "status": {
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
            "capacity": {"cpu": "2", "rdma-streams.io/hca": "16"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    })
}

/// RFC 7386 JSON merge patch, as the API server applies the gateway's `Patch::Merge`.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let map = target.as_object_mut().unwrap();
    for (k, v) in patch {
        if v.is_null() {
            map.remove(k);
        } else {
            merge(map.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// `old` after `patches`, one after the other, with what the API server changes on every write.
fn patched(old: &Value, patches: &[&Value]) -> Value {
    let mut new = old.clone();
    for patch in patches {
        merge(&mut new, patch);
    }
    new["metadata"]["resourceVersion"] = json!("4712");
    new["metadata"]["managedFields"]
        .as_array_mut()
        .unwrap()
        .push(
            json!({"manager": "rdma-migration-gateway", "operation": "Update",
                     "apiVersion": "v1", "fieldsType": "FieldsV1"}),
        );
    new
}

/// The user info of a request made with the gateway pod's token, bound to a pod on `node`
/// (`None`: a token without the node-name claim).
fn gateway_on(node: Option<&str>) -> Value {
    let mut extra = json!({
        "authentication.kubernetes.io/credential-id": ["JTI=7ee52be0-9045-4653-aa5e-0da57b8dccdc"],
        "authentication.kubernetes.io/pod-name": ["rdma-streams-gateway-x7k2p"],
        "authentication.kubernetes.io/pod-uid": ["e87dbbd6-3d7e-45db-aafb-72b24627dff5"],
    });
    if let Some(node) = node {
        extra[CLAIM] = json!([node]);
        extra["authentication.kubernetes.io/node-uid"] =
            json!(["497e9d9a-47aa-4930-b0f6-9f2fb574c8c6"]);
    }
    json!({
        "username": gateway_user(),
        "uid": "f8b4161b-2e2b-11e9-86b7-2afc33b31a7e",
        "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{NAMESPACE}"),
                   "system:authenticated"],
        "extra": extra,
    })
}

/// The gateway's publish patch (`NodeAnnotations::patch` in gateway/src/kube/node.rs).
fn publish() -> Value {
    json!({"metadata": {"annotations": {
        GATEWAY_ADDRESS: "10.0.0.1:7471",
        VIRT_HANDLER_ADDRESSES: "10.244.1.77,192.168.50.1",
    }}})
}

/// The gateway's removal patch at shutdown (`NodeAnnotations::removal_patch`).
fn removal() -> Value {
    json!({"metadata": {"annotations": {GATEWAY_ADDRESS: null, VIRT_HANDLER_ADDRESSES: null}}})
}

fn policy_of(r: &Rendered) -> Policy {
    Policy::from(r.get("ValidatingAdmissionPolicy", &named("gateway-node-patch")))
}

fn denied_with(outcome: &Outcome, fragment: &str) -> bool {
    matches!(outcome, Outcome::Denied(m) if m.iter().any(|m| m.contains(fragment)))
}

#[test]
fn gateway_node_policy_allows_only_its_own_nodes_annotations() {
    within(LIMIT, || {
        let Some(helm) = helm() else { return };
        let r = render(&helm, value_set("kubevirt"), &[]);
        let policy = policy_of(&r);
        let own = node("node-1");
        let me = gateway_on(Some("node-1"));
        let eval = |user: &Value, old: &Value, new: &Value| policy.evaluate(user, old, new);

        // What the gateway does: publish, republish, remove, on its own node.
        assert_eq!(
            eval(&me, &own, &patched(&own, &[&publish()])),
            Outcome::Allowed
        );
        assert_eq!(
            eval(&me, &own, &patched(&own, &[&removal()])),
            Outcome::Allowed
        );
        let mut bare = own.clone();
        bare["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("annotations");
        assert_eq!(
            eval(&me, &bare, &patched(&bare, &[&publish()])),
            Outcome::Allowed,
            "first publish on a Node without annotations"
        );
        let mut other_key = publish();
        other_key["metadata"]["annotations"]["rdma-streams.io/peer-key-id"] = json!("k2");
        assert_eq!(
            eval(&me, &own, &patched(&own, &[&other_key])),
            Outcome::Allowed,
            "any rdma-streams.io/ annotation"
        );
        assert_eq!(
            eval(&me, &own, &patched(&own, &[&json!({})])),
            Outcome::Allowed,
            "an empty patch"
        );

        // Another node: denied, whatever the patch.
        let other = node("node-2");
        let outcome = eval(&me, &other, &patched(&other, &[&publish()]));
        assert!(
            denied_with(
                &outcome,
                "the gateway on node node-1 may not change Node node-2"
            ),
            "{outcome:?}"
        );

        // Its own node, but anything besides rdma-streams.io/ annotations.
        let cases: &[(&str, Value, &str)] = &[
            (
                "label added",
                json!({"metadata": {"labels": {"rdma-streams.io/evil": "x"}}}),
                "Node labels",
            ),
            (
                "label changed",
                json!({"metadata": {"labels": {"kubevirt.io/schedulable": "false"}}}),
                "Node labels",
            ),
            (
                "label removed",
                json!({"metadata": {"labels": {"kubernetes.io/hostname": null}}}),
                "Node labels",
            ),
            (
                "annotation of another domain added",
                json!({"metadata": {"annotations": {"example.com/x": "1"}}}),
                "only rdma-streams.io/ annotations",
            ),
            (
                "annotation of another domain changed",
                json!({"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "30"}}}),
                "only rdma-streams.io/ annotations",
            ),
            (
                "annotation of another domain removed",
                json!({"metadata": {"annotations": {
                    "volumes.kubernetes.io/controller-managed-attach-detach": null}}}),
                "only rdma-streams.io/ annotations",
            ),
            (
                "look-alike prefix",
                json!({"metadata": {"annotations": {"rdma-streams.io.evil.com/x": "1"}}}),
                "only rdma-streams.io/ annotations",
            ),
            (
                "sub-domain prefix",
                json!({"metadata": {"annotations": {"x.rdma-streams.io/y": "1"}}}),
                "only rdma-streams.io/ annotations",
            ),
            (
                "every annotation replaced",
                json!({"metadata": {"annotations": null}}),
                "only rdma-streams.io/ annotations",
            ),
            (
                "taint removed",
                json!({"spec": {"taints": null}}),
                "spec (taints included)",
            ),
            (
                "cordoned",
                json!({"spec": {"unschedulable": true}}),
                "spec (taints included)",
            ),
            (
                "status changed",
                json!({"status": {"capacity": {"rdma-streams.io/hca": "1000"}}}),
                "status",
            ),
            (
                "finalizer added",
                json!({"metadata": {"finalizers": ["example.com/keep"]}}),
                "no Node metadata but rdma-streams.io/ annotations",
            ),
            (
                "owner reference added",
                json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                       "name": "p", "uid": "u"}]}}),
                "no Node metadata but rdma-streams.io/ annotations",
            ),
        ];
        for (case, patch, fragment) in cases {
            let outcome = eval(&me, &own, &patched(&own, &[&publish(), patch]));
            assert!(denied_with(&outcome, fragment), "{case}: {outcome:?}");
        }

        // Other users never get past the match condition: their requests are not evaluated,
        // so the policy cannot block them, even with no user name or extra at all.
        let kubelet = json!({"username": "system:node:node-1", "groups": ["system:nodes"]});
        let cordon = patched(&own, &[&json!({"spec": {"unschedulable": true}})]);
        assert_eq!(eval(&kubelet, &own, &cordon), Outcome::NotMatched);
        assert_eq!(eval(&json!({}), &own, &cordon), Outcome::NotMatched);
        let other_sa = json!({"username": format!("system:serviceaccount:{NAMESPACE}:{}",
                                                  named("injector"))});
        assert_eq!(eval(&other_sa, &own, &cordon), Outcome::NotMatched);
    });
}

#[test]
fn gateway_node_policy_without_the_node_claim_fails_closed_unless_told() {
    within(LIMIT, || {
        let Some(helm) = helm() else { return };
        let own = node("node-1");
        let publish = patched(&own, &[&publish()]);
        let no_claim = gateway_on(None);
        let empty_extra = json!({"username": gateway_user(), "extra": {}});
        let no_extra = json!({"username": gateway_user()});
        let two_claims =
            json!({"username": gateway_user(), "extra": {CLAIM: ["node-1", "node-2"]}});

        // Default: no claim, no patch; the message says why and which value to look at.
        let strict = policy_of(&render(&helm, value_set("kubevirt"), &[]));
        for (case, user) in [
            ("no claim", &no_claim),
            ("empty extra", &empty_extra),
            ("no extra", &no_extra),
            ("two claims", &two_claims),
        ] {
            let outcome = strict.evaluate(user, &own, &publish);
            assert!(
                denied_with(&outcome, "its service account token names no node")
                    && denied_with(&outcome, "gateway.nodePatchPolicy.requireNodeNameClaim"),
                "{case}: {outcome:?}"
            );
        }

        // requireNodeNameClaim=false: without the claim, any node's rdma-streams.io/
        // annotations, and still nothing else; with the claim, its own node only.
        let lax = policy_of(&render(
            &helm,
            value_set("kubevirt"),
            &[
                "--set",
                "gateway.nodePatchPolicy.requireNodeNameClaim=false",
            ],
        ));
        for user in [&no_claim, &empty_extra, &no_extra] {
            assert_eq!(lax.evaluate(user, &own, &publish), Outcome::Allowed);
            let other = node("node-2");
            assert_eq!(
                lax.evaluate(user, &other, &patched(&other, &[&self::publish()])),
                Outcome::Allowed
            );
            let label = patched(&own, &[&json!({"metadata": {"labels": {"a": "b"}}})]);
            assert!(denied_with(
                &lax.evaluate(user, &own, &label),
                "Node labels"
            ));
        }
        let other = node("node-2");
        let outcome = lax.evaluate(
            &gateway_on(Some("node-1")),
            &other,
            &patched(&other, &[&self::publish()]),
        );
        assert!(
            denied_with(&outcome, "may not change Node node-2"),
            "{outcome:?}"
        );
    });
}

/// Every CEL expression of every policy the chart renders parses, and only the gateway's
/// policy exists.
#[test]
fn every_rendered_policy_expression_parses() {
    within(LIMIT, || {
        let Some(helm) = helm() else { return };
        for set in rdma_streams_chart_tests::VALUE_SETS {
            let r = render(&helm, *set, &[]);
            for policy in r.all("ValidatingAdmissionPolicy") {
                assert_eq!(
                    ident(policy),
                    format!("ValidatingAdmissionPolicy/{}", named("gateway-node-patch"))
                );
                Policy::from(policy);
            }
        }
    });
}
