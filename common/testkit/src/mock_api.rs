//! A mocked Kubernetes API server in the style of kube-rs/controller-rs (feature `kube`),
//! shared by the kube-side unit tests of `common`, the injector and the gateway.
//!
//! [`mock_client`] gives a real `kube::Client` whose transport is a `tower_test` mock and an
//! [`ApiServerVerifier`] holding the other end. Each test module lists the calls it expects
//! in a `Scenario` enum and answers them, in order, in a spawned task; every test ends with
//! [`timeout_after`] on that task, so a missing call fails fast instead of hanging.

use std::time::Duration;

use http::{Method, Request, Response};
use kube::{Client, client::Body};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tower_test::mock::{self, Handle, SendResponse};

/// Answer sender for one mocked request.
pub type Responder = SendResponse<Response<Body>>;

/// The API-server side of a mocked client.
pub struct ApiServerVerifier(Handle<Request<Body>, Response<Body>>);

/// A `kube::Client` (default namespace `default`) talking to a mocked API server.
pub fn mock_client() -> (Client, ApiServerVerifier) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), ApiServerVerifier(handle))
}

impl ApiServerVerifier {
    /// Waits for the next request and asserts its method and path (the URI without query).
    pub async fn expect(&mut self, method: Method, path: &str) -> (Request<Body>, Responder) {
        let (request, send) = self
            .0
            .next_request()
            .await
            .unwrap_or_else(|| panic!("client gone; expected {method} {path}"));
        assert_eq!(request.method(), method, "method of {}", request.uri());
        assert_eq!(request.uri().path(), path, "path of {}", request.uri());
        (request, send)
    }

    /// The next request, whatever it is (`None` once the client is gone).
    pub async fn next_request(&mut self) -> Option<(Request<Body>, Responder)> {
        self.0.next_request().await
    }

    /// Waits a little and asserts that no further request arrives.
    pub async fn expect_quiet(&mut self, wait: Duration) {
        if let Ok(Some((request, _))) = tokio::time::timeout(wait, self.0.next_request()).await {
            panic!("unexpected request {} {}", request.method(), request.uri());
        }
    }
}

/// The request's query string, empty if none.
pub fn query(request: &Request<Body>) -> String {
    request.uri().query().unwrap_or_default().to_owned()
}

/// The request body as JSON.
pub async fn body_json(request: Request<Body>) -> Value {
    let bytes = request
        .into_body()
        .collect_bytes()
        .await
        .expect("request body readable");
    serde_json::from_slice(&bytes).expect("request body is JSON")
}

/// Answers with `status` and a JSON body.
pub fn respond(send: Responder, status: u16, body: &Value) {
    send_bytes(
        send,
        status,
        serde_json::to_vec(body).expect("serializable"),
    );
}

/// Answers with `status` and a raw body (e.g. newline-separated watch events).
pub fn send_bytes(send: Responder, status: u16, body: Vec<u8>) {
    send.send_response(
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("valid response"),
    );
}

/// A LIST answer: `kind` (`ConfigMapList`, say) of `api_version` at resource version `rv`.
pub fn list(api_version: &str, kind: &str, rv: &str, items: Vec<Value>) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": { "resourceVersion": rv },
        "items": items,
    })
}

/// A WATCH answer: one JSON event (`ADDED`, `MODIFIED`, `ERROR`, ...) per line.
pub fn watch_events(events: &[(&str, Value)]) -> Vec<u8> {
    events
        .iter()
        .map(|(kind, object)| format!("{}\n", json!({ "type": kind, "object": object })))
        .collect::<String>()
        .into_bytes()
}

/// A `meta/v1` `Status` failure body, as the API server sends with 4xx/5xx answers.
pub fn status_failure(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

/// Awaits the scenario task, failing the test if it has not finished within `limit`.
pub async fn timeout_after(limit: Duration, scenario: JoinHandle<()>) {
    match tokio::time::timeout(limit, scenario).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Ok(Err(e)) => panic!("scenario task failed: {e}"),
        Err(_) => {
            panic!("scenario did not finish within {limit:?}: an expected API call never came")
        }
    }
}

/// Awaits the scenario task, failing the test if it has not finished within one second.
pub async fn timeout_after_1s(scenario: JoinHandle<()>) {
    timeout_after(Duration::from_secs(1), scenario).await;
}
