//! Who asked: pod label, pod annotation, namespace label, or a KubeVirt VM's migration label.
//!
//! | pod `rdma-streams.io/inject` (label, else annotation) | namespace label | result |
//! | --- | --- | --- |
//! | `"false"` | any | skip: opted out |
//! | `"true"` | any | in |
//! | absent | `enabled` | in (not virt-launcher pods: a VM opts in with its own label) |
//! | absent | other/absent | skip: not opted in (unless a virt-launcher pod asks for RDMA migration) |
//! | anything else | any | deny: the value is unreadable, and silently ignoring a typo would leave the pod un-injected |
//!
//! The label wins over the annotation (the label is what `objectSelector` matched). A
//! virt-launcher pod (`kubevirt.io: virt-launcher`) is always handled in migration mode
//! ([`Mode::Migration`]), however it opted in; `rdma-streams.io/migration: rdma` in its labels or
//! annotations (VM template metadata propagates to the launcher pod) opts it in by itself.

use super::names;
use super::pod::PodView;
use super::{DenyReason, Halt, NamespaceFacts, SkipReason};

/// What gets injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Ordinary pods: resource, shim, env, IPC_LOCK, network.
    App,
    /// KubeVirt virt-launcher pods: the resource on `compute` and the migration annotation only.
    Migration,
}

impl Mode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::App => "app",
            Self::Migration => "kubevirt-migration",
        }
    }
}

/// The opt-in verdict.
#[derive(Debug)]
pub(crate) enum OptIn {
    In(Mode),
    Out(SkipReason, String),
}

/// Decides opt-in.
pub(crate) fn decide(pod: &PodView<'_>, namespace: &NamespaceFacts) -> Result<OptIn, Halt> {
    let launcher = is_virt_launcher(pod);
    let mode = if launcher { Mode::Migration } else { Mode::App };

    let (pod_value, source) = match (pod.label(names::INJECT), pod.annotation(names::INJECT)) {
        (Some(value), _) => (Some(value), "label"),
        (None, Some(value)) => (Some(value), "annotation"),
        (None, None) => (None, ""),
    };
    match pod_value {
        Some(names::INJECT_FALSE) => {
            return Ok(OptIn::Out(
                SkipReason::OptedOut,
                format!("pod {source} {}=false", names::INJECT),
            ));
        }
        Some(names::INJECT_TRUE) => return Ok(OptIn::In(mode)),
        Some(other) => {
            return Err(Halt::Deny(
                DenyReason::BadAnnotation,
                format!(
                    "pod {source} {}={other:?} is neither \"true\" (inject) nor \"false\" (opt out)",
                    names::INJECT
                ),
            ));
        }
        None => {}
    }

    if launcher && let Some(value) = migration_request(pod) {
        if value == names::MIGRATION_RDMA {
            return Ok(OptIn::In(Mode::Migration));
        }
        return Err(Halt::Deny(
            DenyReason::BadAnnotation,
            format!(
                "{}={value:?} on the VM is not a known migration transport; use \"rdma\" or \
                 remove it",
                names::MIGRATION
            ),
        ));
    }

    match namespace.labels.get(names::INJECT).map(String::as_str) {
        // A namespace-wide opt-in is for app pods. Giving every VM in the namespace the RDMA
        // resource would silently pin all of them to RDMA nodes: VMs opt in one by one with
        // `rdma-streams.io/migration: rdma` on their template.
        Some(names::NAMESPACE_ENABLED) if launcher => Ok(OptIn::Out(
            SkipReason::NotOptedIn,
            format!(
                "virt-launcher pod in namespace {:?}: the namespace label does not opt VMs in; \
                 label the VM template {}={}",
                namespace.name,
                names::MIGRATION,
                names::MIGRATION_RDMA
            ),
        )),
        Some(names::NAMESPACE_ENABLED) => Ok(OptIn::In(mode)),
        _ => Ok(OptIn::Out(
            SkipReason::NotOptedIn,
            format!(
                "neither the pod ({} label or annotation) nor namespace {:?} ({}=enabled) opted in",
                names::INJECT,
                namespace.name,
                names::INJECT
            ),
        )),
    }
}

/// `kubevirt.io: virt-launcher`.
pub(crate) fn is_virt_launcher(pod: &PodView<'_>) -> bool {
    pod.label(names::KUBEVIRT_LABEL) == Some(names::VIRT_LAUNCHER)
}

/// The migration opt-in value, label first.
pub(crate) fn migration_request<'a>(pod: &PodView<'a>) -> Option<&'a str> {
    pod.label(names::MIGRATION)
        .or_else(|| pod.annotation(names::MIGRATION))
}
