//! The pure core: (pod JSON, namespace facts, profiles) -> JSON Patch, warnings, status.
//!
//! Shared by the webhook and the offline `inject -f`. Nothing here does I/O.
//!
//! ```text
//!   pod (serde_json::Value)        NamespaceFacts       Config
//!        |                               |                 |
//!   PodView (read-only) -> opt_in -> profile -> targets -> psa (baseline/restricted)
//!        |                                                      |
//!        +---- status hash equal? -> Skip(AlreadyInjected)      |
//!        |                                                      v
//!   PatchBuilder: guarded `add` ops on a working copy: volumes, mounts, env (LD_PRELOAD),
//!   resources, IPC_LOCK, Multus, KubeVirt annotation, status  ->  Plan { patch, warnings, .. }
//! ```
//!
//! The pod stays a `serde_json::Value` throughout, so fields this crate does not know survive:
//! the patch only adds (plus `test`-guarded `replace` of an `LD_PRELOAD` literal and of the
//! Multus annotation, and a `test`-guarded overwrite of a stale status annotation).

mod capabilities;
mod effective;
mod env;
mod kubevirt;
mod multus;
pub mod names;
mod opt_in;
mod patch;
mod pod;
mod psa;
mod resources;
mod status;
mod targets;
mod volumes;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde_json::Value;

use crate::profile::{Config, Profile};

pub use self::status::InjectionStatus;

use self::effective::Effective;
use self::opt_in::{Mode, OptIn};
use self::patch::PatchBuilder;
use self::pod::PodView;

// === Public types ===

/// What the injector knows about the pod's namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceFacts {
    /// The request namespace (a controller-made pod's own `metadata.namespace` is empty).
    pub name: String,
    /// Namespace labels; empty when no cluster access (`--cluster-access off`).
    pub labels: BTreeMap<String, String>,
}

/// Everything [`plan`] looks at. Not whether the request is a dry run: a dry run plans the
/// same, which holds because the plan cannot see it.
#[derive(Debug, Clone, Copy)]
pub struct PlanInput<'a> {
    /// The pod as received (AdmissionReview `request.object`, or a pod built from a template).
    pub pod: &'a Value,
    /// The namespace the pod is created in.
    pub namespace: &'a NamespaceFacts,
    /// The profiles.
    pub config: &'a Config,
}

/// The outcome of [`plan`].
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Admit unchanged.
    Skip {
        /// Why (a metric label).
        reason: SkipReason,
        /// For logs.
        message: String,
    },
    /// Reject the pod; `message` says what to change.
    Deny {
        /// Why (a metric label).
        reason: DenyReason,
        /// For the user (AdmissionResponse `status.message`).
        message: String,
    },
    /// Admit with this patch.
    Patch(Plan),
}

/// A mutation.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// RFC 6902 patch against the pod as received.
    pub patch: json_patch::Patch,
    /// Soft problems, for AdmissionResponse `warnings`.
    pub warnings: Vec<String>,
    /// What the status annotation records.
    pub status: InjectionStatus,
    /// What was injected, for AdmissionResponse `auditAnnotations`.
    pub audit: BTreeMap<String, String>,
}

/// Why a pod is admitted unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SkipReason {
    /// Neither the pod nor its namespace opted in.
    NotOptedIn,
    /// The pod says `rdma-streams.io/inject: "false"`.
    OptedOut,
    /// The status annotation already records this exact injection.
    AlreadyInjected,
    /// Every container was added by another injector (or there are none).
    NoTargetContainer,
    /// The object is not a v1 Pod.
    NotAPod,
}

impl SkipReason {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotOptedIn => "not_opted_in",
            Self::OptedOut => "opted_out",
            Self::AlreadyInjected => "already_injected",
            Self::NoTargetContainer => "no_target_container",
            Self::NotAPod => "not_a_pod",
        }
    }
}

/// Why a pod is rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DenyReason {
    /// `rdma-streams.io/profile` names no configured profile.
    UnknownProfile,
    /// The namespace's Pod Security level forbids the injection and the profile says `deny`.
    PodSecurity,
    /// One of our labels or annotations (or the Multus one we extend) has a value we cannot read.
    BadAnnotation,
    /// `rdma-streams.io/containers` names a container that does not exist or cannot be a target.
    InvalidTarget,
    /// The pod already holds something under a name we need, of another kind.
    Conflict,
    /// A field we must extend has the wrong JSON type (the API server would reject it anyway).
    MalformedPod,
}

impl DenyReason {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnknownProfile => "unknown_profile",
            Self::PodSecurity => "pod_security",
            Self::BadAnnotation => "bad_annotation",
            Self::InvalidTarget => "invalid_target",
            Self::Conflict => "conflict",
            Self::MalformedPod => "malformed_pod",
        }
    }
}

/// Internal failures (bugs, not user errors).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoreError {
    /// A patch did not apply.
    #[error("JSON patch does not apply")]
    Patch(#[from] json_patch::PatchError),
    /// JSON encoding failed.
    #[error("JSON encoding failed")]
    Encode(#[from] serde_json::Error),
}

impl CoreError {
    /// Metric label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Patch(_) => "patch",
            Self::Encode(_) => "encode",
        }
    }
}

/// How planning stops early: a denial, or an internal error.
#[derive(Debug)]
pub(crate) enum Halt {
    Deny(DenyReason, String),
    Fail(CoreError),
}

impl From<CoreError> for Halt {
    fn from(error: CoreError) -> Self {
        Self::Fail(error)
    }
}

impl From<json_patch::PatchError> for Halt {
    fn from(error: json_patch::PatchError) -> Self {
        Self::Fail(error.into())
    }
}

impl From<serde_json::Error> for Halt {
    fn from(error: serde_json::Error) -> Self {
        Self::Fail(error.into())
    }
}

// === Entry points ===

/// Decides what to do with a pod. Pure: same input, same output.
pub fn plan(input: &PlanInput<'_>) -> Result<Decision, CoreError> {
    match plan_inner(input) {
        Ok(decision) => Ok(decision),
        Err(Halt::Deny(reason, message)) => Ok(Decision::Deny { reason, message }),
        Err(Halt::Fail(error)) => Err(error),
    }
}

/// Applies a patch to a copy of the pod.
pub fn apply(pod: &Value, patch: &json_patch::Patch) -> Result<Value, CoreError> {
    let mut out = pod.clone();
    json_patch::patch(&mut out, patch)?;
    Ok(out)
}

fn skip(reason: SkipReason, message: impl Into<String>) -> Result<Decision, Halt> {
    Ok(Decision::Skip {
        reason,
        message: message.into(),
    })
}

fn plan_inner(input: &PlanInput<'_>) -> Result<Decision, Halt> {
    let pod = match PodView::read(input.pod)? {
        Ok(pod) => pod,
        Err(not_a_pod) => return skip(SkipReason::NotAPod, not_a_pod),
    };
    let namespace = effective_namespace(input.namespace, &pod);

    let mode = match opt_in::decide(&pod, input.namespace)? {
        OptIn::In(mode) => mode,
        OptIn::Out(reason, message) => return skip(reason, message),
    };

    let (profile_name, profile) = select_profile(&pod, input.config)?;
    let mut warnings = Vec::new();

    let existing = pod.annotation(names::STATUS_ANNOTATION);
    let previous = existing.and_then(InjectionStatus::parse);
    if existing.is_some() && previous.is_none() {
        warnings.push(format!(
            "rdma-streams: replacing an unreadable {} annotation",
            names::STATUS_ANNOTATION
        ));
    }
    let same_profile = previous.as_ref().filter(|p| p.profile == profile_name);

    let targets = match mode {
        Mode::App => targets::select(&pod, same_profile, &mut warnings)?,
        Mode::Migration => kubevirt::targets(&pod, &mut warnings)?,
    };
    let Some((targets, first)) = targets.and_then(|t| t.first().copied().map(|first| (t, first)))
    else {
        return skip(
            SkipReason::NoTargetContainer,
            "every container was added by another injector; nothing to inject into",
        );
    };

    let effective = match mode {
        Mode::App => psa::effective(profile, profile_name, input.namespace, &mut warnings)?,
        Mode::Migration => Effective::migration(profile),
    };

    let target_names: Vec<String> = targets
        .iter()
        .map(|&index| pod.containers[index].name.to_owned())
        .collect();
    let status = InjectionStatus::new(profile_name, target_names, &effective)?;
    if let Some(old) = &previous
        && old.hash == status.hash
    {
        return skip(
            SkipReason::AlreadyInjected,
            format!(
                "already injected with profile {:?} (hash {})",
                old.profile, old.hash
            ),
        );
    }

    let mut builder = PatchBuilder::new(input.pod);
    match mode {
        Mode::App => {
            volumes::inject(&mut builder, &pod, &effective, &targets, &mut warnings)?;
            for &index in &targets {
                let container = &pod.containers[index];
                env::inject(&mut builder, container, &effective, &mut warnings)?;
                if effective.ipc_lock {
                    capabilities::add_ipc_lock(&mut builder, container)?;
                }
            }
            resources::inject(
                &mut builder,
                &pod,
                &effective.resource,
                first,
                &mut warnings,
            )?;
            if let Some(network) = &effective.network {
                multus::inject(&mut builder, &pod, network, namespace)?;
            }
        }
        Mode::Migration => {
            resources::inject(
                &mut builder,
                &pod,
                &effective.resource,
                first,
                &mut warnings,
            )?;
            kubevirt::annotate(&mut builder, &pod)?;
        }
    }
    status::write(&mut builder, &status)?;

    let audit = audit(&status, mode, &effective, input.namespace);
    Ok(Decision::Patch(Plan {
        patch: builder.finish(),
        warnings,
        status,
        audit,
    }))
}

/// The request namespace, else the pod's own (offline use).
fn effective_namespace<'a>(facts: &'a NamespaceFacts, pod: &PodView<'a>) -> Option<&'a str> {
    if !facts.name.is_empty() {
        Some(facts.name.as_str())
    } else {
        pod.namespace.filter(|namespace| !namespace.is_empty())
    }
}

fn select_profile<'c>(
    pod: &PodView<'_>,
    config: &'c Config,
) -> Result<(&'c str, &'c Profile), Halt> {
    let requested = match pod.annotation(names::PROFILE_ANNOTATION) {
        None => config.default_profile.as_str(),
        Some(name) if name.trim().is_empty() => {
            return Err(Halt::Deny(
                DenyReason::BadAnnotation,
                format!(
                    "annotation {} is empty; remove it to use the default profile {:?}, or name \
                     one of: {}",
                    names::PROFILE_ANNOTATION,
                    config.default_profile,
                    config.profile_names().join(", ")
                ),
            ));
        }
        Some(name) => name.trim(),
    };
    match config.profiles.get_key_value(requested) {
        Some((name, profile)) => Ok((name.as_str(), profile)),
        None => Err(Halt::Deny(
            DenyReason::UnknownProfile,
            format!(
                "unknown rdma-streams profile {requested:?} (annotation {}); known profiles: {}",
                names::PROFILE_ANNOTATION,
                config.profile_names().join(", ")
            ),
        )),
    }
}

fn audit(
    status: &InjectionStatus,
    mode: Mode,
    effective: &Effective,
    namespace: &NamespaceFacts,
) -> BTreeMap<String, String> {
    let mut audit = BTreeMap::from([
        ("profile".to_owned(), status.profile.clone()),
        ("containers".to_owned(), status.containers.join(",")),
        ("mode".to_owned(), mode.as_str().to_owned()),
        (
            "resource".to_owned(),
            format!("{}={}", effective.resource.name, effective.resource.count),
        ),
        ("hash".to_owned(), status.hash.clone()),
    ]);
    if let Some(shim) = &effective.shim {
        audit.insert("delivery".to_owned(), shim.delivery.as_str().to_owned());
    }
    if effective.degraded {
        audit.insert(
            "pod-security".to_owned(),
            format!("degraded:{}", psa::level(&namespace.labels).0.as_str()),
        );
    }
    audit
}
