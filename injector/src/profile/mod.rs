//! Injection profiles: the YAML file given with `--config`.
//!
//! ```yaml
//! defaultProfile: default
//! allowedHostPathRoots: [/opt/rdma-streams]
//! profiles:
//!   default:
//!     resource: {name: rdma-streams.io/hca, count: 1}
//!     shim:
//!       delivery: init-copy            # image-volume | init-copy | host-path
//!       image: rdma-streams/shim-bundle:0.1.0
//!       mountPath: /opt/rdma-streams
//!       library: lib/libstreamshim.so  # relative to mountPath
//!     env: {STREAMSHIM_MODE: proxy}
//!     ipcLock: true
//!     network: {name: rdma-net, namespace: rdma, interface: net1}
//!     podSecurity: deny                # deny | degrade
//! ```
//!
//! Parsing is strict (`deny_unknown_fields`): a typo is an error with its line and column, never a
//! silently ignored key. [`Config::validate`] then checks what the schema cannot: names, paths,
//! the delivery fields each mode needs, and that every host path lies under an allowed root.

pub mod watch;

#[cfg(test)]
mod fuzz;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use rdma_streams_common::names::contract::{
    DEFAULT_RESOURCE, SHIM_MODE_ENV, SHIM_MODE_PROXY, SHIM_PROVIDER_ENV,
};
use rdma_streams_common::names::{
    is_dns1123_label, is_dns1123_subdomain, validate_extended_resource_name,
};
use serde::{Deserialize, Deserializer, Serialize};

/// Where the shim directory is mounted in target containers unless the profile says otherwise.
pub const DEFAULT_MOUNT_PATH: &str = "/opt/rdma-streams";
/// The shim library, relative to the mount path.
pub const DEFAULT_LIBRARY: &str = "lib/libstreamshim.so";
/// Directory inside the shim bundle image that `init-copy` copies from.
pub const BUNDLE_DIR: &str = "/bundle";
/// Bundle image of the built-in profile (a neutral placeholder; real installs set their registry).
pub const BUILTIN_SHIM_IMAGE: &str = "rdma-streams/shim-bundle:0.1.0";
/// Name of the built-in default profile.
pub const BUILTIN_PROFILE: &str = "default";

/// Environment variables the injector manages itself; a profile may not set them.
const RESERVED_ENV: &[&str] = &["LD_PRELOAD"];

// === Config ===

/// The whole `--config` file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    /// Profile used when a pod names none with `rdma-streams.io/profile`.
    #[serde(default = "default_profile_name")]
    pub default_profile: String,
    /// Absolute directories on the node under which `host-path` profiles may point.
    #[serde(default)]
    pub allowed_host_path_roots: Vec<String>,
    /// Profiles by name.
    pub profiles: BTreeMap<String, Profile>,
}

/// What one profile injects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Profile {
    /// The extended resource the first target container requests.
    #[serde(default)]
    pub resource: ResourceSpec,
    /// How the shim library reaches the pod.
    pub shim: ShimSpec,
    /// Extra environment for target containers (`STREAMSHIM_*` and the like).
    #[serde(default, deserialize_with = "env_map")]
    pub env: BTreeMap<String, String>,
    /// Add `IPC_LOCK` to target containers (RDMA pins memory).
    #[serde(default = "yes")]
    pub ipc_lock: bool,
    /// Optional Multus network appended to `k8s.v1.cni.cncf.io/networks`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkSpec>,
    /// What to do in namespaces that enforce Pod Security `baseline` or `restricted`.
    #[serde(default)]
    pub pod_security: PodSecurityAction,
}

/// Extended resource name and count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceSpec {
    /// Extended resource name, `domain/name`.
    #[serde(default = "default_resource_name")]
    pub name: String,
    /// How many to request (requests and limits are set equal).
    #[serde(default = "one")]
    pub count: u32,
}

impl Default for ResourceSpec {
    fn default() -> Self {
        Self {
            name: default_resource_name(),
            count: 1,
        }
    }
}

/// How the shim is delivered into the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShimSpec {
    /// Delivery mode.
    pub delivery: ShimDelivery,
    /// Image: for `image-volume` an OCI image whose root holds the bundle; for `init-copy` an
    /// image with the bundle under `/bundle` and a `cp` binary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Pull policy for that image (Kubernetes default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Node directory holding the bundle, for `host-path`; must be under an allowed root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// Where target containers see the bundle (read-only).
    #[serde(default = "default_mount_path")]
    pub mount_path: String,
    /// The shim library, relative to `mountPath`.
    #[serde(default = "default_library")]
    pub library: String,
    /// `init-copy` only: the init container's command. Default:
    /// `cp -R /bundle/. <mountPath>` (see [`ShimSpec::effective_init_command`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_command: Option<Vec<String>>,
}

impl ShimSpec {
    /// Absolute path of the shim library inside target containers (the `LD_PRELOAD` entry).
    pub fn library_path(&self) -> String {
        format!(
            "{}/{}",
            self.mount_path.trim_end_matches('/'),
            self.library.trim_start_matches("./")
        )
    }

    /// The `init-copy` command: the configured one, else `cp -R /bundle/. <mountPath>`.
    ///
    /// `-R` rather than `-a`: the init container runs as a non-root user, where preserving
    /// ownership cannot work (busybox `cp -a` reports it as an error); `-R` keeps symlinks
    /// (`libstreamshim.so -> libstreamshim.so.0`) in both GNU and busybox `cp`, and the copies
    /// get mode 0644/0755 under the default umask, readable by any user in the app containers.
    pub fn effective_init_command(&self) -> Vec<String> {
        match &self.init_command {
            Some(command) => command.clone(),
            None => vec![
                "cp".to_owned(),
                "-R".to_owned(),
                format!("{BUNDLE_DIR}/."),
                self.mount_path.clone(),
            ],
        }
    }
}

/// Shim delivery modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShimDelivery {
    /// An `image` volume (Kubernetes >= 1.33 with the ImageVolume feature) mounted read-only.
    ImageVolume,
    /// An init container copies the bundle into an `emptyDir`.
    InitCopy,
    /// A `hostPath` directory installed on the node (forbidden by Pod Security baseline).
    HostPath,
}

impl ShimDelivery {
    /// The spelling used in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ImageVolume => "image-volume",
            Self::InitCopy => "init-copy",
            Self::HostPath => "host-path",
        }
    }
}

impl fmt::Display for ShimDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Kubernetes image pull policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PullPolicy {
    /// Always pull.
    Always,
    /// Pull when the node lacks the image.
    IfNotPresent,
    /// Never pull.
    Never,
}

impl PullPolicy {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// A Multus network attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkSpec {
    /// NetworkAttachmentDefinition name.
    pub name: String,
    /// Its namespace; absent means the pod's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Interface name inside the pod (`@if`); absent lets Multus choose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
}

/// Behaviour in namespaces enforcing Pod Security `baseline` or `restricted`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PodSecurityAction {
    /// Deny the pod, saying what to change.
    #[default]
    Deny,
    /// Inject without `IPC_LOCK` and without host paths, with a warning.
    Degrade,
}

impl PodSecurityAction {
    /// The spelling used in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deny => "deny",
            Self::Degrade => "degrade",
        }
    }
}

// === Errors ===

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    /// The file could not be read.
    #[error("cannot read profile config {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The YAML is malformed or does not match the schema (unknown key, wrong type).
    #[error("{origin}{}: {message}", location_suffix(*line, *column))]
    Syntax {
        /// File name or other origin given to [`parse`].
        origin: String,
        /// One-based line, when known.
        line: Option<usize>,
        /// One-based column, when known.
        column: Option<usize>,
        /// What is wrong.
        message: String,
    },
    /// The YAML parsed but breaks a rule.
    #[error("{origin}: invalid profile config: {}", problems.join("; "))]
    Invalid {
        /// File name or other origin.
        origin: String,
        /// Every problem found, each naming its field.
        problems: Vec<String>,
    },
}

fn location_suffix(line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(line), Some(column)) => format!(":{line}:{column}"),
        (Some(line), None) => format!(":{line}"),
        _ => String::new(),
    }
}

// === Loading ===

/// Reads and validates a config file.
pub fn load(path: &Path) -> Result<Config, ProfileError> {
    let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(&text, &path.display().to_string())
}

/// Parses and validates config text; `origin` names it in errors (a file name, `<builtin>`).
pub fn parse(text: &str, origin: &str) -> Result<Config, ProfileError> {
    let config: Config =
        rdma_streams_yaml::from_str(text).map_err(|error| syntax_error(&error, origin))?;
    config.validate_as(origin)?;
    Ok(config)
}

fn syntax_error(error: &rdma_streams_yaml::Error, origin: &str) -> ProfileError {
    ProfileError::Syntax {
        origin: origin.to_owned(),
        line: error.line(),
        column: error.column(),
        message: error.message().to_owned(),
    }
}

/// Verbs providers in the shim bundle image (`<mount>/lib/libibverbs/lib<name>-rdmav*.so`); the
/// chart's `shim.verbsProviders` default is the same list.
pub const BUNDLED_VERBS_PROVIDERS: [&str; 15] = [
    "mlx5",
    "mlx4",
    "rxe",
    "efa",
    "bnxt_re",
    "cxgb4",
    "hfi1verbs",
    "hns",
    "i40iw",
    "ipathverbs",
    "mthca",
    "ocrdma",
    "qedr",
    "siw",
    "vmw_pvrdma",
];

/// The built-in profile's env: proxy mode, and the RDMA libraries shipped in the bundle
/// mounted at `mount` (`STREAMSHIM_PROVIDER`, `RDMAV_DRIVERS`), so app images need no
/// rdma-core (the chart sets the same with `shim.bundledProvider`).
fn builtin_env(mount: &str) -> BTreeMap<String, String> {
    let drivers: Vec<String> = BUNDLED_VERBS_PROVIDERS
        .iter()
        .map(|p| format!("{mount}/lib/libibverbs/lib{p}"))
        .collect();
    BTreeMap::from([
        (SHIM_MODE_ENV.to_owned(), SHIM_MODE_PROXY.to_owned()),
        (
            SHIM_PROVIDER_ENV.to_owned(),
            format!("{mount}/lib/librdmacm.so.1"),
        ),
        ("RDMAV_DRIVERS".to_owned(), drivers.join(":")),
    ])
}

// === impl Config ===

impl Config {
    /// The embedded default: used by `inject -f` without `--config` and by `make demo`.
    ///
    /// One profile, `default`: `rdma-streams.io/hca` x1, `init-copy` delivery from
    /// [`BUILTIN_SHIM_IMAGE`], `STREAMSHIM_MODE=proxy` and the bundled provider
    /// (`STREAMSHIM_PROVIDER`, `RDMAV_DRIVERS`), `IPC_LOCK`, no Multus network,
    /// `podSecurity: deny`.
    pub fn builtin_default() -> Self {
        let profile = Profile {
            resource: ResourceSpec::default(),
            shim: ShimSpec {
                delivery: ShimDelivery::InitCopy,
                image: Some(BUILTIN_SHIM_IMAGE.to_owned()),
                image_pull_policy: None,
                host_path: None,
                mount_path: default_mount_path(),
                library: default_library(),
                init_command: None,
            },
            env: builtin_env(&default_mount_path()),
            ipc_lock: true,
            network: None,
            pod_security: PodSecurityAction::Deny,
        };
        Self {
            default_profile: BUILTIN_PROFILE.to_owned(),
            allowed_host_path_roots: Vec::new(),
            profiles: BTreeMap::from([(BUILTIN_PROFILE.to_owned(), profile)]),
        }
    }

    /// A profile by name.
    pub fn profile(&self, name: &str) -> Option<&Profile> {
        self.profiles.get(name)
    }

    /// Profile names, sorted.
    pub fn profile_names(&self) -> Vec<&str> {
        self.profiles.keys().map(String::as_str).collect()
    }

    /// The config as YAML (for `make demo` and docs).
    pub fn to_yaml(&self) -> Result<String, rdma_streams_yaml::Error> {
        rdma_streams_yaml::to_string(self)
    }

    /// Checks every rule the schema cannot express.
    pub fn validate(&self) -> Result<(), ProfileError> {
        self.validate_as("<config>")
    }

    fn validate_as(&self, origin: &str) -> Result<(), ProfileError> {
        let problems = self.problems();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ProfileError::Invalid {
                origin: origin.to_owned(),
                problems,
            })
        }
    }

    /// Every rule violation, each message naming its field.
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (index, root) in self.allowed_host_path_roots.iter().enumerate() {
            if let Err(why) = check_node_path(root) {
                problems.push(format!("allowedHostPathRoots[{index}] {root:?}: {why}"));
            }
        }
        if self.profiles.is_empty() {
            problems.push("profiles: at least one profile is required".to_owned());
        } else if !self.profiles.contains_key(&self.default_profile) {
            problems.push(format!(
                "defaultProfile {:?} is not among the profiles ({})",
                self.default_profile,
                self.profile_names().join(", ")
            ));
        }
        for (name, profile) in &self.profiles {
            let at = format!("profiles.{name}");
            if !is_profile_name(name) {
                problems.push(format!(
                    "{at}: profile names use letters, digits, '-', '_' and '.' (at most 63)"
                ));
            }
            profile.check(&at, &self.allowed_host_path_roots, &mut problems);
        }
        problems
    }
}

impl Default for Config {
    fn default() -> Self {
        Self::builtin_default()
    }
}

// === impl Profile ===

impl Profile {
    fn check(&self, at: &str, roots: &[String], problems: &mut Vec<String>) {
        if let Err(why) = validate_extended_resource_name(&self.resource.name) {
            problems.push(format!("{at}.resource.name: {why}"));
        }
        if self.resource.count == 0 {
            problems.push(format!("{at}.resource.count must be at least 1"));
        }
        self.shim.check(&format!("{at}.shim"), roots, problems);
        for name in self.env.keys() {
            if RESERVED_ENV.contains(&name.as_str()) {
                problems.push(format!(
                    "{at}.env.{name}: managed by the injector (it appends the shim to it)"
                ));
            } else if !is_env_name(name) {
                problems.push(format!(
                    "{at}.env {name:?}: not a valid environment variable name \
                     (letters, digits, '_', '-', '.'; not starting with a digit)"
                ));
            }
        }
        if let Some(network) = &self.network {
            if !is_dns1123_subdomain(&network.name) {
                problems.push(format!(
                    "{at}.network.name {:?}: not a valid object name (DNS-1123 subdomain)",
                    network.name
                ));
            }
            if let Some(namespace) = &network.namespace
                && !is_dns1123_label(namespace)
            {
                problems.push(format!(
                    "{at}.network.namespace {namespace:?}: not a valid namespace (DNS-1123 label)"
                ));
            }
            if let Some(interface) = &network.interface
                && !is_interface_name(interface)
            {
                problems.push(format!(
                    "{at}.network.interface {interface:?}: 1-15 characters, none of '/', ':', \
                     '@', ',', quotes or whitespace"
                ));
            }
        }
    }
}

// === impl ShimSpec ===

impl ShimSpec {
    fn check(&self, at: &str, roots: &[String], problems: &mut Vec<String>) {
        match self.delivery {
            ShimDelivery::ImageVolume | ShimDelivery::InitCopy => {
                match &self.image {
                    None => problems.push(format!(
                        "{at}.image is required for delivery {}",
                        self.delivery
                    )),
                    Some(image) if !is_image_reference(image) => {
                        problems.push(format!("{at}.image {image:?}: not an image reference"))
                    }
                    Some(_) => {}
                }
                if self.host_path.is_some() {
                    problems.push(format!(
                        "{at}.hostPath is only used with delivery host-path (this one is {})",
                        self.delivery
                    ));
                }
            }
            ShimDelivery::HostPath => match &self.host_path {
                None => problems.push(format!("{at}.hostPath is required for delivery host-path")),
                Some(path) => {
                    if let Err(why) = check_node_path(path) {
                        problems.push(format!("{at}.hostPath {path:?}: {why}"));
                    } else if !roots.iter().any(|root| Path::new(path).starts_with(root)) {
                        problems.push(format!(
                            "{at}.hostPath {path:?} is not under any allowedHostPathRoots ({})",
                            if roots.is_empty() {
                                "none are configured".to_owned()
                            } else {
                                roots.join(", ")
                            }
                        ));
                    }
                    // The image stays allowed: it is the init-copy fallback in `degrade` mode.
                    if let Some(image) = &self.image
                        && !is_image_reference(image)
                    {
                        problems.push(format!("{at}.image {image:?}: not an image reference"));
                    }
                }
            },
        }
        if self.init_command.is_some() && !self.may_use_init_copy() {
            problems.push(format!(
                "{at}.initCommand is only used with delivery init-copy (or host-path with an \
                 image, as its fallback)"
            ));
        }
        if let Some(command) = &self.init_command
            && (command.is_empty() || command[0].is_empty())
        {
            problems.push(format!("{at}.initCommand must name a program"));
        }
        if let Err(why) = check_node_path(&self.mount_path) {
            problems.push(format!("{at}.mountPath {:?}: {why}", self.mount_path));
        } else if self.mount_path == "/" {
            problems.push(format!("{at}.mountPath must not be /"));
        }
        if let Err(why) = check_relative_path(&self.library) {
            problems.push(format!("{at}.library {:?}: {why}", self.library));
        }
    }

    fn may_use_init_copy(&self) -> bool {
        match self.delivery {
            ShimDelivery::InitCopy => true,
            ShimDelivery::HostPath => self.image.is_some(),
            ShimDelivery::ImageVolume => false,
        }
    }
}

// === Name and path rules ===

/// Characters that would split or corrupt an `LD_PRELOAD` list or a YAML/JSON value.
fn has_separator(text: &str) -> bool {
    text.chars()
        .any(|c| c == ':' || c == ',' || c.is_whitespace() || c.is_control())
}

/// An absolute, normalised path (no `.`/`..`, no `//`, no trailing `/` except for `/` itself).
fn check_node_path(path: &str) -> Result<(), &'static str> {
    if !path.starts_with('/') {
        return Err("must be absolute");
    }
    if has_separator(path) {
        return Err("must not contain ':', ',', whitespace or control characters");
    }
    if path.len() > 1 && path.ends_with('/') {
        return Err("must not end with '/'");
    }
    if path.contains("//") {
        return Err("must not contain '//'");
    }
    if path
        .split('/')
        .any(|segment| segment == "." || segment == "..")
    {
        return Err("must not contain '.' or '..' components");
    }
    Ok(())
}

fn check_relative_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("must not be empty");
    }
    if path.starts_with('/') {
        return Err("must be relative to mountPath");
    }
    if has_separator(path) {
        return Err("must not contain ':', ',', whitespace or control characters");
    }
    if path.ends_with('/') {
        return Err("must name a file");
    }
    if path.split('/').any(|segment| segment == "..") {
        return Err("must not contain '..'");
    }
    Ok(())
}

/// The classic Kubernetes env var name rule (`[-._a-zA-Z][-._a-zA-Z0-9]*`), which every
/// supported version accepts.
pub(crate) fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    match bytes.next() {
        Some(first) if first.is_ascii_alphabetic() || matches!(first, b'_' | b'-' | b'.') => {}
        _ => return false,
    }
    bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn is_profile_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn is_interface_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && !name.chars().any(|c| {
            matches!(c, '/' | ':' | '@' | ',' | '"' | '\'') || c.is_whitespace() || c.is_control()
        })
}

/// A loose image reference check: non-empty, no whitespace, no leading separator.
fn is_image_reference(image: &str) -> bool {
    !image.is_empty()
        && !image.starts_with(['/', ':', '@'])
        && !image.chars().any(|c| c.is_whitespace() || c.is_control())
}

// === serde helpers ===

fn default_profile_name() -> String {
    BUILTIN_PROFILE.to_owned()
}

fn default_resource_name() -> String {
    DEFAULT_RESOURCE.to_owned()
}

fn default_mount_path() -> String {
    DEFAULT_MOUNT_PATH.to_owned()
}

fn default_library() -> String {
    DEFAULT_LIBRARY.to_owned()
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

/// Env values as strings; YAML scalars such as `1` or `true` are accepted and kept as written
/// (`STREAMSHIM_DISABLE: 1` is what people type), mappings and lists are errors; `env:` with
/// nothing after it is an empty map.
fn env_map<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Scalar {
        Text(String),
        Bool(bool),
        Int(i64),
        Uint(u64),
        Float(f64),
    }
    let raw = Option::<BTreeMap<String, Scalar>>::deserialize(deserializer)?;
    Ok(raw
        .unwrap_or_default()
        .into_iter()
        .map(|(name, value)| {
            let value = match value {
                Scalar::Text(text) => text,
                Scalar::Bool(b) => b.to_string(),
                Scalar::Int(i) => i.to_string(),
                Scalar::Uint(u) => u.to_string(),
                Scalar::Float(f) => f.to_string(),
            };
            (name, value)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_PROFILES: &str = include_str!("../../tests/data/config/profiles.yaml");

    fn problems_of(text: &str) -> Vec<String> {
        match parse(text, "test.yaml") {
            Err(ProfileError::Invalid { problems, .. }) => problems,
            other => panic!("expected validation problems, got {other:?}"),
        }
    }

    fn minimal(profile_body: &str) -> String {
        format!("profiles:\n  default:\n{profile_body}")
    }

    #[test]
    fn builtin_default_is_valid_and_round_trips() {
        let config = Config::builtin_default();
        config.validate().expect("builtin default validates");
        assert_eq!(config.default_profile, "default");
        let profile = config.profile("default").expect("default profile");
        assert_eq!(profile.shim.delivery, ShimDelivery::InitCopy);
        assert_eq!(profile.shim.image.as_deref(), Some(BUILTIN_SHIM_IMAGE));
        assert_eq!(profile.resource, ResourceSpec::default());
        assert_eq!(
            profile.env.get("STREAMSHIM_MODE").map(String::as_str),
            Some("proxy")
        );
        assert!(profile.ipc_lock);
        assert!(profile.network.is_none());
        assert_eq!(profile.pod_security, PodSecurityAction::Deny);
        let yaml = config.to_yaml().expect("yaml");
        assert_eq!(parse(&yaml, "<roundtrip>").expect("parse"), config);
    }

    #[test]
    fn the_test_profiles_parse() {
        let config = parse(TEST_PROFILES, "profiles.yaml").expect("valid");
        assert_eq!(
            config.profile_names(),
            [
                "default",
                "degrade",
                "hostpath",
                "hostpath-only",
                "image",
                "net",
                "no-ipc"
            ]
        );
        let image = config.profile("image").expect("image");
        assert_eq!(image.resource.count, 2);
        assert_eq!(image.shim.image_pull_policy, Some(PullPolicy::IfNotPresent));
        assert_eq!(
            image.env["STREAMSHIM_DISABLE"], "0",
            "YAML integers become strings"
        );
    }

    #[test]
    fn defaults_fill_a_minimal_profile() {
        let config = parse(
            &minimal("    shim: {delivery: init-copy, image: bundle:1}\n"),
            "min.yaml",
        )
        .expect("valid");
        let profile = config.profile("default").expect("default");
        assert_eq!(config.default_profile, "default");
        assert_eq!(profile.resource.name, DEFAULT_RESOURCE);
        assert_eq!(profile.resource.count, 1);
        assert_eq!(profile.shim.mount_path, DEFAULT_MOUNT_PATH);
        assert_eq!(profile.shim.library, DEFAULT_LIBRARY);
        assert_eq!(
            profile.shim.library_path(),
            "/opt/rdma-streams/lib/libstreamshim.so"
        );
        assert_eq!(
            profile.shim.effective_init_command(),
            ["cp", "-R", "/bundle/.", "/opt/rdma-streams"]
        );
        assert!(profile.ipc_lock);
        assert!(profile.env.is_empty());
        assert_eq!(profile.pod_security, PodSecurityAction::Deny);
    }

    #[test]
    fn unknown_fields_are_errors_with_line_and_column() {
        let text = "profiles:\n  default:\n    shim:\n      delivery: init-copy\n      image: b:1\n      mountpath: /x\n";
        match parse(text, "typo.yaml") {
            Err(error @ ProfileError::Syntax { .. }) => {
                let ProfileError::Syntax {
                    line,
                    column,
                    message,
                    ..
                } = &error
                else {
                    unreachable!()
                };
                assert_eq!(*line, Some(6), "{error}");
                assert_eq!(*column, Some(7), "{error}");
                assert!(message.contains("unknown field `mountpath`"), "{message}");
                assert!(
                    !message.contains(" at line "),
                    "location not repeated: {message}"
                );
                assert!(error.to_string().starts_with("typo.yaml:6:7: "), "{error}");
            }
            other => panic!("expected a syntax error, got {other:?}"),
        }
    }

    #[test]
    fn wrong_types_and_bad_enums_are_syntax_errors() {
        for (text, needle) in [
            (
                minimal("    shim: {delivery: floppy, image: b:1}\n"),
                "floppy",
            ),
            (
                minimal("    shim: {delivery: init-copy, image: b:1}\n    ipcLock: maybe\n"),
                "ipcLock",
            ),
            (
                minimal("    shim: {delivery: init-copy, image: b:1}\n    podSecurity: allow\n"),
                "allow",
            ),
            (
                minimal("    shim: {delivery: init-copy, image: b:1}\n    env: {A: {nested: 1}}\n"),
                "env",
            ),
            ("profiles: [1, 2]\n".to_owned(), "profiles"),
            (
                "profiles: {a: {shim: {delivery: init-copy, image: x}}}\nextra: 1\n".to_owned(),
                "extra",
            ),
        ] {
            match parse(&text, "t.yaml") {
                Err(error @ ProfileError::Syntax { line: Some(_), .. }) => {
                    assert!(
                        error.to_string().contains(needle),
                        "{error} should mention {needle}"
                    );
                }
                other => panic!("{text:?}: expected a located syntax error, got {other:?}"),
            }
        }
    }

    #[test]
    fn env_scalars_become_strings() {
        let config = parse(
            &minimal(
                "    shim: {delivery: init-copy, image: b:1}\n    env: {A: 1, B: true, C: 1.5, D: text}\n",
            ),
            "env.yaml",
        )
        .expect("valid");
        let env = &config.profile("default").expect("default").env;
        assert_eq!(env["A"], "1");
        assert_eq!(env["B"], "true");
        assert_eq!(env["C"], "1.5");
        assert_eq!(env["D"], "text");
        let empty = parse(
            &minimal("    shim: {delivery: init-copy, image: b:1}\n    env:\n"),
            "null.yaml",
        )
        .expect("env: null is empty");
        assert!(empty.profile("default").expect("default").env.is_empty());
    }

    #[test]
    fn validation_collects_every_problem() {
        let text = r#"
defaultProfile: missing
allowedHostPathRoots: [relative/root, /opt/ok]
profiles:
  bad:
    resource: {name: hca, count: 0}
    shim:
      delivery: init-copy
      mountPath: opt/rdma
      library: /abs/lib.so
      initCommand: []
    env: {LD_PRELOAD: /x.so, "1BAD": x, "has space": y}
    network: {name: Bad_Name, namespace: "ns/x", interface: "way-too-long-interface"}
  host:
    resource: {name: kubernetes.io/hca}
    shim: {delivery: host-path, hostPath: /etc/rdma}
  image:
    shim: {delivery: image-volume, image: x:1, hostPath: /opt/ok/x, initCommand: [cp]}
  "bad name!":
    shim: {delivery: init-copy, image: "has space:1"}
"#;
        let problems = problems_of(text);
        let joined = problems.join("\n");
        for needle in [
            "allowedHostPathRoots[0] \"relative/root\": must be absolute",
            "defaultProfile \"missing\" is not among the profiles",
            "profiles.bad.resource.name: resource name `hca` has no domain",
            "profiles.bad.resource.count must be at least 1",
            "profiles.bad.shim.image is required for delivery init-copy",
            "profiles.bad.shim.initCommand must name a program",
            "profiles.bad.shim.mountPath \"opt/rdma\": must be absolute",
            "profiles.bad.shim.library \"/abs/lib.so\": must be relative to mountPath",
            "profiles.bad.env.LD_PRELOAD: managed by the injector",
            "profiles.bad.env \"1BAD\"",
            "profiles.bad.env \"has space\"",
            "profiles.bad.network.name \"Bad_Name\"",
            "profiles.bad.network.namespace \"ns/x\"",
            "profiles.bad.network.interface \"way-too-long-interface\"",
            "profiles.host.resource.name: resource name `kubernetes.io/hca` is reserved",
            "profiles.host.shim.hostPath \"/etc/rdma\" is not under any allowedHostPathRoots (relative/root, /opt/ok)",
            "profiles.image.shim.hostPath is only used with delivery host-path",
            "profiles.image.shim.initCommand is only used with delivery init-copy",
            "profiles.bad name!: profile names use",
            "profiles.bad name!.shim.image \"has space:1\": not an image reference",
        ] {
            assert!(joined.contains(needle), "missing {needle:?} in:\n{joined}");
        }
        assert_eq!(problems.len(), 20, "{joined}");
    }

    #[test]
    fn host_paths_must_stay_under_an_allowed_root() {
        let config = |host: &str| {
            format!(
                "allowedHostPathRoots: [/opt/rdma-streams]\nprofiles:\n  default:\n    shim: {{delivery: host-path, hostPath: {host}}}\n"
            )
        };
        parse(&config("/opt/rdma-streams"), "ok").expect("the root itself");
        parse(&config("/opt/rdma-streams/v1"), "ok").expect("below the root");
        for bad in [
            "/opt/rdma-streams-evil",
            "/opt/rdma-streams/../etc",
            "/opt/rdma-streams/./x",
            "/opt",
            "opt/rdma-streams/x",
        ] {
            assert!(
                matches!(
                    parse(&config(bad), "bad"),
                    Err(ProfileError::Invalid { .. })
                ),
                "{bad} must be rejected"
            );
        }
        let none = "profiles:\n  default:\n    shim: {delivery: host-path, hostPath: /opt/x}\n";
        assert!(problems_of(none).join("").contains("none are configured"));
    }

    #[test]
    fn load_reads_files_and_reports_missing_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("profiles.yaml");
        std::fs::write(&path, TEST_PROFILES).expect("write");
        let config = load(&path).expect("load");
        assert_eq!(config.default_profile, "default");
        let missing = dir.path().join("absent.yaml");
        match load(&missing) {
            Err(error @ ProfileError::Read { .. }) => {
                assert!(error.to_string().contains("absent.yaml"), "{error}");
            }
            other => panic!("expected a read error, got {other:?}"),
        }
        std::fs::write(
            &path,
            "profiles:\n  default:\n    shim: {delivery: init-copy}\n",
        )
        .expect("write");
        match load(&path) {
            Err(error @ ProfileError::Invalid { .. }) => {
                assert!(
                    error.to_string().starts_with(&path.display().to_string()),
                    "{error}"
                );
            }
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn resource_names_follow_kubelet() {
        let with_resource = |name: &str| {
            minimal(&format!(
                "    resource: {{name: \"{name}\"}}\n    shim: {{delivery: init-copy, image: b:1}}\n"
            ))
        };
        for good in ["foo.k8s.io/hca", "example.com/requests.x", "rdma/hca_a"] {
            parse(&with_resource(good), "t.yaml").expect(good);
        }
        for (bad, needle) in [
            ("xkubernetes.io/hca", "is reserved"),
            (
                "requests.example.com/hca",
                "must not start with `requests.`",
            ),
        ] {
            let problems = problems_of(&with_resource(bad)).join("\n");
            assert!(
                problems.contains(&format!(
                    "profiles.default.resource.name: resource name `{bad}`"
                )) && problems.contains(needle),
                "{problems}"
            );
        }
    }

    #[test]
    fn env_name_rule() {
        assert!(is_env_name("STREAMSHIM_MODE"));
        assert!(is_env_name("_x.y-z"));
        assert!(!is_env_name("9LIVES"));
        assert!(!is_env_name(""));
        assert!(!is_env_name("A=B"));
    }
}
