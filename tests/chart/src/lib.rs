//! Helpers for the tests of `charts/rdma-streams`: finding `helm` and `kubernetes-validate`,
//! rendering the chart with a value set, and running commands under a deadline.
//!
//! Tools:
//! - `helm`: `$HELM`, else `.tools/bin/helm` under the repository root (`make deps` puts it
//!   there). Missing: the test prints why and passes, unless `RDMA_REQUIRE_HELM=1`, which
//!   makes it fail (`make test` sets it).
//! - `kubernetes-validate`: `$KUBERNETES_VALIDATE`, else on `PATH`; required when
//!   `RDMA_REQUIRE_KUBERNETES_VALIDATE=1`.
// Only the chart's tests link this crate: a panic is how its helpers fail the calling test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

/// Release name every test renders with (also the one `manifests/` uses).
pub const RELEASE: &str = "rdma-streams";
/// Release namespace every test renders into.
pub const NAMESPACE: &str = "rdma-streams";
/// Namespaces the webhook must never select, besides the release namespace.
pub const SYSTEM_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];
/// Deadline of one `helm` call.
pub const HELM_TIMEOUT: Duration = Duration::from_secs(60);
/// Deadline of one `kubernetes-validate` call (it loads the schemas of every kind it meets).
pub const VALIDATE_TIMEOUT: Duration = Duration::from_secs(180);

const HELM_ENV: &str = "HELM";
const REQUIRE_HELM: &str = "RDMA_REQUIRE_HELM";
const KV_ENV: &str = "KUBERNETES_VALIDATE";
const REQUIRE_KV: &str = "RDMA_REQUIRE_KUBERNETES_VALIDATE";

/// A named value set: the chart's defaults plus these files from `tests/chart/values/`.
#[derive(Debug, Clone, Copy)]
pub struct ValueSet {
    pub name: &'static str,
    pub files: &'static [&'static str],
}

/// Every value set the tests render: the defaults and one per feature.
pub const VALUE_SETS: &[ValueSet] = &[
    ValueSet {
        name: "default",
        files: &[],
    },
    ValueSet {
        name: "cert-manager",
        files: &["cert-manager.yaml"],
    },
    ValueSet {
        name: "injector-certs",
        files: &["injector-certs.yaml"],
    },
    ValueSet {
        name: "kubevirt",
        files: &["kubevirt.yaml"],
    },
    ValueSet {
        name: "cdi",
        files: &["cdi.yaml"],
    },
    ValueSet {
        name: "host-path",
        files: &["host-path.yaml"],
    },
    ValueSet {
        name: "image-volume",
        files: &["image-volume.yaml"],
    },
    ValueSet {
        name: "no-cluster-access",
        files: &["no-cluster-access.yaml"],
    },
    ValueSet {
        name: "everything",
        files: &["everything.yaml", "cert-manager.yaml"],
    },
];

/// The value set called `name`.
pub fn value_set(name: &str) -> ValueSet {
    *VALUE_SETS
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no value set {name:?}"))
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// `charts/rdma-streams`.
pub fn chart_dir() -> PathBuf {
    repo_root().join("charts/rdma-streams")
}

fn values_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("values")
}

fn required(var: &str) -> bool {
    std::env::var(var).as_deref() == Ok("1")
}

#[allow(clippy::print_stderr)]
fn skip(tool: &str, why: &str, require: &str) {
    eprintln!("skipping: {tool} is not available ({why}); set {require}=1 to make this a failure");
}

/// The `helm` binary, or `None` (after a skip notice) when it is missing and not required.
pub fn helm() -> Option<PathBuf> {
    let path = match std::env::var_os(HELM_ENV).filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => repo_root().join(".tools/bin/helm"),
    };
    if path.is_file() {
        return Some(path);
    }
    let why = format!("{} does not exist; `make deps` installs it", path.display());
    assert!(!required(REQUIRE_HELM), "{REQUIRE_HELM}=1 but {why}");
    skip("helm", &why, REQUIRE_HELM);
    None
}

/// The `kubernetes-validate` binary, or `None` (after a skip notice) when it is missing and not
/// required.
pub fn kubernetes_validate() -> Option<PathBuf> {
    let found = match std::env::var_os(KV_ENV).filter(|p| !p.is_empty()) {
        Some(p) => {
            let p = PathBuf::from(p);
            if p.is_file() {
                Ok(p)
            } else {
                Err(format!("{KV_ENV}={} does not exist", p.display()))
            }
        }
        None => std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .map(|dir| dir.join("kubernetes-validate"))
            .find(|c| c.is_file())
            .ok_or_else(|| format!("not on PATH and {KV_ENV} is not set")),
    };
    match found {
        Ok(p) => Some(p),
        Err(why) => {
            assert!(
                !required(REQUIRE_KV),
                "{REQUIRE_KV}=1 but kubernetes-validate is missing: {why}; `make deps` installs it"
            );
            skip("kubernetes-validate", &why, REQUIRE_KV);
            None
        }
    }
}

pub use rdma_streams_testkit::process::{Output, run};

/// `--values FILE` arguments of a value set.
pub fn values_args(set: ValueSet) -> Vec<String> {
    set.files
        .iter()
        .flat_map(|file| {
            [
                "--values".to_string(),
                values_dir().join(file).display().to_string(),
            ]
        })
        .collect()
}

/// `helm template` arguments for a value set, plus `extra` (`--set`, `--kube-version`, ...).
pub fn template_args(set: ValueSet, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "template".into(),
        RELEASE.into(),
        chart_dir().display().to_string(),
        "--namespace".into(),
        NAMESPACE.into(),
    ];
    args.extend(values_args(set));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Runs `helm` with `args`.
pub fn helm_run(helm: &Path, args: &[String]) -> Output {
    run(Command::new(helm).args(args), HELM_TIMEOUT)
}

/// Renders a value set. Panics with helm's message when rendering fails.
pub fn render(helm: &Path, set: ValueSet, extra: &[&str]) -> Rendered {
    let out = helm_run(helm, &template_args(set, extra));
    assert!(
        out.status.success(),
        "helm template ({} {extra:?}) failed: {}",
        set.name,
        out.stderr
    );
    Rendered::parse(&out.stdout).unwrap_or_else(|e| panic!("{}: {e}", set.name))
}

/// Every value set rendered, by name; `None` without helm (the caller skips).
pub fn every_set() -> Option<Vec<(&'static str, Rendered)>> {
    let helm = helm()?;
    Some(
        VALUE_SETS
            .iter()
            .map(|s| (s.name, render(&helm, *s, &[])))
            .collect(),
    )
}

/// Renders a value set that must fail; returns helm's error text.
pub fn render_error(helm: &Path, set: ValueSet, extra: &[&str]) -> String {
    let out = helm_run(helm, &template_args(set, extra));
    assert!(
        !out.status.success(),
        "helm template ({} {extra:?}) should have failed but rendered",
        set.name
    );
    out.stderr
}

/// The rendered documents of one `helm template` run.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub text: String,
    pub docs: Vec<Value>,
}

impl Rendered {
    /// Parses a multi-document YAML stream (empty documents dropped).
    pub fn parse(text: &str) -> Result<Rendered, String> {
        let docs: Vec<Value> = rdma_streams_yaml::documents(text).map_err(|e| e.to_string())?;
        let docs = docs.into_iter().filter(|d| !d.is_null()).collect();
        Ok(Rendered {
            text: text.to_string(),
            docs,
        })
    }

    /// Every document of `kind`.
    pub fn all(&self, kind: &str) -> Vec<&Value> {
        self.docs.iter().filter(|d| d["kind"] == kind).collect()
    }

    /// The document of `kind` named `name`, if any.
    pub fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.docs
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
    }

    /// The document of `kind` named `name`; panics when missing.
    pub fn get(&self, kind: &str, name: &str) -> &Value {
        self.find(kind, name).unwrap_or_else(|| {
            panic!(
                "no {kind} {name}; rendered: {:?}",
                self.docs.iter().map(ident).collect::<Vec<_>>()
            )
        })
    }

    /// Deployments and DaemonSets.
    pub fn workloads(&self) -> Vec<&Value> {
        self.docs
            .iter()
            .filter(|d| d["kind"] == "Deployment" || d["kind"] == "DaemonSet")
            .collect()
    }

    /// `data[key]` of the ConfigMap `name`.
    pub fn configmap_data(&self, name: &str, key: &str) -> &str {
        self.get("ConfigMap", name)["data"][key]
            .as_str()
            .unwrap_or_else(|| panic!("ConfigMap {name} has no data key {key}"))
    }
}

/// `Kind/name` of a document, for messages.
pub fn ident(doc: &Value) -> String {
    format!(
        "{}/{}",
        doc["kind"].as_str().unwrap_or("?"),
        doc["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// A name prefixed with the chart's fullname for the test release (`rdma-streams-<suffix>`).
pub fn named(suffix: &str) -> String {
    format!("{RELEASE}-{suffix}")
}

/// Containers and init containers of a pod spec.
pub fn all_containers(pod_spec: &Value) -> Vec<&Value> {
    ["initContainers", "containers"]
        .iter()
        .filter_map(|k| pod_spec[*k].as_array())
        .flatten()
        .collect()
}

/// `{name: value}` of a container's env as the process sees it in a pod: downward-API
/// `fieldRef`s resolved to sample values of their kind (the release namespace, a node name,
/// an IP address); any other reference (Secret, ConfigMap) is an error.
pub fn resolved_env(
    container: &Value,
) -> Result<std::collections::BTreeMap<String, String>, String> {
    let mut out = std::collections::BTreeMap::new();
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().expect("env name").to_string();
        let value = match (
            e["value"].as_str(),
            e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        ) {
            (Some(v), _) => v.to_string(),
            (None, Some("metadata.namespace")) => NAMESPACE.to_string(),
            (None, Some("metadata.name")) => format!("{RELEASE}-pod"),
            (None, Some("spec.nodeName")) => "node-1".to_string(),
            (None, Some("status.hostIP" | "status.podIP")) => "198.18.0.1".to_string(),
            (None, other) => return Err(format!("{name}: unresolvable env source {other:?}")),
        };
        out.insert(name, value);
    }
    Ok(out)
}

/// `{name: value}` of a container's env (value, or `<valueFrom>` for references).
pub fn env_map(container: &Value) -> std::collections::BTreeMap<String, String> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let name = e["name"].as_str().expect("env name").to_string();
            let value = match e["value"].as_str() {
                Some(v) => v.to_string(),
                None => "<valueFrom>".to_string(),
            };
            (name, value)
        })
        .collect()
}

/// Does the label `selector` (`matchLabels` and `matchExpressions`) select `labels`?
pub fn selects(selector: &Value, labels: &serde_json::Map<String, Value>) -> bool {
    let get = |k: &str| labels.get(k).and_then(Value::as_str);
    let match_labels = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| get(k) == v.as_str());
    let expressions = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            let key = e["key"].as_str().expect("key");
            let values: Vec<&str> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            match e["operator"].as_str().expect("operator") {
                "In" => get(key).is_some_and(|v| values.contains(&v)),
                "NotIn" => get(key).is_none_or(|v| !values.contains(&v)),
                "Exists" => get(key).is_some(),
                "DoesNotExist" => get(key).is_none(),
                other => panic!("unknown selector operator {other}"),
            }
        });
    match_labels && expressions
}

/// Writes each document of `rendered` into `dir` as `<prefix>-<n>.json`; returns the paths.
/// JSON, not YAML: kubernetes-validate reads YAML 1.1, where a plain `on` (which a YAML 1.2
/// writer leaves unquoted) would turn into a boolean.
pub fn write_docs(dir: &Path, prefix: &str, rendered: &Rendered) -> Vec<PathBuf> {
    rendered
        .docs
        .iter()
        .enumerate()
        .map(|(i, doc)| {
            let path = dir.join(format!("{prefix}-{i:02}.json"));
            let text = serde_json::to_string_pretty(doc).expect("encode");
            std::fs::write(&path, text).expect("write");
            path
        })
        .collect()
}

/// The newest Kubernetes version `kubernetes-validate` ships (the default of its `-k`).
pub fn newest_kubernetes(kv: &Path) -> String {
    let out = run(Command::new(kv).arg("--help"), VALIDATE_TIMEOUT);
    let text = out.stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    let after = text
        .split("Defaults to ")
        .nth(1)
        .unwrap_or_else(|| panic!("cannot find the default version in: {text}"));
    after
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .next()
        .map(|v| v.trim_end_matches('.').to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| panic!("cannot read the default version in: {text}"))
}

/// Standard base64 with padding (the chart's `b64enc`, a Secret's `data`); `None` for anything
/// else.
pub fn decode_base64(s: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}

/// The keys of a gateway peer keys file, in order (the first signs, every one verifies), by
/// the contract the chart and the gateway share: one standard base64 key of at least 32 bytes
/// per line, whole-line `#` comments and blank lines ignored, at least one key.
pub fn parse_peer_keys(text: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let key = decode_base64(line)
            .ok_or_else(|| format!("line {}: not standard base64: {line:?}", i + 1))?;
        if key.len() < 32 {
            return Err(format!(
                "line {}: {} bytes, fewer than 32",
                i + 1,
                key.len()
            ));
        }
        keys.push(key);
    }
    if keys.is_empty() {
        return Err("no key".into());
    }
    Ok(keys)
}
