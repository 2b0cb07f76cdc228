//! The profile's Multus network, appended to `k8s.v1.cni.cncf.io/networks`.
//!
//! The annotation has two forms and we keep whichever the pod uses:
//! - a comma list of `[namespace/]name[@interface]`: we append `,<our entry>` to the text as
//!   written;
//! - a JSON list of `{"name", "namespace"?, "interface"?, ...}` objects: we append an object
//!   (the list is re-encoded compactly; members other objects carry are kept).
//!
//! A network already listed (same namespace and name; an entry without a namespace means the
//! pod's) is not added again, whatever its interface. An absent or blank annotation becomes the
//! comma form. Changing an existing value is a `test` of the old text and a `replace`.

use json_patch::jsonptr::PointerBuf;
use serde_json::{Map, Value, json};

use super::names;
use super::patch::{Kind, PatchBuilder, annotation_pointer};
use super::pod::PodView;
use super::{DenyReason, Halt};
use crate::profile::NetworkSpec;

/// One network reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NetworkRef {
    pub namespace: Option<String>,
    pub name: String,
    pub interface: Option<String>,
}

impl NetworkRef {
    fn from_spec(spec: &NetworkSpec) -> Self {
        Self {
            namespace: spec.namespace.clone(),
            name: spec.name.clone(),
            interface: spec.interface.clone(),
        }
    }

    /// Same network: same name, and the same namespace once defaulted to the pod's.
    fn same_network(&self, other: &Self, pod_namespace: Option<&str>) -> bool {
        let ns = |r: &Self| {
            r.namespace
                .clone()
                .or_else(|| pod_namespace.map(str::to_owned))
        };
        self.name == other.name && ns(self) == ns(other)
    }

    /// `[namespace/]name[@interface]`.
    fn to_csv(&self) -> String {
        let mut out = String::new();
        if let Some(namespace) = &self.namespace {
            out.push_str(namespace);
            out.push('/');
        }
        out.push_str(&self.name);
        if let Some(interface) = &self.interface {
            out.push('@');
            out.push_str(interface);
        }
        out
    }

    fn to_json(&self) -> Value {
        let mut object = Map::new();
        object.insert("name".to_owned(), json!(self.name));
        if let Some(namespace) = &self.namespace {
            object.insert("namespace".to_owned(), json!(namespace));
        }
        if let Some(interface) = &self.interface {
            object.insert("interface".to_owned(), json!(interface));
        }
        Value::Object(object)
    }
}

/// The parsed annotation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Networks {
    /// Absent, or blank.
    Empty,
    /// Comma form.
    Csv(Vec<NetworkRef>),
    /// JSON form; the raw objects are kept.
    Json(Vec<Value>, Vec<NetworkRef>),
}

impl Networks {
    fn refs(&self) -> &[NetworkRef] {
        match self {
            Self::Empty => &[],
            Self::Csv(refs) | Self::Json(_, refs) => refs,
        }
    }
}

/// Parses an annotation value.
pub(crate) fn parse(text: &str) -> Result<Networks, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Ok(Networks::Empty);
    }
    if trimmed.starts_with('[') {
        let items: Vec<Value> = serde_json::from_str(trimmed)
            .map_err(|e| format!("not a JSON list of network objects: {e}"))?;
        let refs = items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                json_ref(item).ok_or_else(|| format!("item {i} has no string \"name\""))
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Networks::Json(items, refs));
    }
    trimmed
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(csv_ref)
        .collect::<Result<Vec<_>, _>>()
        .map(Networks::Csv)
}

fn json_ref(item: &Value) -> Option<NetworkRef> {
    let text = |key: &str| {
        item.get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    Some(NetworkRef {
        namespace: text("namespace"),
        name: text("name")?,
        interface: text("interface"),
    })
}

fn csv_ref(item: &str) -> Result<NetworkRef, String> {
    let (rest, interface) = match item.split_once('@') {
        Some((rest, interface)) => (rest, Some(interface)),
        None => (item, None),
    };
    let (namespace, name) = match rest.split_once('/') {
        Some((namespace, name)) => (Some(namespace), name),
        None => (None, rest),
    };
    let bad = |part: &str| {
        part.is_empty() || part.contains(['/', '@']) || part.contains(char::is_whitespace)
    };
    if bad(name) || namespace.is_some_and(bad) || interface.is_some_and(bad) {
        return Err(format!(
            "entry {item:?} is not [namespace/]name[@interface]"
        ));
    }
    Ok(NetworkRef {
        namespace: namespace.map(str::to_owned),
        name: name.to_owned(),
        interface: interface.map(str::to_owned),
    })
}

/// Appends the network unless listed.
pub(crate) fn inject(
    builder: &mut PatchBuilder,
    pod: &PodView<'_>,
    network: &NetworkSpec,
    pod_namespace: Option<&str>,
) -> Result<(), Halt> {
    let ours = NetworkRef::from_spec(network);
    let current = pod.annotation(names::MULTUS_NETWORKS);
    let parsed = parse(current.unwrap_or_default()).map_err(|why| {
        Halt::Deny(
            DenyReason::BadAnnotation,
            format!(
                "annotation {} cannot be read ({why}), so the rdma-streams network cannot be \
                 added",
                names::MULTUS_NETWORKS
            ),
        )
    })?;
    if parsed
        .refs()
        .iter()
        .any(|r| r.same_network(&ours, pod_namespace))
    {
        return Ok(());
    }
    let pointer = annotation_pointer(names::MULTUS_NETWORKS);
    let new = match (&parsed, current) {
        (Networks::Json(items, _), _) => {
            let mut items = items.clone();
            items.push(ours.to_json());
            serde_json::to_string(&items)?
        }
        (Networks::Csv(_), Some(text)) => {
            let kept = text.trim_end().trim_end_matches(',').trim_end();
            format!("{kept},{}", ours.to_csv())
        }
        (Networks::Empty, _) | (Networks::Csv(_), None) => ours.to_csv(),
    };
    match current {
        Some(old) => builder.replace_tested(pointer, json!(old), json!(new)),
        None => {
            builder.ensure(
                &PointerBuf::root(),
                &["metadata", "annotations"],
                Kind::Object,
            )?;
            builder.add(pointer, json!(new))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(namespace: Option<&str>, name: &str, interface: Option<&str>) -> NetworkRef {
        NetworkRef {
            namespace: namespace.map(str::to_owned),
            name: name.to_owned(),
            interface: interface.map(str::to_owned),
        }
    }

    #[test]
    fn parses_the_comma_form() {
        assert_eq!(
            parse(" a, ns/b@net1 ,c@eth9,").expect("parse"),
            Networks::Csv(vec![
                r(None, "a", None),
                r(Some("ns"), "b", Some("net1")),
                r(None, "c", Some("eth9")),
            ])
        );
        assert!(parse("a/b/c").is_err());
        assert!(parse("ns/").is_err());
    }

    #[test]
    fn parses_the_json_form() {
        let parsed =
            parse(r#"[{"name":"a","namespace":"x","interface":"net1","ips":["10.0.0.1/24"]}]"#)
                .expect("parse");
        assert_eq!(parsed.refs(), [r(Some("x"), "a", Some("net1"))]);
        assert!(parse(r#"[{"namespace":"x"}]"#).is_err());
        assert!(parse("[not json").is_err());
        assert_eq!(parse("  ").expect("parse"), Networks::Empty);
    }

    #[test]
    fn same_network_defaults_the_namespace() {
        let pod_ns = Some("team");
        assert!(r(None, "a", None).same_network(&r(Some("team"), "a", Some("x")), pod_ns));
        assert!(!r(None, "a", None).same_network(&r(Some("other"), "a", None), pod_ns));
        assert!(!r(None, "a", None).same_network(&r(None, "b", None), pod_ns));
    }
}
