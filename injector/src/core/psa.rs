//! Pod Security Admission: what the namespace's enforce level lets us add.
//!
//! PSA runs after mutating webhooks, so anything we add that the level forbids turns an
//! opted-in pod into a rejected one with a message about fields the user never wrote. We
//! check first:
//! - `baseline` forbids adding `IPC_LOCK` (not in its capability allow-list) and `hostPath`
//!   volumes;
//! - `restricted` forbids those too, and allows only some volume types: `emptyDir` (init-copy)
//!   always, `image` (image-volume) from policy version v1.33 on. Our init container is
//!   restricted-compliant (non-root, no privilege escalation, all capabilities dropped,
//!   RuntimeDefault seccomp).
//!
//! The profile decides: `deny` rejects with a message that says what to change; `degrade`
//! injects without `IPC_LOCK`, replaces `host-path` by `init-copy` when the profile has an
//! image (else denies), and warns. An unknown level value is treated as `restricted`, with a
//! warning (the strictest reading; PSA itself rejects such labels on the namespace).

use std::collections::BTreeMap;

use super::effective::Effective;
use super::names;
use super::{DenyReason, Halt, NamespaceFacts};
use crate::profile::{PodSecurityAction, Profile, ShimDelivery};

/// A Pod Security level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// No restrictions (also: no label).
    Privileged,
    /// Known privilege escalations forbidden.
    Baseline,
    /// Hardened.
    Restricted,
}

impl Level {
    /// The label spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Privileged => "privileged",
            Self::Baseline => "baseline",
            Self::Restricted => "restricted",
        }
    }
}

/// The enforce level from namespace labels, with a warning for an unreadable value.
pub(crate) fn level(labels: &BTreeMap<String, String>) -> (Level, Option<String>) {
    match labels.get(names::PSA_ENFORCE).map(String::as_str) {
        None | Some("privileged") => (Level::Privileged, None),
        Some("baseline") => (Level::Baseline, None),
        Some("restricted") => (Level::Restricted, None),
        Some(other) => (
            Level::Restricted,
            Some(format!(
                "rdma-streams: namespace label {}={other:?} is not a Pod Security level; \
                 treating it as \"restricted\"",
                names::PSA_ENFORCE
            )),
        ),
    }
}

/// `v1.N` of the enforce-version label; `None` for `latest`, absent or unreadable.
fn enforce_minor(labels: &BTreeMap<String, String>) -> Option<u32> {
    let version = labels.get(names::PSA_ENFORCE_VERSION)?;
    let rest = version.strip_prefix("v1.")?;
    rest.parse().ok()
}

/// The profile as it may be injected in this namespace.
pub(crate) fn effective(
    profile: &Profile,
    profile_name: &str,
    namespace: &NamespaceFacts,
    warnings: &mut Vec<String>,
) -> Result<Effective, Halt> {
    let mut effective = Effective::app(profile);
    let (level, level_warning) = level(&namespace.labels);
    warnings.extend(level_warning);
    if level == Level::Privileged {
        return Ok(effective);
    }
    let ns = &namespace.name;
    let level_name = level.as_str();

    if level == Level::Restricted
        && profile.shim.delivery == ShimDelivery::ImageVolume
        && enforce_minor(&namespace.labels).is_some_and(|minor| minor < 33)
    {
        return Err(Halt::Deny(
            DenyReason::PodSecurity,
            format!(
                "namespace {ns:?} enforces Pod Security \"restricted\" at version {}, which \
                 forbids image volumes (profile {profile_name:?} uses delivery image-volume); \
                 set {}=latest (image volumes are allowed from v1.33), label the namespace {}=\
                 privileged, or use a profile with delivery init-copy",
                namespace.labels[names::PSA_ENFORCE_VERSION],
                names::PSA_ENFORCE_VERSION,
                names::PSA_ENFORCE
            ),
        ));
    }

    let mut forbidden = Vec::new();
    if profile.ipc_lock {
        forbidden.push("the IPC_LOCK capability");
    }
    if profile.shim.delivery == ShimDelivery::HostPath {
        forbidden.push("a hostPath volume (delivery host-path)");
    }
    if forbidden.is_empty() {
        return Ok(effective);
    }

    match profile.pod_security {
        PodSecurityAction::Deny => Err(Halt::Deny(
            DenyReason::PodSecurity,
            format!(
                "namespace {ns:?} enforces Pod Security {level_name:?} ({}), which forbids {} \
                 that rdma-streams profile {profile_name:?} adds. To inject here, either label \
                 the namespace {}=privileged, or set podSecurity: degrade in profile \
                 {profile_name:?} (injects without IPC_LOCK{}), or opt this pod out with label \
                 {}=false",
                names::PSA_ENFORCE,
                forbidden.join(" and "),
                names::PSA_ENFORCE,
                if profile.shim.delivery == ShimDelivery::HostPath {
                    " and copies the shim with init-copy instead of host-path"
                } else {
                    ""
                },
                names::INJECT
            ),
        )),
        PodSecurityAction::Degrade => {
            let mut dropped = Vec::new();
            if effective.ipc_lock {
                effective.ipc_lock = false;
                dropped.push(
                    "without IPC_LOCK (RDMA memory registration is limited by the \
                              container's memlock limit)",
                );
            }
            if let Some(shim) = effective.shim.as_mut()
                && shim.delivery == ShimDelivery::HostPath
            {
                if shim.image.is_none() {
                    return Err(Halt::Deny(
                        DenyReason::PodSecurity,
                        format!(
                            "namespace {ns:?} enforces Pod Security {level_name:?}, which forbids \
                             hostPath volumes, and profile {profile_name:?} (delivery host-path) \
                             has no shim.image to fall back to init-copy; add shim.image to the \
                             profile, or label the namespace {}=privileged",
                            names::PSA_ENFORCE
                        ),
                    ));
                }
                shim.delivery = ShimDelivery::InitCopy;
                shim.host_path = None;
                dropped.push("with init-copy instead of host-path");
            }
            effective.degraded = true;
            warnings.push(format!(
                "rdma-streams: namespace {ns:?} enforces Pod Security {level_name:?}: injected {}",
                dropped.join(" and ")
            ));
            Ok(effective)
        }
    }
}
