//! Hostile AdmissionReviews through the router and the injector's own handler (the pure core),
//! with the default limits: the whole path from request bytes to the answer, where
//! `fuzz.rs` stops at the router with a fixed handler.
//!
//! Bodies: the fixtures and an opted-in pod's review with bytes mutated, with any value
//! (down to the pod's containers, env and annotations) replaced by an arbitrary JSON value, or
//! by a raw hostile token (not JSON any more). Every body is answered 200, 400 or 413; a 200
//! is an AdmissionReview for the request's uid that is not an internal error (the inline
//! handler's panics are caught and answered as errors, so they are looked for in the answer),
//! and its patch applies to the object as the API server holds it. A review of a mebibyte,
//! nesting ten thousand deep and a body over the limit are answered in bounded time.

use std::{sync::Arc, time::Duration};

use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use kube::core::{
    DynamicObject,
    admission::{AdmissionRequest, AdmissionReview},
};
use proptest::prelude::*;
use rdma_streams_testkit::fuzz;
use serde_json::{Value, json};
use tokio::sync::watch;
use tower::ServiceExt;

use super::fixtures;
use crate::{
    namespaces::NamespaceCache,
    profile,
    server::{AdmissionConfig, AdmissionMetrics, admission::router},
    webhook::InjectorHandler,
};

const LIMIT: Duration = Duration::from_secs(60);
const BOUND: Duration = Duration::from_secs(20);

fn runtime() -> &'static tokio::runtime::Runtime {
    rdma_streams_testkit::shared_runtime()
}

/// Posts `body` to `/mutate` of a router with the default limits and the injector's handler
/// over the test profiles; returns the status and the answer's bytes.
fn post(body: Vec<u8>) -> (StatusCode, Vec<u8>) {
    let profiles = profile::parse(
        include_str!("../../../tests/data/config/profiles.yaml"),
        "profiles.yaml",
    )
    .expect("test profiles");
    let handler = Arc::new(InjectorHandler {
        profiles: watch::channel(Arc::new(profiles)).1,
        namespaces: NamespaceCache::disabled(),
    });
    let app = router(
        handler,
        AdmissionConfig::default(),
        AdmissionMetrics::default(),
    );
    runtime().block_on(async {
        let request = Request::post("/mutate")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .expect("request");
        let response = app.oneshot(request).await.expect("infallible");
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        (status, bytes.to_vec())
    })
}

/// RFC 4648 base64 (the patch).
fn unbase64(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

/// The properties in the module docs, for one body.
fn check(body: Vec<u8>) -> Result<(), TestCaseError> {
    let sent: Option<Value> = serde_json::from_slice(&body).ok();
    let body_copy = if sent.is_none() {
        body.clone()
    } else {
        Vec::new()
    };
    let (status, answer) = post(body);
    prop_assert!(
        [
            StatusCode::OK,
            StatusCode::BAD_REQUEST,
            StatusCode::PAYLOAD_TOO_LARGE
        ]
        .contains(&status),
        "{status}"
    );
    if status != StatusCode::OK {
        return Ok(());
    }
    let review: Value = serde_json::from_slice(&answer)
        .map_err(|e| TestCaseError::fail(format!("answer is not JSON: {e}")))?;
    let response = &review["response"];
    prop_assert_eq!(&review["kind"], "AdmissionReview");
    // serde_json's `Value` refuses what a typed read skips over (a number out of range or
    // nesting past 128 in a field the review does not have): then the object is what the
    // router read.
    let sent = sent.unwrap_or_else(|| as_read(&body_copy));
    if let Some(uid) = sent["request"]["uid"].as_str() {
        prop_assert_eq!(&response["uid"], uid);
    }
    let message = response["status"]["message"].as_str().unwrap_or_default();
    for bug in ["panicked", "injection failed", "cannot encode", "deadline"] {
        prop_assert!(!message.contains(bug), "{}", message);
    }
    if let Some(patch) = response["patch"].as_str() {
        let bytes = unbase64(patch).ok_or_else(|| TestCaseError::fail("patch not base64"))?;
        let patch: json_patch::Patch = serde_json::from_slice(&bytes)
            .map_err(|e| TestCaseError::fail(format!("patch not a JSON patch: {e}")))?;
        // The object as the API server holds it (managedFields are not sent to the core).
        let mut object = sent["request"]["object"].clone();
        if let Some(meta) = object["metadata"].as_object_mut() {
            meta.remove("managedFields");
        }
        if let Err(e) = json_patch::patch(&mut object, &patch) {
            return Err(TestCaseError::fail(format!(
                "{e}: patch {patch:?} on {}",
                sent["request"]["object"]
            )));
        }
    }
    Ok(())
}

/// The review as the router reads it (typed, unknown fields skipped), as JSON.
fn as_read(body: &[u8]) -> Value {
    let Ok(review) = serde_json::from_slice::<AdmissionReview<DynamicObject>>(body) else {
        return Value::Null;
    };
    let request: Result<AdmissionRequest<DynamicObject>, _> = review.try_into();
    let Ok(request) = request else {
        return Value::Null;
    };
    json!({
        "request": {
            "uid": request.uid,
            "object": serde_json::to_value(&request.object).unwrap_or_default(),
        }
    })
}

/// The valid fixtures and a review of a pod the injector patches (several containers, env,
/// resources, security context, our annotations).
fn reviews() -> Vec<Value> {
    let mut reviews: Vec<Value> = fixtures::VALID
        .iter()
        .map(|(_, f)| serde_json::from_str(f).expect("fixture"))
        .collect();
    let mut rich = reviews[0].clone();
    rich["request"]["object"]["metadata"]["annotations"] = json!({
        "rdma-streams.io/profile": "net",
        "rdma-streams.io/containers": "app,worker",
        "k8s.v1.cni.cncf.io/networks": "macvlan, infra/other@net2",
        "rdma-streams.io/status": "{\"version\":\"0.0.1\",\"profile\":\"net\",\"containers\":[\"app\"],\"hash\":\"0\"}"
    });
    rich["request"]["object"]["spec"] = json!({
        "containers": [
            {"name": "app", "image": "x", "env": [{"name": "LD_PRELOAD", "value": "/a.so"}],
             "resources": {"limits": {"memory": "1Gi"}},
             "securityContext": {"capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}},
             "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
            {"name": "worker", "image": "y", "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}
        ],
        "initContainers": [{"name": "init", "image": "z"}],
        "volumes": [{"name": "data", "emptyDir": {}}]
    });
    reviews.push(rich);
    reviews
}

#[test]
fn mutated_reviews_are_answered_and_never_an_internal_error() {
    let seeds: Vec<Vec<u8>> = reviews()
        .iter()
        .map(|r| serde_json::to_vec_pretty(r).expect("JSON"))
        .collect();
    fuzz::run(
        "admission mutated reviews",
        400,
        LIMIT,
        move || fuzz::mutated(seeds, fuzz::TOKENS),
        check,
    );
}

#[test]
fn reviews_with_a_hostile_value_anywhere_are_answered_and_never_an_internal_error() {
    fuzz::run(
        "admission hostile values",
        600,
        LIMIT,
        || proptest::sample::select(reviews()).prop_flat_map(fuzz::transplanted),
        |review| check(serde_json::to_vec(&review).expect("JSON")),
    );
}

#[test]
fn reviews_with_a_raw_hostile_token_anywhere_are_answered() {
    fuzz::run(
        "admission hostile tokens",
        400,
        LIMIT,
        || proptest::sample::select(reviews()).prop_flat_map(fuzz::replaced_text),
        |text| check(text.into_bytes()),
    );
}

// === Large inputs, with the default limits ===

fn answered_in_time(what: &str, body: Vec<u8>) -> (StatusCode, Vec<u8>) {
    fuzz::timed(what, BOUND, move || post(body)).0
}

#[test]
fn nesting_ten_thousand_deep_and_a_mebibyte_deep_are_400_quickly() {
    let head = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":"#;
    for depth in [10_000, 500_000] {
        for objects in [false, true] {
            let body = format!("{head}{}}}", fuzz::nested_text(depth, objects));
            let (status, _) = answered_in_time(
                &format!(
                    "admission review nested {depth} deep ({} bytes)",
                    body.len()
                ),
                body.into_bytes(),
            );
            assert_eq!(status, StatusCode::BAD_REQUEST);
        }
    }
}

#[test]
fn a_review_of_a_mebibyte_is_answered_in_time() {
    // An opted-in pod with a mebibyte of labels, env and containers: injected, in time.
    let mut review = reviews()[0].clone();
    let object = &mut review["request"]["object"];
    for n in 0..2_000 {
        object["metadata"]["labels"][format!("l{n}")] = json!("v".repeat(63));
    }
    let env: Vec<Value> = (0..4_000)
        .map(|n| json!({"name": format!("E{n}"), "value": "x".repeat(100)}))
        .collect();
    let containers: Vec<Value> = (0..50)
        .map(|n| json!({"name": format!("c{n}"), "image": "x", "env": env[..80].to_vec()}))
        .collect();
    object["spec"]["containers"][0]["env"] = Value::Array(env);
    if let Some(list) = object["spec"]["containers"].as_array_mut() {
        list.extend(containers);
    }
    let body = serde_json::to_vec(&review).expect("JSON");
    assert!(body.len() > 1 << 20, "{}", body.len());
    let (status, answer) = answered_in_time(
        &format!("admission review of {} bytes", body.len()),
        body.clone(),
    );
    assert_eq!(status, StatusCode::OK);
    let answer: Value = serde_json::from_slice(&answer).expect("JSON");
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert!(answer["response"]["patch"].is_string(), "injected");
    check(body).expect("the patch applies");
}

#[test]
fn a_body_over_the_limit_is_413_quickly() {
    let body = vec![b' '; crate::server::admission::DEFAULT_BODY_LIMIT + 1];
    let (status, _) = answered_in_time("admission body of 4 MiB + 1", body);
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[test]
fn regression_a_review_only_a_typed_read_accepts_is_checked_as_read() {
    // A number past f64 and nesting past 128 in a member the pod's metadata does not have: a
    // `Value` refuses them, the router's typed read skips them and injects the pod.
    let review = serde_json::to_string(&reviews()[0]).expect("JSON");
    for extra in ["1e309".to_owned(), fuzz::nested_text(200, false)] {
        let body = review.replacen(
            "\"metadata\":{",
            &format!("\"metadata\":{{\"extra\":{extra},"),
            1,
        );
        assert!(serde_json::from_str::<Value>(&body).is_err());
        let (status, answer) = post(body.clone().into_bytes());
        assert_eq!(status, StatusCode::OK, "{extra:.20}");
        let answer: Value = serde_json::from_slice(&answer).expect("JSON");
        assert!(answer["response"]["patch"].is_string(), "{answer}");
        check(body.into_bytes()).expect("the patch applies to the object as read");
    }
}
