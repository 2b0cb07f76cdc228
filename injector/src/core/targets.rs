//! Which containers get the shim.
//!
//! 1. `rdma-streams.io/containers` (comma list): exactly those; a name that is not a regular
//!    container, or that another injector added, denies the pod (the user asked for it).
//! 2. else the containers of an earlier injection of the same profile (our status annotation),
//!    when they all still exist: on reinvocation another webhook may have put a container in
//!    front, and "the first container" must not move;
//! 3. else `kubectl.kubernetes.io/default-container`, when it names a regular container that no
//!    other injector added (otherwise a warning, and on to 4).
//! 4. else the first regular container no other injector added (Istio may put `istio-proxy`
//!    first).
//!
//! Targets come back as indexes into `spec.containers`, in pod order, without duplicates.

use super::names;
use super::pod::PodView;
use super::status::InjectionStatus;
use super::{DenyReason, Halt};

/// The target containers, or `None` when every container belongs to another injector.
pub(crate) fn select(
    pod: &PodView<'_>,
    previous: Option<&InjectionStatus>,
    warnings: &mut Vec<String>,
) -> Result<Option<Vec<usize>>, Halt> {
    if let Some(list) = pod.annotation(names::CONTAINERS_ANNOTATION) {
        return explicit(pod, list).map(Some);
    }
    if let Some(previous) = previous
        && !previous.containers.is_empty()
    {
        let indexes: Option<Vec<usize>> = previous
            .containers
            .iter()
            .map(|name| {
                pod.container_index(name)
                    .filter(|_| !names::is_foreign_injected(name))
            })
            .collect();
        if let Some(mut indexes) = indexes {
            indexes.sort_unstable();
            indexes.dedup();
            return Ok(Some(indexes));
        }
    }
    if let Some(name) = pod.annotation(names::DEFAULT_CONTAINER_ANNOTATION) {
        match pod.container_index(name) {
            Some(index) if !names::is_foreign_injected(name) => return Ok(Some(vec![index])),
            Some(_) => warnings.push(format!(
                "rdma-streams: default container {name:?} was added by another injector; using \
                 the first application container instead"
            )),
            None => warnings.push(format!(
                "rdma-streams: {} names {name:?}, which is not a container; using the first \
                 application container instead",
                names::DEFAULT_CONTAINER_ANNOTATION
            )),
        }
    }
    Ok(pod
        .containers
        .iter()
        .find(|c| !names::is_foreign_injected(c.name))
        .map(|c| vec![c.index]))
}

fn explicit(pod: &PodView<'_>, list: &str) -> Result<Vec<usize>, Halt> {
    let requested: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .collect();
    if requested.is_empty() {
        return Err(Halt::Deny(
            DenyReason::BadAnnotation,
            format!(
                "annotation {} is empty; list container names separated by commas, or remove it",
                names::CONTAINERS_ANNOTATION
            ),
        ));
    }
    let mut indexes = Vec::with_capacity(requested.len());
    for name in requested {
        if names::is_foreign_injected(name) {
            return Err(Halt::Deny(
                DenyReason::InvalidTarget,
                format!(
                    "annotation {} names {name:?}, a container another injector adds; it cannot \
                     get the RDMA shim",
                    names::CONTAINERS_ANNOTATION
                ),
            ));
        }
        match pod.container_index(name) {
            Some(index) => indexes.push(index),
            None => {
                let is_init = pod.init_containers.iter().any(|c| c.name == name);
                let known: Vec<&str> = pod.containers.iter().map(|c| c.name).collect();
                return Err(Halt::Deny(
                    DenyReason::InvalidTarget,
                    format!(
                        "annotation {} names {name:?}, which {}; containers: {}",
                        names::CONTAINERS_ANNOTATION,
                        if is_init {
                            "is an init container (only regular containers can be targets)"
                        } else {
                            "is not a container of this pod"
                        },
                        known.join(", ")
                    ),
                ));
            }
        }
    }
    indexes.sort_unstable();
    indexes.dedup();
    Ok(indexes)
}
