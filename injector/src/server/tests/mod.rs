//! Tests of the admission server: the router in-process (`oneshot`), the real HTTPS server over
//! HTTP/1.1 and HTTP/2 with a client trusting only a test CA, certificate rotation in the
//! kubelet layout, arbitrary bodies (proptest), and hostile reviews through the injector's own
//! handler.

mod fuzz;
mod hostile_reviews;
mod https;
mod rotation;
mod router;
mod support;

use std::sync::{Arc, Mutex};

use kube::core::{DynamicObject, admission::AdmissionRequest};

use super::{Handler, Reviewed};

/// AdmissionReview fixtures shaped like the API server's requests.
pub mod fixtures {
    /// CREATE of a pod made by a ReplicaSet: `generateName`, no name, no `metadata.namespace`,
    /// `request.namespace` set, `managedFields` present.
    pub const POD_CREATE_CONTROLLER: &str =
        include_str!("../../../tests/data/reviews/pod-create-controller.json");
    /// `kubectl create --dry-run=server`: `dryRun: true`.
    pub const POD_CREATE_DRY_RUN: &str =
        include_str!("../../../tests/data/reviews/pod-create-dry-run.json");
    /// UPDATE (a label added) with `oldObject`.
    pub const POD_UPDATE: &str = include_str!("../../../tests/data/reviews/pod-update.json");
    /// `request: null`.
    pub const REQUEST_NULL: &str = include_str!("../../../tests/data/reviews/request-null.json");
    /// The controller pod in an `admission.k8s.io/v1beta1` review.
    pub const V1BETA1: &str = include_str!("../../../tests/data/reviews/pod-create-v1beta1.json");
    /// Truncated JSON.
    pub const GARBAGE: &str = include_str!("../../../tests/data/reviews/garbage.json");

    /// The reviews a handler should see, with their uids.
    pub const VALID: [(&str, &str); 3] = [
        ("pod-create-controller", POD_CREATE_CONTROLLER),
        ("pod-create-dry-run", POD_CREATE_DRY_RUN),
        ("pod-update", POD_UPDATE),
    ];

    /// The `request.uid` of a fixture.
    pub fn uid(fixture: &str) -> String {
        let review: serde_json::Value = serde_json::from_str(fixture).expect("fixture is JSON");
        review["request"]["uid"]
            .as_str()
            .expect("fixture has a uid")
            .to_owned()
    }
}

/// The patch the fake handler returns.
pub fn fixed_patch() -> json_patch::Patch {
    serde_json::from_value(serde_json::json!([
        {"op": "add", "path": "/metadata/annotations/rdma-streams.io~1status", "value": "{\"version\":1}"}
    ]))
    .expect("patch")
}

/// Answers every review with [`fixed_patch`], a warning and an audit annotation, and keeps the
/// requests it saw.
#[derive(Default)]
pub struct FixedPatch {
    pub seen: Mutex<Vec<AdmissionRequest<DynamicObject>>>,
}

impl Handler for FixedPatch {
    fn review(&self, req: &AdmissionRequest<DynamicObject>) -> Reviewed {
        self.seen.lock().expect("not poisoned").push(req.clone());
        Reviewed::injected(fixed_patch(), "default")
            .with_warning("rdma-streams: test warning")
            .with_audit("rdma-streams.io/profile", "default")
    }
}

impl FixedPatch {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
}

/// Denies everything with a message.
pub fn denier() -> Arc<dyn Handler> {
    Arc::new(|_: &AdmissionRequest<DynamicObject>| {
        Reviewed::deny(
            "psa-restricted",
            "namespace rdma-apps enforces Pod Security \"restricted\": IPC_LOCK is not allowed",
        )
    })
}

/// Sleeps, then skips.
pub fn sleeper(duration: std::time::Duration) -> Arc<dyn Handler> {
    Arc::new(move |_: &AdmissionRequest<DynamicObject>| {
        std::thread::sleep(duration);
        Reviewed::skipped("slow")
    })
}

/// Counts the reviews that started, then sleeps and skips: lets a test wait until requests
/// are in flight.
pub struct Started {
    pub count: std::sync::atomic::AtomicUsize,
    sleep: std::time::Duration,
}

impl Started {
    pub fn new(sleep: std::time::Duration) -> Arc<Self> {
        Arc::new(Self {
            count: std::sync::atomic::AtomicUsize::new(0),
            sleep,
        })
    }

    /// Waits until `n` reviews have started.
    pub async fn wait_for(&self, n: usize) {
        while self.count.load(std::sync::atomic::Ordering::SeqCst) < n {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}

impl Handler for Started {
    fn review(&self, _: &AdmissionRequest<DynamicObject>) -> Reviewed {
        self.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(self.sleep);
        Reviewed::skipped("slow")
    }
}

/// Panics.
/// Wraps a handler so the server runs it inline (as the injector's own handler is run).
pub struct Inline(pub Arc<dyn Handler>);

impl Handler for Inline {
    fn review(&self, req: &AdmissionRequest<DynamicObject>) -> Reviewed {
        self.0.review(req)
    }

    fn is_inline(&self) -> bool {
        true
    }
}

pub fn panicker() -> Arc<dyn Handler> {
    Arc::new(|_: &AdmissionRequest<DynamicObject>| -> Reviewed {
        panic!("handler bug (expected by the test)")
    })
}
