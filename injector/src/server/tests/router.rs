//! The `/mutate` router in-process: no socket, no TLS.

use std::{convert::Infallible, sync::Arc, time::Duration};

use axum::body::Body;
use http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Bytes;
use serde_json::Value;
use tower::ServiceExt;

use super::{
    FixedPatch, Inline, denier, fixed_patch, fixtures, panicker, sleeper,
    support::{base64_decode, within},
};
use crate::server::{
    AdmissionConfig, AdmissionMetrics, Handler, Reviewed,
    admission::{ErrorPolicy, router},
};

struct Answer {
    status: StatusCode,
    content_type: String,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }

    fn message(&self) -> String {
        self.json()["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The message of the review's status: why it was denied or not decided.
    fn review_message(&self) -> String {
        self.json()["response"]["status"]["message"]
            .as_str()
            .expect("a status message")
            .to_owned()
    }
}

async fn call_with(
    handler: Arc<dyn Handler>,
    config: AdmissionConfig,
    metrics: &AdmissionMetrics,
    request: Request<Body>,
) -> Answer {
    let response = within(router(handler, config, metrics.clone()).oneshot(request))
        .await
        .expect("router is infallible");
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().expect("ascii").to_owned())
        .unwrap_or_default();
    let body = within(response.into_body().collect())
        .await
        .expect("body")
        .to_bytes();
    Answer {
        status,
        content_type,
        body,
    }
}

fn post(path: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.into())
        .expect("request")
}

async fn call(handler: Arc<dyn Handler>, request: Request<Body>) -> Answer {
    call_with(
        handler,
        AdmissionConfig::default(),
        &AdmissionMetrics::default(),
        request,
    )
    .await
}

#[tokio::test]
async fn fixtures_get_the_patch_and_echo_the_review() {
    for (name, fixture) in fixtures::VALID {
        let handler = FixedPatch::new();
        let metrics = AdmissionMetrics::default();
        let answer = call_with(
            handler.clone(),
            AdmissionConfig::default(),
            &metrics,
            post("/mutate?timeout=5s", fixture),
        )
        .await;
        assert_eq!(answer.status, StatusCode::OK, "{name}");
        assert_eq!(answer.content_type, "application/json", "{name}");
        let review = answer.json();
        assert_eq!(review["apiVersion"], "admission.k8s.io/v1", "{name}");
        assert_eq!(review["kind"], "AdmissionReview", "{name}");
        let response = &review["response"];
        assert_eq!(response["uid"], fixtures::uid(fixture), "{name}");
        assert_eq!(response["allowed"], true, "{name}");
        assert_eq!(response["patchType"], "JSONPatch", "{name}");
        let patch = base64_decode(response["patch"].as_str().expect("patch is base64"));
        let patch: Value = serde_json::from_slice(&patch).expect("patch is JSON");
        assert_eq!(
            patch,
            serde_json::to_value(fixed_patch()).expect("patch"),
            "{name}"
        );
        assert_eq!(
            response["warnings"][0], "rdma-streams: test warning",
            "{name}"
        );
        assert_eq!(
            response["auditAnnotations"]["rdma-streams.io/profile"], "default",
            "{name}"
        );
        assert!(
            review.get("request").is_none(),
            "{name}: request not echoed"
        );
        assert_eq!(metrics.requests("injected", "default"), 1, "{name}");

        let seen = handler.seen.lock().expect("not poisoned");
        let request = seen.first().expect("handler called");
        for object in [&request.object, &request.old_object].into_iter().flatten() {
            assert!(
                object.metadata.managed_fields.is_none(),
                "{name}: managedFields stripped"
            );
        }
        assert_eq!(request.namespace.as_deref(), Some("rdma-apps"), "{name}");
    }
}

#[tokio::test]
async fn the_handler_sees_what_the_api_server_sent() {
    let handler = FixedPatch::new();
    call(
        handler.clone(),
        post("/mutate", fixtures::POD_CREATE_CONTROLLER),
    )
    .await;
    call(
        handler.clone(),
        post("/mutate", fixtures::POD_CREATE_DRY_RUN),
    )
    .await;
    call(handler.clone(), post("/mutate", fixtures::POD_UPDATE)).await;
    let seen = handler.seen.lock().expect("not poisoned");
    let [controller, dry_run, update] = seen.as_slice() else {
        panic!("three requests expected, got {}", seen.len());
    };
    let pod = controller.object.as_ref().expect("object");
    assert_eq!(pod.metadata.name, None);
    assert_eq!(pod.metadata.namespace, None);
    assert_eq!(
        pod.metadata.generate_name.as_deref(),
        Some("iperf-server-6c9d7b5f4d-")
    );
    assert_eq!(pod.data["spec"]["containers"][0]["name"], "iperf3");
    assert!(!controller.dry_run);
    assert!(dry_run.dry_run);
    assert_eq!(format!("{:?}", update.operation), "Update");
    assert!(update.old_object.is_some());
}

#[tokio::test]
async fn missing_content_type_is_accepted() {
    let request = Request::post("/mutate")
        .body(Body::from(fixtures::POD_CREATE_CONTROLLER))
        .expect("request");
    assert_eq!(
        call(FixedPatch::new(), request).await.status,
        StatusCode::OK
    );
    let request = Request::post("/mutate")
        .header(header::CONTENT_TYPE, "application/json; charset=utf-8")
        .body(Body::from(fixtures::POD_CREATE_CONTROLLER))
        .expect("request");
    assert_eq!(
        call(FixedPatch::new(), request).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn other_content_types_are_415() {
    let metrics = AdmissionMetrics::default();
    let request = Request::post("/mutate")
        .header(header::CONTENT_TYPE, "application/yaml")
        .body(Body::from(fixtures::POD_CREATE_CONTROLLER))
        .expect("request");
    let answer = call_with(
        FixedPatch::new(),
        AdmissionConfig::default(),
        &metrics,
        request,
    )
    .await;
    assert_eq!(answer.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(
        answer.message().contains("application/yaml"),
        "{}",
        answer.message()
    );
    assert_eq!(metrics.bad_requests("415", "media-type"), 1);
}

#[tokio::test]
async fn only_post_mutate_is_served() {
    let metrics = AdmissionMetrics::default();
    let cases = [
        (Method::GET, "/mutate"),
        (Method::PUT, "/mutate"),
        (Method::DELETE, "/mutate"),
        (Method::POST, "/"),
        (Method::POST, "/validate"),
        (Method::POST, "/mutate/extra"),
        (Method::GET, "/metrics"),
    ];
    for (method, path) in cases.clone() {
        let request = Request::builder()
            .method(method.clone())
            .uri(path)
            .body(Body::from(fixtures::POD_CREATE_CONTROLLER))
            .expect("request");
        let answer = call_with(
            FixedPatch::new(),
            AdmissionConfig::default(),
            &metrics,
            request,
        )
        .await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{method} {path}");
        assert_eq!(answer.content_type, "application/json");
        assert_eq!(answer.json()["code"], 404);
        assert!(
            answer.message().contains("POST /mutate"),
            "{}",
            answer.message()
        );
    }
    assert_eq!(metrics.bad_requests("404", "not-found"), cases.len() as u64);
}

#[tokio::test]
async fn bad_reviews_are_400_with_a_message() {
    let cases = [
        (
            "request-null",
            fixtures::REQUEST_NULL,
            "no-request",
            "no request",
        ),
        (
            "v1beta1",
            fixtures::V1BETA1,
            "version",
            "admission.k8s.io/v1beta1",
        ),
        (
            "garbage",
            fixtures::GARBAGE,
            "malformed",
            "malformed AdmissionReview",
        ),
        ("empty", "", "malformed", "malformed AdmissionReview"),
        ("array", "[]", "malformed", "malformed AdmissionReview"),
        (
            "other kind",
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"ConversionReview","request":null}"#,
            "version",
            "ConversionReview",
        ),
        (
            "no request field",
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
            "no-request",
            "no request",
        ),
    ];
    for (name, body, kind, needle) in cases {
        let metrics = AdmissionMetrics::default();
        let answer = call_with(
            FixedPatch::new(),
            AdmissionConfig::default(),
            &metrics,
            post("/mutate", body),
        )
        .await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{name}");
        assert_eq!(answer.json()["code"], 400, "{name}");
        assert!(
            answer.message().contains(needle),
            "{name}: {}",
            answer.message()
        );
        assert_eq!(metrics.bad_requests("400", kind), 1, "{name}");
    }
}

#[tokio::test]
async fn oversized_bodies_are_413_by_content_length() {
    let metrics = AdmissionMetrics::default();
    let config = AdmissionConfig {
        body_limit: 1024,
        ..AdmissionConfig::default()
    };
    let answer = call_with(
        FixedPatch::new(),
        config,
        &metrics,
        post("/mutate", fixtures::POD_CREATE_CONTROLLER),
    )
    .await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(answer.message().contains("1024"), "{}", answer.message());
    assert_eq!(metrics.bad_requests("413", "too-large"), 1);
}

#[tokio::test]
async fn endless_bodies_are_413_without_buffering_them() {
    // No length; the stream never ends. Reading it whole would never finish.
    let chunk = Bytes::from(vec![b' '; 64 * 1024]);
    let endless = futures::stream::repeat_with(move || Ok::<_, Infallible>(chunk.clone()));
    let request = Request::post("/mutate")
        .body(Body::from_stream(endless))
        .expect("request");
    let answer = call(FixedPatch::new(), request).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn the_default_limit_is_4_mib() {
    let mut review: Value = serde_json::from_str(fixtures::POD_CREATE_CONTROLLER).expect("JSON");
    review["request"]["object"]["metadata"]["annotations"]["padding"] =
        Value::String("x".repeat(3 * 1024 * 1024));
    let body = serde_json::to_vec(&review).expect("JSON");
    assert_eq!(
        call(FixedPatch::new(), post("/mutate", body)).await.status,
        StatusCode::OK
    );

    review["request"]["object"]["metadata"]["annotations"]["padding"] =
        Value::String("x".repeat(4 * 1024 * 1024));
    let body = serde_json::to_vec(&review).expect("JSON");
    assert_eq!(
        call(FixedPatch::new(), post("/mutate", body)).await.status,
        StatusCode::PAYLOAD_TOO_LARGE
    );
}

#[tokio::test]
async fn denials_carry_the_message_in_status() {
    let metrics = AdmissionMetrics::default();
    let answer = call_with(
        denier(),
        AdmissionConfig::default(),
        &metrics,
        post("/mutate", fixtures::POD_CREATE_CONTROLLER),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    let response = &answer.json()["response"];
    assert_eq!(
        response["uid"],
        fixtures::uid(fixtures::POD_CREATE_CONTROLLER)
    );
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 403);
    assert_eq!(response["status"]["reason"], "Forbidden");
    let message = answer.review_message();
    assert!(message.contains("IPC_LOCK is not allowed"), "{message}");
    assert!(response.get("patch").is_none());
    assert_eq!(metrics.requests("denied", "psa-restricted"), 1);
}

#[tokio::test]
async fn skipped_reviews_have_no_patch() {
    let skip: Arc<dyn Handler> = Arc::new(
        |_: &kube::core::admission::AdmissionRequest<kube::core::DynamicObject>| {
            Reviewed::skipped("not-opted-in")
        },
    );
    let metrics = AdmissionMetrics::default();
    let answer = call_with(
        skip,
        AdmissionConfig::default(),
        &metrics,
        post("/mutate", fixtures::POD_UPDATE),
    )
    .await;
    let response = &answer.json()["response"];
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none());
    assert!(response.get("patchType").is_none());
    assert!(response.get("warnings").is_none());
    assert_eq!(metrics.requests("skipped", "not-opted-in"), 1);
}

#[tokio::test]
async fn a_panicking_handler_is_an_error_answer_not_a_crash() {
    let metrics = AdmissionMetrics::default();
    let config = AdmissionConfig::default();
    let answer = call_with(
        panicker(),
        config.clone(),
        &metrics,
        post("/mutate", fixtures::POD_CREATE_CONTROLLER),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    let response = &answer.json()["response"];
    assert_eq!(response["allowed"], false);
    assert_eq!(
        response["uid"],
        fixtures::uid(fixtures::POD_CREATE_CONTROLLER)
    );
    assert_eq!(response["status"]["code"], 500);
    let message = answer.review_message();
    assert!(message.contains("panicked"), "{message}");
    assert_eq!(metrics.errors("panic"), 1);
    assert_eq!(metrics.requests("error", "panic"), 1);
}

#[tokio::test]
async fn a_slow_handler_is_answered_at_the_deadline() {
    let metrics = AdmissionMetrics::default();
    let config = AdmissionConfig {
        deadline: Duration::from_millis(200),
        ..AdmissionConfig::default()
    };
    let started = std::time::Instant::now();
    let answer = call_with(
        sleeper(Duration::from_millis(1500)),
        config,
        &metrics,
        post("/mutate", fixtures::POD_CREATE_CONTROLLER),
    )
    .await;
    // The message, not the clock, proves the deadline fired (the handler would have skipped).
    assert!(started.elapsed() < Duration::from_millis(1500));
    let response = &answer.json()["response"];
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["reason"], "InternalError");
    let message = answer.review_message();
    assert!(message.contains("deadline"), "{message}");
    assert_eq!(metrics.errors("deadline"), 1);
}

#[tokio::test]
async fn inline_handlers_panics_and_overruns_are_error_answers() {
    let metrics = AdmissionMetrics::default();
    let answer = call_with(
        Arc::new(Inline(panicker())),
        AdmissionConfig::default(),
        &metrics,
        post("/mutate", fixtures::POD_CREATE_CONTROLLER),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json()["response"]["status"]["code"], 500);
    assert_eq!(metrics.errors("panic"), 1);

    let config = AdmissionConfig {
        deadline: Duration::from_millis(50),
        ..AdmissionConfig::default()
    };
    let answer = call_with(
        Arc::new(Inline(sleeper(Duration::from_millis(200)))),
        config,
        &metrics,
        post("/mutate", fixtures::POD_CREATE_CONTROLLER),
    )
    .await;
    let response = &answer.json()["response"];
    assert_eq!(response["allowed"], false);
    let message = answer.review_message();
    assert!(message.contains("deadline"), "{message}");
    assert_eq!(metrics.errors("deadline"), 1);
}

#[tokio::test]
async fn the_api_servers_timeout_shortens_the_deadline() {
    let started = std::time::Instant::now();
    let answer = call(
        sleeper(Duration::from_millis(1500)),
        post("/mutate?timeout=500ms", fixtures::POD_CREATE_CONTROLLER),
    )
    .await;
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(350) && elapsed < Duration::from_millis(1500),
        "{elapsed:?}"
    );
    let message = answer.review_message();
    assert!(message.contains("400ms"), "{message}");
}

#[tokio::test]
async fn handler_errors_follow_the_error_policy() {
    let failing: Arc<dyn Handler> = Arc::new(
        |_: &kube::core::admission::AdmissionRequest<kube::core::DynamicObject>| Reviewed::Error {
            message: "profile cache empty".to_owned(),
        },
    );

    let metrics = AdmissionMetrics::default();
    let answer = call_with(
        failing.clone(),
        AdmissionConfig::default(),
        &metrics,
        post("/mutate", fixtures::POD_CREATE_CONTROLLER),
    )
    .await;
    let response = &answer.json()["response"];
    assert_eq!(response["allowed"], false);
    let message = answer.review_message();
    assert!(message.contains("profile cache empty"), "{message}");
    assert_eq!(metrics.errors("handler"), 1);

    let config = AdmissionConfig {
        on_error: ErrorPolicy::Allow,
        ..AdmissionConfig::default()
    };
    let answer = call_with(
        failing,
        config,
        &metrics,
        post("/mutate", fixtures::POD_CREATE_CONTROLLER),
    )
    .await;
    let response = &answer.json()["response"];
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none());
    assert!(
        response["warnings"][0]
            .as_str()
            .expect("warning")
            .contains("admitted without injection")
    );
    assert_eq!(metrics.errors("handler"), 2);
}
