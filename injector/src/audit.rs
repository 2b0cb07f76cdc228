//! `rdma-stream-injector audit`: which running pods are opted in but were never injected.
//!
//! A pod spec cannot change after creation, so a pod created while the webhook did not inject
//! it (the webhook was down or unreachable under `failurePolicy: Ignore`, the namespace was
//! labelled afterwards, the profile was missing) runs without the shim and without its RDMA
//! slot for its whole life, and nothing says so (linkerd/linkerd2#13702, #3290, #11623).
//! `audit` lists every Pending or Running pod, asks the same pure [`crate::core::plan`] the
//! webhook asks, and reports:
//!
//! - `not_injected`: the plan would inject and the pod has no status annotation. Restart its
//!   owner (`kubectl rollout restart`) or delete the pod; the exit status is 3.
//! - `outdated`: injected, but with another profile content or injector format than the
//!   current config gives (informational: it runs with what it got).
//! - `would_be_denied`: the webhook would now refuse such a pod (informational).
//!
//! Pods the plan skips (not opted in, opted out, already injected with this config, nothing
//! to inject into) are fine and not listed.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::{Api, Client, api::ListParams};
use rdma_streams_common::report::Report;
use serde::Serialize;
use serde_json::Value;

use crate::{
    core::{self, Decision, NamespaceFacts, PlanInput, names::STATUS_ANNOTATION},
    profile::Config,
};

/// Pods per LIST page.
const PAGE: u32 = 500;

/// The key of the profiles in the webhook's ConfigMap (the chart mounts it as its `--config`).
pub const PROFILES_KEY: &str = "profiles.yaml";

/// Reading the profiles from the cluster failed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigMapError {
    #[error("--config-map takes NAMESPACE/NAME, not {0:?}")]
    Reference(String),
    #[error("reading ConfigMap {reference}")]
    Read {
        reference: String,
        #[source]
        source: kube::Error,
    },
    #[error("ConfigMap {0} has no key {PROFILES_KEY}")]
    NoProfiles(String),
    #[error(transparent)]
    Profiles(#[from] crate::profile::ProfileError),
}

/// The profiles in ConfigMap `reference` (`NAMESPACE/NAME`), key [`PROFILES_KEY`].
pub async fn profiles_from_config_map(
    client: &Client,
    reference: &str,
) -> Result<Config, ConfigMapError> {
    let Some((namespace, name)) = reference
        .split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
    else {
        return Err(ConfigMapError::Reference(reference.to_owned()));
    };
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let map = api.get(name).await.map_err(|source| ConfigMapError::Read {
        reference: reference.to_owned(),
        source,
    })?;
    let text = map
        .data
        .as_ref()
        .and_then(|d| d.get(PROFILES_KEY))
        .ok_or_else(|| ConfigMapError::NoProfiles(reference.to_owned()))?;
    Ok(crate::profile::parse(
        text,
        &format!("ConfigMap {reference}"),
    )?)
}

/// What is wrong with one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    NotInjected,
    Outdated,
    WouldBeDenied,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::NotInjected => "not_injected",
            State::Outdated => "outdated",
            State::WouldBeDenied => "would_be_denied",
        }
    }
}

/// One pod that needs a look.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub namespace: String,
    pub pod: String,
    /// `Kind/name` of the first owner, empty for a bare pod.
    pub owner: String,
    pub state: State,
    /// What the plan said.
    pub detail: String,
}

/// Judges `pods` (as the API server returns them) in namespaces with `labels`.
pub fn audit(
    pods: &[Value],
    labels: &BTreeMap<String, BTreeMap<String, String>>,
    config: &Config,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    for pod in pods {
        let phase = pod["status"]["phase"].as_str().unwrap_or("Pending");
        if !matches!(phase, "Pending" | "Running") {
            continue;
        }
        let namespace = pod["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let facts = NamespaceFacts {
            labels: labels.get(&namespace).cloned().unwrap_or_default(),
            name: namespace.clone(),
        };
        let input = PlanInput {
            pod,
            namespace: &facts,
            config,
        };
        let (state, detail) = match core::plan(&input) {
            Ok(Decision::Skip { .. }) => continue,
            Ok(Decision::Patch(plan)) => {
                let annotated = pod["metadata"]["annotations"][STATUS_ANNOTATION].is_string();
                if annotated {
                    (
                        State::Outdated,
                        format!(
                            "injected before; profile {:?} would now inject differently",
                            plan.status.profile
                        ),
                    )
                } else {
                    (
                        State::NotInjected,
                        format!(
                            "opted in (profile {:?}) but not injected",
                            plan.status.profile
                        ),
                    )
                }
            }
            Ok(Decision::Deny { message, .. }) => (State::WouldBeDenied, message),
            Err(error) => (
                State::WouldBeDenied,
                format!("the plan failed: {}", Report(&error)),
            ),
        };
        findings.push(Finding {
            pod: pod["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            owner: owner(pod),
            namespace,
            state,
            detail,
        });
    }
    findings.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
    findings
}

fn owner(pod: &Value) -> String {
    let first = &pod["metadata"]["ownerReferences"][0];
    match (first["kind"].as_str(), first["name"].as_str()) {
        (Some(kind), Some(name)) => format!("{kind}/{name}"),
        _ => String::new(),
    }
}

/// Lists the pods (of `namespace`, or all) and the namespaces' labels, then [`audit`]s them.
pub async fn audit_cluster(
    client: &Client,
    namespace: Option<&str>,
    config: &Config,
) -> Result<Vec<Finding>, kube::Error> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut labels = BTreeMap::new();
    let mut list = namespaces.list_metadata(&ListParams::default()).await?;
    for ns in list.items.drain(..) {
        if let Some(name) = ns.metadata.name {
            labels.insert(name, ns.metadata.labels.unwrap_or_default());
        }
    }
    let pods: Api<Pod> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    // Page by page: a large cluster's pods are never all in memory at once.
    let mut findings = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = pods.list(&params).await?;
        let values = page
            .items
            .into_iter()
            .map(serde_json::to_value)
            .collect::<Result<Vec<_>, _>>()
            .map_err(kube::Error::SerdeError)?;
        findings.extend(audit(&values, &labels, config));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    findings.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
    Ok(findings)
}

/// The findings as a table, with a closing summary line.
pub fn render_text(findings: &[Finding]) -> String {
    let mut out = String::new();
    if !findings.is_empty() {
        let rows: Vec<[&str; 5]> = findings
            .iter()
            .map(|f| {
                [
                    f.namespace.as_str(),
                    f.pod.as_str(),
                    if f.owner.is_empty() {
                        "-"
                    } else {
                        f.owner.as_str()
                    },
                    f.state.as_str(),
                    f.detail.as_str(),
                ]
            })
            .collect();
        let header = ["NAMESPACE", "POD", "OWNER", "STATE", "DETAIL"];
        let mut widths = header.map(str::len);
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        for row in std::iter::once(&header).chain(&rows) {
            let line: Vec<String> = row
                .iter()
                .zip(widths)
                .enumerate()
                .map(|(i, (cell, w))| {
                    if i == 4 {
                        (*cell).to_owned()
                    } else {
                        format!("{cell:w$}")
                    }
                })
                .collect();
            out.push_str(line.join("  ").trim_end());
            out.push('\n');
        }
    }
    let count = |s: State| findings.iter().filter(|f| f.state == s).count();
    out.push_str(&format!(
        "{} not injected, {} outdated, {} would be denied",
        count(State::NotInjected),
        count(State::Outdated),
        count(State::WouldBeDenied)
    ));
    if count(State::NotInjected) > 0 {
        out.push_str(": restart their owners (kubectl rollout restart) or delete those pods");
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use http::Method;
    use serde_json::json;

    use super::*;
    use crate::core::names::{INJECT, NAMESPACE_ENABLED, PROFILE_ANNOTATION};
    use rdma_streams_testkit::mock_api::{mock_client, query, respond, timeout_after};

    fn pod(namespace: &str, name: &str, labels: Value, phase: &str) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": labels,
                "ownerReferences": [{ "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{name}-rs"), "uid": "x" }],
            },
            "spec": { "containers": [{ "name": "app", "image": "busybox" }] },
            "status": { "phase": phase },
        })
    }

    /// `pod` as the webhook would have injected it.
    fn injected(pod: &Value, labels: &BTreeMap<String, BTreeMap<String, String>>) -> Value {
        let namespace = pod["metadata"]["namespace"].as_str().unwrap();
        let facts = NamespaceFacts {
            name: namespace.into(),
            labels: labels.get(namespace).cloned().unwrap_or_default(),
        };
        let config = Config::builtin_default();
        let input = PlanInput {
            pod,
            namespace: &facts,
            config: &config,
        };
        match core::plan(&input).unwrap() {
            Decision::Patch(plan) => core::apply(pod, &plan.patch).unwrap(),
            other => panic!("{other:?}"),
        }
    }

    fn namespaces() -> BTreeMap<String, BTreeMap<String, String>> {
        BTreeMap::from([
            (
                "rdma".to_owned(),
                BTreeMap::from([(INJECT.to_owned(), NAMESPACE_ENABLED.to_owned())]),
            ),
            ("plain".to_owned(), BTreeMap::new()),
        ])
    }

    #[test]
    fn opted_in_pods_without_their_injection_are_found() {
        let labels = namespaces();
        let opted = json!({ INJECT: "true" });
        let missed = pod("rdma", "missed", json!({}), "Running");
        let by_label = pod("plain", "by-label", opted.clone(), "Pending");
        let fine = injected(&pod("rdma", "fine", json!({}), "Running"), &labels);
        let mut outdated = injected(&pod("rdma", "outdated", json!({}), "Running"), &labels);
        let status = outdated["metadata"]["annotations"][STATUS_ANNOTATION]
            .as_str()
            .unwrap()
            .replace("\"hash\":\"", "\"hash\":\"0");
        outdated["metadata"]["annotations"][STATUS_ANNOTATION] = json!(status);
        let mut unknown_profile = pod("plain", "unknown-profile", opted.clone(), "Running");
        unknown_profile["metadata"]["annotations"] = json!({ PROFILE_ANNOTATION: "nope" });
        let pods = [
            missed,
            by_label,
            fine,
            outdated,
            unknown_profile,
            pod("plain", "not-opted-in", json!({}), "Running"),
            pod("rdma", "finished", json!({}), "Succeeded"),
            pod("rdma", "opted-out", json!({ INJECT: "false" }), "Running"),
        ];
        let found: Vec<(String, State, String)> = audit(&pods, &labels, &Config::builtin_default())
            .into_iter()
            .map(|f| (format!("{}/{}", f.namespace, f.pod), f.state, f.owner))
            .collect();
        assert_eq!(
            found,
            [
                (
                    "plain/by-label".into(),
                    State::NotInjected,
                    "ReplicaSet/by-label-rs".into()
                ),
                (
                    "plain/unknown-profile".into(),
                    State::WouldBeDenied,
                    "ReplicaSet/unknown-profile-rs".into()
                ),
                (
                    "rdma/missed".into(),
                    State::NotInjected,
                    "ReplicaSet/missed-rs".into()
                ),
                (
                    "rdma/outdated".into(),
                    State::Outdated,
                    "ReplicaSet/outdated-rs".into()
                ),
            ]
        );
    }

    #[test]
    fn the_text_report_is_a_table_with_a_summary_and_what_to_do() {
        let findings = vec![Finding {
            namespace: "rdma".into(),
            pod: "missed".into(),
            owner: String::new(),
            state: State::NotInjected,
            detail: "opted in (profile \"default\") but not injected".into(),
        }];
        let text = render_text(&findings);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("NAMESPACE  POD     OWNER  STATE"),
            "{text}"
        );
        assert!(
            lines[1].starts_with("rdma       missed  -      not_injected"),
            "{text}"
        );
        assert!(
            lines[2].starts_with("1 not injected, 0 outdated, 0 would be denied: restart"),
            "{text}"
        );
        assert_eq!(
            render_text(&[]),
            "0 not injected, 0 outdated, 0 would be denied\n"
        );
    }

    #[tokio::test]
    async fn the_cluster_is_read_page_by_page() {
        let (client, mut api) = mock_client();
        let scenario = tokio::spawn(async move {
            let (_, send) = api.expect(Method::GET, "/api/v1/namespaces").await;
            respond(
                send,
                200,
                &json!({
                    "apiVersion": "v1", "kind": "PartialObjectMetadataList",
                    "metadata": { "resourceVersion": "1" },
                    "items": [
                        { "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                          "metadata": { "name": "rdma", "labels": { INJECT: NAMESPACE_ENABLED } } },
                    ],
                }),
            );
            let (request, send) = api.expect(Method::GET, "/api/v1/pods").await;
            assert!(query(&request).contains("limit=500"), "{}", query(&request));
            respond(
                send,
                200,
                &json!({
                    "apiVersion": "v1", "kind": "PodList",
                    "metadata": { "resourceVersion": "2", "continue": "next" },
                    "items": [pod("rdma", "a", json!({}), "Running")],
                }),
            );
            let (request, send) = api.expect(Method::GET, "/api/v1/pods").await;
            assert!(
                query(&request).contains("continue=next"),
                "{}",
                query(&request)
            );
            respond(
                send,
                200,
                &json!({
                    "apiVersion": "v1", "kind": "PodList",
                    "metadata": { "resourceVersion": "2" },
                    "items": [pod("rdma", "b", json!({}), "Running")],
                }),
            );
        });
        let findings = audit_cluster(&client, None, &Config::builtin_default())
            .await
            .unwrap();
        timeout_after(std::time::Duration::from_secs(5), scenario).await;
        let pods: Vec<&str> = findings.iter().map(|f| f.pod.as_str()).collect();
        assert_eq!(pods, ["a", "b"]);
        assert!(findings.iter().all(|f| f.state == State::NotInjected));
    }

    #[tokio::test]
    async fn profiles_come_from_the_webhooks_config_map() {
        let (client, mut api) = mock_client();
        let profiles = "profiles:\n  default:\n    resource: {name: rdma-streams.io/hca, count: 2}\n    shim: {delivery: init-copy, image: rdma-streams/shim-bundle:0.1.0}\n";
        let scenario = tokio::spawn(async move {
            let (_, send) = api
                .expect(
                    Method::GET,
                    "/api/v1/namespaces/rdma-streams/configmaps/inj",
                )
                .await;
            respond(
                send,
                200,
                &json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": { "name": "inj", "namespace": "rdma-streams" },
                    "data": { PROFILES_KEY: profiles },
                }),
            );
            let (_, send) = api
                .expect(
                    Method::GET,
                    "/api/v1/namespaces/rdma-streams/configmaps/empty",
                )
                .await;
            respond(
                send,
                200,
                &json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "empty" } }),
            );
        });
        let config = profiles_from_config_map(&client, "rdma-streams/inj")
            .await
            .unwrap();
        assert!(config.profile("default").is_some());
        let missing = profiles_from_config_map(&client, "rdma-streams/empty").await;
        assert!(
            matches!(missing, Err(ConfigMapError::NoProfiles(_))),
            "{missing:?}"
        );
        for bad in ["inj", "/inj", "ns/", "a/b/c"] {
            let refused = profiles_from_config_map(&client, bad).await;
            assert!(
                matches!(refused, Err(ConfigMapError::Reference(_))),
                "{bad}"
            );
        }
        timeout_after(std::time::Duration::from_secs(5), scenario).await;
    }
}
