//! Arbitrary bodies never panic the router and are always answered 200, 400 or 413.

use axum::body::Body;
use http::{Request, StatusCode};
use proptest::prelude::*;
use tower::ServiceExt;

use super::{FixedPatch, fixtures};
use crate::server::{AdmissionConfig, AdmissionMetrics, admission::router};

fn runtime() -> &'static tokio::runtime::Runtime {
    rdma_streams_testkit::shared_runtime()
}

/// Posts `body` to `/mutate` with a 16 KiB limit and returns the status.
fn status_of(body: Vec<u8>) -> StatusCode {
    let config = AdmissionConfig {
        body_limit: 16 * 1024,
        ..AdmissionConfig::default()
    };
    let app = router(FixedPatch::new(), config, AdmissionMetrics::default());
    runtime().block_on(async {
        let request = Request::post("/mutate")
            .body(Body::from(body))
            .expect("request");
        let response = tokio::time::timeout(super::support::TEST_TIMEOUT, app.oneshot(request))
            .await
            .expect("answered in time")
            .expect("infallible");
        response.status()
    })
}

fn allowed(status: StatusCode) -> bool {
    [
        StatusCode::OK,
        StatusCode::BAD_REQUEST,
        StatusCode::PAYLOAD_TOO_LARGE,
    ]
    .contains(&status)
}

/// A fixture with some bytes replaced, inserted or removed, and maybe truncated.
fn mutated_fixture() -> impl Strategy<Value = Vec<u8>> {
    let fixtures = prop::sample::select(fixtures::VALID.map(|(_, f)| f).to_vec());
    let edits = prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 0..8);
    (fixtures, edits, any::<Option<prop::sample::Index>>()).prop_map(|(fixture, edits, cut)| {
        let mut bytes = fixture.as_bytes().to_vec();
        for (at, byte, op) in edits {
            let i = at.index(bytes.len().max(1));
            match op {
                0 if i < bytes.len() => bytes[i] = byte,
                1 => bytes.insert(i.min(bytes.len()), byte),
                _ if i < bytes.len() => {
                    bytes.remove(i);
                }
                _ => {}
            }
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len().max(1)));
        }
        bytes
    })
}

/// A structurally valid review whose fields carry arbitrary JSON.
fn twisted_review() -> impl Strategy<Value = Vec<u8>> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        ".{0,12}".prop_map(serde_json::Value::from),
    ];
    let json = leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map(".{0,6}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    });
    let paths = prop::sample::select(vec![
        "/apiVersion",
        "/kind",
        "/request",
        "/request/uid",
        "/request/kind",
        "/request/operation",
        "/request/namespace",
        "/request/userInfo",
        "/request/object",
        "/request/object/metadata",
        "/request/object/metadata/labels",
        "/request/object/metadata/managedFields",
        "/request/object/spec",
        "/request/oldObject",
        "/request/dryRun",
        "/request/options",
    ]);
    (paths, json).prop_map(|(path, value)| {
        let mut review: serde_json::Value =
            serde_json::from_str(fixtures::POD_CREATE_CONTROLLER).expect("fixture");
        if let Some(slot) = review.pointer_mut(path) {
            *slot = value;
        }
        serde_json::to_vec(&review).expect("JSON")
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..20 * 1024)) {
        let status = status_of(body);
        prop_assert!(allowed(status), "{status}");
    }

    #[test]
    fn mutated_fixtures(body in mutated_fixture()) {
        let status = status_of(body);
        prop_assert!(allowed(status), "{status}");
    }

    #[test]
    fn twisted_reviews(body in twisted_review()) {
        let status = status_of(body);
        prop_assert!(allowed(status), "{status}");
    }
}

#[test]
fn deeply_nested_json_is_400_not_a_stack_overflow() {
    let depth = 5_000;
    let head = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":"#;
    let arrays = format!("{head}{}{}}}", "[".repeat(depth), "]".repeat(depth));
    assert_eq!(status_of(arrays.into_bytes()), StatusCode::BAD_REQUEST);

    let depth = 2_000;
    let objects = format!(
        "{head}{{\"object\":{}1{}}}}}",
        r#"{"a":"#.repeat(depth),
        "}".repeat(depth)
    );
    assert_eq!(status_of(objects.into_bytes()), StatusCode::BAD_REQUEST);
}
