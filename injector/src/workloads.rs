//! `inject -f`: the webhook's pure core applied offline to manifests.
//!
//! Multi-document YAML in, multi-document YAML out (a `List`'s items are opened). Pods and the
//! pod templates of Deployment,
//! StatefulSet, DaemonSet, ReplicaSet, Job and CronJob are injected exactly as the webhook would
//! inject the pods they create; a KubeVirt VirtualMachine only gets the migration opt-in label
//! on its template (its virt-launcher pod is made by KubeVirt and injected by the webhook);
//! everything else passes through. A workload is treated as opted in unless it opts out with
//! `rdma-streams.io/inject: "false"`; the opt-in label is written so the webhook agrees.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::{
    core::{self, Decision, NamespaceFacts, PlanInput, names},
    profile::Config,
};

#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("document {index}: not valid YAML")]
    Yaml {
        index: usize,
        #[source]
        source: rdma_streams_yaml::Error,
    },
    #[error("document {index} ({kind} {name}): {message}")]
    Denied {
        index: usize,
        kind: String,
        name: String,
        message: String,
    },
    #[error("document {index} ({kind} {name})")]
    Core {
        index: usize,
        kind: String,
        name: String,
        #[source]
        source: core::CoreError,
    },
    #[error("writing YAML")]
    Output(#[source] rdma_streams_yaml::Error),
}

/// What happened to one document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocReport {
    pub kind: String,
    pub name: String,
    /// `injected`, `unchanged` (already injected), `skipped: <why>`, `labelled` (VM), `passed`.
    pub outcome: String,
    pub warnings: Vec<String>,
}

/// Options of `inject -f`.
#[derive(Clone, Debug, Default)]
pub struct InjectOptions {
    /// Profile for templates that do not name one.
    pub profile: Option<String>,
    /// Namespace facts when a document has no namespace (`default` otherwise).
    pub namespace: Option<String>,
}

/// The pod-template pointers of a workload kind, `None` for kinds we do not touch.
fn template_pointer(kind: &str) -> Option<&'static str> {
    match kind {
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "Job"
        | "ReplicationController" => Some("/spec/template"),
        "CronJob" => Some("/spec/jobTemplate/spec/template"),
        _ => None,
    }
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

/// `metadata.<field>.<key>` of `obj` as a string, `""` when absent or not a string.
fn meta_str<'a>(obj: &'a Value, field: &str, key: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|meta| meta.get(field))
        .and_then(|map| map.get(key))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Sets `metadata.<field>.<key> = value` on `obj` (creating maps), unless the key is present.
fn ensure_meta(obj: &mut Value, field: &str, key: &str, value: &str) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    let meta = root.entry("metadata").or_insert_with(|| json!({}));
    let Some(meta) = meta.as_object_mut() else {
        return;
    };
    let map = meta.entry(field).or_insert_with(|| json!({}));
    if let Some(map) = map.as_object_mut() {
        map.entry(key.to_string()).or_insert_with(|| json!(value));
    }
}

/// Injects one pod-shaped value (a Pod, or a template wrapped as one) in place.
fn inject_pod(
    pod: &mut Value,
    namespace: &NamespaceFacts,
    config: &Config,
    opts: &InjectOptions,
) -> Result<(String, Vec<String>), InjectOrDeny> {
    // The label wins over the annotation, as in the webhook; either saying "false" opts out.
    let label = meta_str(pod, "labels", names::INJECT);
    let annotation = meta_str(pod, "annotations", names::INJECT);
    let opted_out =
        label == names::INJECT_FALSE || (label.is_empty() && annotation == names::INJECT_FALSE);
    if opted_out {
        return Ok(("skipped: opted out".to_string(), vec![]));
    }
    ensure_meta(pod, "labels", names::INJECT, names::INJECT_TRUE);
    if let Some(profile) = &opts.profile {
        ensure_meta(pod, "annotations", names::PROFILE_ANNOTATION, profile);
    }
    let input = PlanInput {
        pod,
        namespace,
        config,
    };
    match core::plan(&input).map_err(InjectOrDeny::Core)? {
        Decision::Patch(plan) => {
            *pod = core::apply(pod, &plan.patch).map_err(InjectOrDeny::Core)?;
            Ok(("injected".to_string(), plan.warnings))
        }
        Decision::Skip { reason, message } => {
            let outcome = if reason.as_str() == "already_injected" {
                "unchanged".to_string()
            } else {
                format!("skipped: {message}")
            };
            Ok((outcome, vec![]))
        }
        Decision::Deny { message, .. } => Err(InjectOrDeny::Deny(message)),
    }
}

enum InjectOrDeny {
    Core(core::CoreError),
    Deny(String),
}

/// Injects one parsed document; returns its report.
fn inject_doc(
    index: usize,
    doc: &mut Value,
    config: &Config,
    opts: &InjectOptions,
) -> Result<DocReport, InjectError> {
    let kind = str_at(doc, "/kind").to_string();
    let name = {
        let n = str_at(doc, "/metadata/name");
        if n.is_empty() {
            str_at(doc, "/metadata/generateName").to_string()
        } else {
            n.to_string()
        }
    };
    let ns_name = match str_at(doc, "/metadata/namespace") {
        "" => opts
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string()),
        ns => ns.to_string(),
    };
    let namespace = NamespaceFacts {
        name: ns_name,
        labels: BTreeMap::new(),
    };
    let report = |outcome: String, warnings: Vec<String>| DocReport {
        kind: kind.clone(),
        name: name.clone(),
        outcome,
        warnings,
    };
    let fail = |e: InjectOrDeny| match e {
        InjectOrDeny::Core(source) => InjectError::Core {
            index,
            kind: kind.clone(),
            name: name.clone(),
            source,
        },
        InjectOrDeny::Deny(message) => InjectError::Denied {
            index,
            kind: kind.clone(),
            name: name.clone(),
            message,
        },
    };

    if kind == "Pod" {
        let (outcome, warnings) = inject_pod(doc, &namespace, config, opts).map_err(fail)?;
        return Ok(report(outcome, warnings));
    }
    if kind == "VirtualMachine" && str_at(doc, "/apiVersion").starts_with("kubevirt.io/") {
        let Some(template) = doc.pointer_mut("/spec/template") else {
            return Ok(report("passed: no spec.template".to_string(), vec![]));
        };
        ensure_meta(template, "labels", names::MIGRATION, names::MIGRATION_RDMA);
        return Ok(report("labelled".to_string(), vec![]));
    }
    let Some(ptr) = template_pointer(&kind) else {
        return Ok(report("passed".to_string(), vec![]));
    };
    let Some(template) = doc.pointer_mut(ptr) else {
        return Ok(report(format!("passed: no {ptr}"), vec![]));
    };
    // A template is a pod without apiVersion/kind: wrap, inject, unwrap.
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template.get("metadata").cloned().unwrap_or_else(|| json!({})),
        "spec": template.get("spec").cloned().unwrap_or_else(|| json!({})),
    });
    let (outcome, warnings) = inject_pod(&mut pod, &namespace, config, opts).map_err(fail)?;
    if let (Some(t), Value::Object(mut p)) = (template.as_object_mut(), pod) {
        for key in ["metadata", "spec"] {
            if let Some(v) = p.remove(key) {
                t.insert(key.to_string(), v);
            }
        }
    }
    Ok(report(outcome, warnings))
}

/// Parses every document of a multi-document YAML text (empty documents are dropped), with the
/// workspace's YAML options (bounded nesting, aliases and size: `rdma_streams_yaml`).
pub fn parse_documents(text: &str) -> Result<Vec<Value>, InjectError> {
    let docs: Vec<Value> = rdma_streams_yaml::documents(text).map_err(|e| InjectError::Yaml {
        index: e.index,
        source: e.error,
    })?;
    Ok(docs.into_iter().filter(|v| !v.is_null()).collect())
}

/// Renders documents as multi-document YAML.
pub fn render_documents(docs: &[Value]) -> Result<String, InjectError> {
    let mut out = String::new();
    for doc in docs {
        out.push_str("---\n");
        out.push_str(&rdma_streams_yaml::to_string(doc).map_err(InjectError::Output)?);
    }
    Ok(out)
}

/// Injects every document of `text`; returns the YAML and a report per document. A document
/// the core denies is an error naming it (nothing is printed half-done).
pub fn inject_yaml(
    text: &str,
    config: &Config,
    opts: &InjectOptions,
) -> Result<(String, Vec<DocReport>), InjectError> {
    let mut docs = parse_documents(text)?;
    let mut reports = Vec::with_capacity(docs.len());
    for (index, doc) in docs.iter_mut().enumerate() {
        if let Value::Object(m) = doc {
            strip_managed_fields(m);
        }
        // `kubectl get ... -o yaml` of several objects prints one `kind: List`: its items are
        // injected in place, as separate documents would be.
        if let Some(items) = list_items(doc) {
            for item in items {
                if let Value::Object(m) = item {
                    strip_managed_fields(m);
                }
                reports.push(inject_doc(index, item, config, opts)?);
            }
            continue;
        }
        reports.push(inject_doc(index, doc, config, opts)?);
    }
    Ok((render_documents(&docs)?, reports))
}

/// The items of a `List` (`kind: List`, or a typed list such as `DeploymentList`).
fn list_items(doc: &mut Value) -> Option<&mut Vec<Value>> {
    let kind = str_at(doc, "/kind");
    if !kind.ends_with("List") {
        return None;
    }
    doc.get_mut("items").and_then(Value::as_array_mut)
}

fn strip_managed_fields(obj: &mut Map<String, Value>) {
    if let Some(Value::Object(meta)) = obj.get_mut("metadata") {
        meta.remove("managedFields");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `inject -f` of a manifest nested deep in flow style: serde_yaml's scanner (the parser
    /// before serde-saphyr) took minutes over a few hundred KB of it (quadratic and worse in
    /// the nesting); it is refused at once.
    #[test]
    fn regression_a_manifest_of_deeply_nested_flow_mappings_took_minutes() {
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {}",
            "{a: ".repeat(1 << 18)
        );
        let (err, _) = rdma_streams_testkit::fuzz::timed(
            "inject -f of 1 MiB of nested flow mappings",
            std::time::Duration::from_secs(10),
            move || {
                parse_documents(&text)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            },
        );
        let err = err.unwrap_err();
        assert!(err.starts_with("document 0: not valid YAML"), "{err}");
    }

    #[test]
    fn the_items_of_a_list_are_injected_in_place() {
        let text = r#"
apiVersion: v1
kind: List
metadata: {resourceVersion: ""}
items:
  - apiVersion: apps/v1
    kind: Deployment
    metadata: {name: web, namespace: team-a, managedFields: [{manager: kubectl}]}
    spec:
      selector: {matchLabels: {app: web}}
      template:
        metadata: {labels: {app: web}}
        spec: {containers: [{name: web, image: nginx}]}
  - apiVersion: v1
    kind: Service
    metadata: {name: web, namespace: team-a}
    spec: {ports: [{port: 80}]}
  - apiVersion: v1
    kind: Pod
    metadata: {name: tool, labels: {rdma-streams.io/inject: "false"}}
    spec: {containers: [{name: tool, image: busybox}]}
"#;
        let (out, reports) =
            inject_yaml(text, &Config::builtin_default(), &InjectOptions::default()).unwrap();
        let outcomes: Vec<(&str, &str)> = reports
            .iter()
            .map(|r| (r.kind.as_str(), r.outcome.as_str()))
            .collect();
        assert_eq!(
            outcomes,
            [
                ("Deployment", "injected"),
                ("Service", "passed"),
                ("Pod", "skipped: opted out")
            ]
        );
        let docs = parse_documents(&out).unwrap();
        assert_eq!(docs.len(), 1, "still one List");
        let deployment = &docs[0]["items"][0];
        let env = &deployment["spec"]["template"]["spec"]["containers"][0]["env"];
        assert!(
            env.as_array()
                .unwrap()
                .iter()
                .any(|e| e["name"] == "LD_PRELOAD"),
            "{deployment}"
        );
        assert!(deployment["metadata"].get("managedFields").is_none());
        assert_eq!(
            docs[0]["items"][1],
            parse_documents(text).unwrap()[0]["items"][1]
        );
    }
}
