//! The seam between the HTTPS server and the injection logic.
//!
//! The server parses and checks the AdmissionReview, then hands the request to a [`Handler`] on a
//! blocking thread and turns its [`Reviewed`] answer into an AdmissionReview v1 response. The
//! handler never sees HTTP, TLS or metrics; the server never sees pods.

use std::collections::BTreeMap;

use kube::core::{DynamicObject, admission::AdmissionRequest};

/// Decides what happens to one admission request.
///
/// Called on a `spawn_blocking` thread under the server's per-request deadline, so it may do
/// CPU work, but it must not block on the network: namespace facts come from reflector caches.
/// A panic is caught and answered like [`Reviewed::Error`].
pub trait Handler: Send + Sync + 'static {
    /// Reviews one request. `req.object` has `metadata.managedFields` removed already, and
    /// `req.namespace` is the namespace to use when the object's own is empty (a pod made by a
    /// controller carries only `generateName`).
    fn review(&self, req: &AdmissionRequest<DynamicObject>) -> Reviewed;

    /// Whether `review` is pure, bounded CPU work (no I/O, no waiting): then the server runs it
    /// inline on the async worker, because handing it to a blocking thread costs more than the
    /// work itself (`docs/benchmarks.md`, "Injector"), and checks the deadline when it returns. Default `false`: a blocking thread under a deadline that
    /// fires while the handler still runs.
    fn is_inline(&self) -> bool {
        false
    }
}

impl<F> Handler for F
where
    F: Fn(&AdmissionRequest<DynamicObject>) -> Reviewed + Send + Sync + 'static,
{
    fn review(&self, req: &AdmissionRequest<DynamicObject>) -> Reviewed {
        self(req)
    }
}

/// What a [`Handler`] decided.
///
/// Reasons are `&'static str` on purpose: they become metric labels, so the set must stay small
/// and fixed (`already-injected`, `not-opted-in`, `psa-baseline`, ...). Free text goes into
/// `message` and `warnings`.
#[derive(Clone, Debug)]
pub enum Reviewed {
    /// Admit the object, with or without a patch.
    Allow(Allowed),
    /// Reject the object; `message` reaches the user as `status.message`.
    Deny {
        /// What the user should change, shown by kubectl after "denied the request:".
        message: String,
        /// Metric label (`denied{reason}`).
        reason: &'static str,
    },
    /// The handler could not decide. Answered by the server's error policy
    /// ([`super::ErrorPolicy`]) and counted as an error.
    Error {
        /// Logged and, under the `Deny` policy, returned in `status.message`.
        message: String,
    },
}

/// An admitted request: the patch to apply and what to tell the user and the audit log.
#[derive(Clone, Debug)]
pub struct Allowed {
    /// JSON Patch for the object; `None` (or an empty patch) admits it unchanged.
    pub patch: Option<json_patch::Patch>,
    /// Returned as `response.warnings` (kubectl prints them).
    pub warnings: Vec<String>,
    /// Returned as `response.auditAnnotations`; the API server prefixes each key with the webhook
    /// name.
    pub audit: BTreeMap<String, String>,
    /// Metric label: `injected` or `skipped`.
    pub outcome: Outcome,
    /// Metric label: why it was skipped (or which profile was injected).
    pub reason: &'static str,
}

/// Whether an admitted object was changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The object was patched.
    Injected,
    /// The object was admitted unchanged.
    Skipped,
}

impl Outcome {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Injected => "injected",
            Self::Skipped => "skipped",
        }
    }
}

// === impl Reviewed ===

impl Reviewed {
    /// Admit the object with `patch`.
    pub fn injected(patch: json_patch::Patch, reason: &'static str) -> Self {
        Self::Allow(Allowed {
            patch: Some(patch),
            warnings: Vec::new(),
            audit: BTreeMap::new(),
            outcome: Outcome::Injected,
            reason,
        })
    }

    /// Admit the object unchanged.
    pub fn skipped(reason: &'static str) -> Self {
        Self::Allow(Allowed {
            patch: None,
            warnings: Vec::new(),
            audit: BTreeMap::new(),
            outcome: Outcome::Skipped,
            reason,
        })
    }

    /// Reject the object with a message for the user.
    pub fn deny(reason: &'static str, message: impl Into<String>) -> Self {
        Self::Deny {
            message: message.into(),
            reason,
        }
    }

    /// Add a warning to an admitted review (no effect on `Deny`/`Error`).
    #[must_use]
    pub fn with_warning(mut self, warning: impl Into<String>) -> Self {
        if let Self::Allow(allowed) = &mut self {
            allowed.warnings.push(warning.into());
        }
        self
    }

    /// Add an audit annotation to an admitted review (no effect on `Deny`/`Error`).
    #[must_use]
    pub fn with_audit(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        if let Self::Allow(allowed) = &mut self {
            allowed.audit.insert(key.into(), value.into());
        }
        self
    }
}
