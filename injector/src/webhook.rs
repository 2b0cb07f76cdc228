//! The webhook's [`Handler`]: an AdmissionRequest in, the pure core's decision out.

use std::{collections::BTreeMap, sync::Arc};

use kube::core::{
    DynamicObject,
    admission::{AdmissionRequest, Operation},
};
use rdma_streams_common::report::Report;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::{
    core::{self, Decision, NamespaceFacts, PlanInput},
    namespaces::NamespaceCache,
    profile::Config,
    server::{Allowed, Handler, Outcome, Reviewed},
};

/// Injects opted-in pods on CREATE; everything else is admitted unchanged.
pub struct InjectorHandler {
    pub profiles: watch::Receiver<Arc<Config>>,
    pub namespaces: NamespaceCache,
}

impl Handler for InjectorHandler {
    fn review(&self, req: &AdmissionRequest<DynamicObject>) -> Reviewed {
        if req.operation != Operation::Create {
            // Pod specs are immutable after creation: UPDATEs are never ours to mutate.
            return Reviewed::skipped("not_create");
        }
        if !(req.kind.group.is_empty() && req.kind.kind == "Pod") {
            return Reviewed::skipped("not_a_pod");
        }
        let Some(object) = &req.object else {
            return Reviewed::Error {
                message: "CREATE request without an object".to_string(),
            };
        };
        let pod = match serde_json::to_value(object) {
            Ok(v) => v,
            Err(e) => {
                return Reviewed::Error {
                    message: format!("cannot encode the pod: {}", Report(&e)),
                };
            }
        };
        // Pods made by controllers carry no namespace of their own: the request's is right.
        let ns_name = req
            .namespace
            .clone()
            .or_else(|| object.metadata.namespace.clone())
            .unwrap_or_default();
        let labels: BTreeMap<String, String> = match self.namespaces.labels(&ns_name) {
            Some(labels) => labels,
            None => {
                if self.namespaces.is_enabled() {
                    // A namespace created a moment ago may not have reached the cache yet:
                    // its opt-in and Pod Security labels are unknown for this pod.
                    warn!(uid = %req.uid, namespace = %ns_name, "namespace not in the cache; its labels are unknown");
                }
                BTreeMap::new()
            }
        };
        let namespace = NamespaceFacts {
            name: ns_name.clone(),
            labels,
        };
        let profiles = self.profiles.borrow().clone();
        let input = PlanInput {
            pod: &pod,
            namespace: &namespace,
            config: &profiles,
        };
        let pod_name = object
            .metadata
            .name
            .clone()
            .or_else(|| {
                object
                    .metadata
                    .generate_name
                    .clone()
                    .map(|g| format!("{g}*"))
            })
            .unwrap_or_default();
        match core::plan(&input) {
            Ok(Decision::Patch(plan)) => {
                info!(
                    uid = %req.uid, namespace = %ns_name, pod = %pod_name,
                    profile = %plan.status.profile, containers = ?plan.status.containers,
                    dry_run = req.dry_run, "injected"
                );
                for warning in &plan.warnings {
                    warn!(uid = %req.uid, namespace = %ns_name, pod = %pod_name, %warning, "injected with a warning");
                }
                Reviewed::Allow(Allowed {
                    patch: Some(plan.patch),
                    warnings: plan.warnings,
                    audit: plan.audit,
                    outcome: Outcome::Injected,
                    reason: "injected",
                })
            }
            Ok(Decision::Skip { reason, message }) => {
                debug!(uid = %req.uid, namespace = %ns_name, pod = %pod_name, reason = reason.as_str(), %message, "skipped");
                Reviewed::skipped(reason.as_str())
            }
            Ok(Decision::Deny { reason, message }) => {
                warn!(uid = %req.uid, namespace = %ns_name, pod = %pod_name, reason = reason.as_str(), %message, "denied");
                Reviewed::deny(reason.as_str(), message)
            }
            Err(error) => Reviewed::Error {
                message: format!("injection failed ({}): {}", error.as_str(), Report(&error)),
            },
        }
    }

    /// The core is pure and bounded (the body is at most the server's limit): inline.
    fn is_inline(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::admission::AdmissionReview;
    use serde_json::json;

    fn handler() -> InjectorHandler {
        InjectorHandler {
            profiles: watch::channel(Arc::new(Config::builtin_default())).1,
            namespaces: NamespaceCache::disabled(),
        }
    }

    fn request(
        operation: &str,
        kind: &str,
        object: serde_json::Value,
    ) -> AdmissionRequest<DynamicObject> {
        let review: AdmissionReview<DynamicObject> = serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "", "version": "v1", "kind": kind},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "team-a",
                "operation": operation,
                "userInfo": {},
                "object": object,
                "dryRun": false
            }
        }))
        .expect("review");
        review.try_into().expect("request")
    }

    fn opted_in_pod() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "web-", "labels": {"rdma-streams.io/inject": "true"}},
            "spec": {"containers": [{"name": "web", "image": "nginx"}]}
        })
    }

    fn outcome(r: &Reviewed) -> (&'static str, &'static str) {
        match r {
            Reviewed::Allow(a) => (a.outcome.as_str(), a.reason),
            Reviewed::Deny { reason, .. } => ("denied", reason),
            Reviewed::Error { .. } => ("error", ""),
        }
    }

    #[test]
    fn create_of_an_opted_in_pod_is_injected() {
        let r = handler().review(&request("CREATE", "Pod", opted_in_pod()));
        assert_eq!(outcome(&r), ("injected", "injected"));
    }

    #[test]
    fn updates_and_other_kinds_are_never_mutated() {
        let h = handler();
        let r = h.review(&request("UPDATE", "Pod", opted_in_pod()));
        assert_eq!(outcome(&r), ("skipped", "not_create"));
        let r = h.review(&request(
            "CREATE",
            "ConfigMap",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}),
        ));
        assert_eq!(outcome(&r), ("skipped", "not_a_pod"));
    }

    #[test]
    fn an_unknown_profile_is_denied_with_the_known_ones() {
        let mut pod = opted_in_pod();
        pod["metadata"]["annotations"] = json!({"rdma-streams.io/profile": "fast"});
        match handler().review(&request("CREATE", "Pod", pod)) {
            Reviewed::Deny { message, reason } => {
                assert_eq!(reason, "unknown_profile");
                assert!(message.contains("default"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
}
