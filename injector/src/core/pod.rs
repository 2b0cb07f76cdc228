//! A read-only view of the pod JSON: the parts planning reads, with their shapes checked.
//!
//! `null` counts as absent everywhere (YAML `env:` with nothing after it is `null`).

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use serde_json::{Map, Value};

use super::{DenyReason, Halt};

/// Which list a container sits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ContainerList {
    Containers,
    InitContainers,
}

impl ContainerList {
    pub(crate) fn key(self) -> &'static str {
        match self {
            Self::Containers => "containers",
            Self::InitContainers => "initContainers",
        }
    }
}

/// One container.
#[derive(Debug, Clone)]
pub(crate) struct ContainerView<'a> {
    pub list: ContainerList,
    pub index: usize,
    pub name: &'a str,
    pub raw: &'a Map<String, Value>,
}

impl<'a> ContainerView<'a> {
    /// `/spec/<list>/<index>`.
    pub(crate) fn pointer(&self) -> PointerBuf {
        PointerBuf::from_tokens(["spec", self.list.key()]).with_trailing_token(self.index)
    }

    /// A field, `null` meaning absent.
    pub(crate) fn field(&self, key: &str) -> Option<&'a Value> {
        non_null(self.raw.get(key))
    }

    /// A list field (`env`, `volumeMounts`); a non-list is a malformed pod.
    pub(crate) fn list(&self, key: &str) -> Result<&'a [Value], Halt> {
        match self.field(key) {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(other) => Err(malformed(
                &format!("{}/{key}", self.pointer()),
                "a list",
                other,
            )),
        }
    }

    /// An object reached by a chain of keys (`["resources", "requests"]`), if present.
    pub(crate) fn object_at(&self, keys: &[&str]) -> Result<Option<&'a Map<String, Value>>, Halt> {
        let mut current = self.raw;
        let mut path = self.pointer().to_string();
        for key in keys {
            path.push('/');
            path.push_str(key);
            match non_null(current.get(*key)) {
                None => return Ok(None),
                Some(Value::Object(map)) => current = map,
                Some(other) => return Err(malformed(&path, "an object", other)),
            }
        }
        Ok(Some(current))
    }

    /// `securityContext.privileged == true`.
    pub(crate) fn privileged(&self) -> bool {
        self.field("securityContext")
            .and_then(|sc| sc.get("privileged"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }
}

/// The pod's metadata and containers.
#[derive(Debug, Clone)]
pub(crate) struct PodView<'a> {
    pub labels: BTreeMap<&'a str, &'a str>,
    pub annotations: BTreeMap<&'a str, &'a str>,
    pub namespace: Option<&'a str>,
    pub containers: Vec<ContainerView<'a>>,
    pub init_containers: Vec<ContainerView<'a>>,
    pub raw: &'a Value,
}

impl<'a> PodView<'a> {
    /// `Ok(Err(why))` when the object is not a v1 Pod; `Err` when it is one with a malformed
    /// field we must read.
    pub(crate) fn read(raw: &'a Value) -> Result<Result<Self, String>, Halt> {
        let Some(object) = raw.as_object() else {
            return Ok(Err("the object is not a JSON object".to_owned()));
        };
        if let Some(kind) = non_null(object.get("kind"))
            && kind.as_str() != Some("Pod")
        {
            return Ok(Err(format!("the object is a {kind}, not a Pod")));
        }
        if let Some(api_version) = non_null(object.get("apiVersion"))
            && api_version.as_str() != Some("v1")
        {
            return Ok(Err(format!(
                "the object's apiVersion is {api_version}, not v1"
            )));
        }
        let Some(Value::Object(spec)) = non_null(object.get("spec")) else {
            return Ok(Err("the object has no spec".to_owned()));
        };
        let Some(Value::Array(_)) = non_null(spec.get("containers")) else {
            return Ok(Err("the object has no spec.containers list".to_owned()));
        };

        let metadata = match non_null(object.get("metadata")) {
            None => None,
            Some(Value::Object(metadata)) => Some(metadata),
            Some(other) => return Err(malformed("/metadata", "an object", other)),
        };
        let labels = string_map(metadata, "labels")?;
        let annotations = string_map(metadata, "annotations")?;
        let namespace = metadata
            .and_then(|m| non_null(m.get("namespace")))
            .and_then(Value::as_str);
        let containers = containers(spec, ContainerList::Containers)?;
        let init_containers = containers_or_empty(spec, ContainerList::InitContainers)?;
        Ok(Ok(Self {
            labels,
            annotations,
            namespace,
            containers,
            init_containers,
            raw,
        }))
    }

    pub(crate) fn label(&self, key: &str) -> Option<&'a str> {
        self.labels.get(key).copied()
    }

    pub(crate) fn annotation(&self, key: &str) -> Option<&'a str> {
        self.annotations.get(key).copied()
    }

    /// Containers and init containers.
    pub(crate) fn all_containers(&self) -> impl Iterator<Item = &ContainerView<'a>> {
        self.containers.iter().chain(self.init_containers.iter())
    }

    pub(crate) fn container_index(&self, name: &str) -> Option<usize> {
        self.containers.iter().position(|c| c.name == name)
    }

    /// `spec.volumes`, absent meaning empty.
    pub(crate) fn volumes(&self) -> Result<&'a [Value], Halt> {
        match self.raw.pointer("/spec/volumes") {
            None | Some(Value::Null) => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(other) => Err(malformed("/spec/volumes", "a list", other)),
        }
    }
}

fn string_map<'a>(
    metadata: Option<&'a Map<String, Value>>,
    key: &str,
) -> Result<BTreeMap<&'a str, &'a str>, Halt> {
    let Some(metadata) = metadata else {
        return Ok(BTreeMap::new());
    };
    match non_null(metadata.get(key)) {
        None => Ok(BTreeMap::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.as_str(), s.as_str())),
                other => Err(malformed(
                    &format!(
                        "/metadata/{key}/{}",
                        k.replace('~', "~0").replace('/', "~1")
                    ),
                    "a string",
                    other,
                )),
            })
            .collect(),
        Some(other) => Err(malformed(&format!("/metadata/{key}"), "an object", other)),
    }
}

fn containers<'a>(
    spec: &'a Map<String, Value>,
    list: ContainerList,
) -> Result<Vec<ContainerView<'a>>, Halt> {
    let Some(Value::Array(items)) = non_null(spec.get(list.key())) else {
        return Ok(Vec::new());
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let path = format!("/spec/{}/{index}", list.key());
            let Value::Object(raw) = item else {
                return Err(malformed(&path, "an object", item));
            };
            let Some(Value::String(name)) = raw.get("name") else {
                return Err(Halt::Deny(
                    DenyReason::MalformedPod,
                    format!("{path} has no name"),
                ));
            };
            Ok(ContainerView {
                list,
                index,
                name,
                raw,
            })
        })
        .collect()
}

fn containers_or_empty<'a>(
    spec: &'a Map<String, Value>,
    list: ContainerList,
) -> Result<Vec<ContainerView<'a>>, Halt> {
    match non_null(spec.get(list.key())) {
        None | Some(Value::Array(_)) => containers(spec, list),
        Some(other) => Err(malformed(&format!("/spec/{}", list.key()), "a list", other)),
    }
}

pub(crate) fn non_null(value: Option<&Value>) -> Option<&Value> {
    value.filter(|v| !v.is_null())
}

/// A denial for a field of the wrong JSON type.
pub(crate) fn malformed(path: &str, expected: &str, found: &Value) -> Halt {
    let found = match found {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    };
    Halt::Deny(
        DenyReason::MalformedPod,
        format!("pod field {path} must be {expected}, found {found}"),
    )
}
