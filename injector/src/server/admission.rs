//! `POST /mutate`: AdmissionReview v1 in, AdmissionReview v1 out.
//!
//! ```text
//! request ─ path/method ─ Content-Type ─ size ─ JSON ─ apiVersion/kind ─ request present
//!   404      404            415            413    400     400               400
//!         ─ strip managedFields ─ Handler::review on spawn_blocking under the deadline
//!         ─ 200 AdmissionReview { response: { uid, allowed, patch, warnings, status, ... } }
//! ```
//!
//! Choices, and why:
//! - Only `POST /mutate` (any query string: the API server appends `?timeout=5s`). Every other
//!   path *and* every other method on `/mutate` is 404, as in linkerd's admission service: the
//!   webhook has exactly one resource, and the body of the 404 names it.
//! - `Content-Type` may be missing or any JSON type (`application/json`, `...+json`, with
//!   parameters); another explicit type is 415.
//! - The body limit (default 4 MiB, between NRI's 1 MiB and Linkerd's 10 MiB) is checked against
//!   `Content-Length` before reading, then enforced while reading, so an oversized or endless
//!   body is never buffered past the limit.
//! - Anything that is not a well-formed AdmissionReview `admission.k8s.io/v1` with a `request`
//!   is 400 with a Kubernetes `Status` JSON body naming the problem, never a panic or a 500. The
//!   API server never sends such requests; these answers are for people and for fuzzing.
//! - The handler runs on a blocking thread under a deadline: the smaller of the configured one
//!   (default 4 s, below the webhook's `timeoutSeconds: 5`) and 4/5 of the API server's
//!   `?timeout=`. When the deadline passes, the handler panics or returns
//!   [`Reviewed::Error`], the answer follows [`ErrorPolicy`]: by default a clear denial
//!   (`allowed: false`, `status.code` 500, reason `InternalError`). With `failurePolicy: Fail`
//!   the API server would reject the pod anyway after its own timeout, but with a vaguer
//!   message and later; answering first tells the user what happened. `ErrorPolicy::Allow`
//!   admits the pod unchanged with a warning instead (the `failurePolicy: Ignore` behaviour).
//! - Denials carry `status.code` 403, reason `Forbidden` and the handler's message in
//!   `status.message`, which kubectl prints after "admission webhook ... denied the request:".

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::Body,
    extract::{Request, State},
    response::Response,
    routing::post,
};
use http::{StatusCode, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use kube::core::{
    DynamicObject, Status,
    admission::{
        AdmissionRequest, AdmissionResponse, AdmissionReview, META_API_VERSION_V1, META_KIND,
    },
};
use rdma_streams_common::report::Report;

use super::{
    handler::{Handler, Reviewed},
    metrics::AdmissionMetrics,
};

/// The one path served.
pub const MUTATE_PATH: &str = "/mutate";

/// Default body limit: 4 MiB. A pod is a few KiB; the API server's own request limit is 3 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 4 * 1024 * 1024;

/// Default per-request deadline: below the webhook's `timeoutSeconds: 5`.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(4);

/// Settings of the `/mutate` endpoint.
#[derive(Clone, Debug)]
pub struct AdmissionConfig {
    /// Largest accepted request body, in bytes.
    pub body_limit: usize,
    /// Longest time the handler may take; see the module docs.
    pub deadline: Duration,
    /// What to answer when the handler fails, panics or misses the deadline.
    pub on_error: ErrorPolicy,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            body_limit: DEFAULT_BODY_LIMIT,
            deadline: DEFAULT_DEADLINE,
            on_error: ErrorPolicy::Deny,
        }
    }
}

/// The answer to a review the handler could not decide.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ErrorPolicy {
    /// `allowed: false` with the reason (status code 500, `InternalError`); matches the chart's
    /// `failurePolicy: Fail`.
    #[default]
    Deny,
    /// `allowed: true`, no patch, a warning; matches `failurePolicy: Ignore`.
    Allow,
}

/// State behind the router.
struct Admission {
    handler: Arc<dyn Handler>,
    config: AdmissionConfig,
    metrics: AdmissionMetrics,
}

/// A request refused before the handler: HTTP status, metric kind, message.
struct Refusal {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

/// The `/mutate` router. Serve it with [`super::https::serve`], or call it with
/// `tower::ServiceExt::oneshot` in tests.
pub fn router(
    handler: Arc<dyn Handler>,
    config: AdmissionConfig,
    metrics: AdmissionMetrics,
) -> Router {
    let state = Arc::new(Admission {
        handler,
        config,
        metrics,
    });
    Router::new()
        .route(MUTATE_PATH, post(mutate))
        .fallback(not_found)
        .method_not_allowed_fallback(not_found)
        .with_state(state)
}

async fn not_found(State(admission): State<Arc<Admission>>, request: Request) -> Response {
    tracing::debug!(method = %request.method(), path = request.uri().path(), "not found");
    admission.refuse(Refusal {
        status: StatusCode::NOT_FOUND,
        kind: "not-found",
        message: format!(
            "{} {}: not found; this server answers only POST {MUTATE_PATH}",
            request.method(),
            request.uri().path()
        ),
    })
}

async fn mutate(State(admission): State<Arc<Admission>>, request: Request) -> Response {
    let started = Instant::now();
    let _in_flight = admission.metrics.in_flight();
    let deadline = admission.deadline(request.uri().query());
    let response = match admission.read(request).await {
        Ok(review) => admission.review(review, deadline).await,
        Err(refusal) => admission.refuse(refusal),
    };
    admission.metrics.observe(started.elapsed().as_secs_f64());
    response
}

// === impl Admission ===

impl Admission {
    /// The deadline for this request: the configured one, shortened to 4/5 of the API
    /// server's `?timeout=` when that is smaller.
    fn deadline(&self, query: Option<&str>) -> Duration {
        let requested = query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .find_map(|pair| pair.strip_prefix("timeout="))
            .and_then(parse_go_duration)
            .map(|timeout| timeout.mul_f64(0.8));
        match requested {
            Some(requested) if !requested.is_zero() => requested.min(self.config.deadline),
            _ => self.config.deadline,
        }
    }

    /// Checks the envelope and reads the body into a v1 AdmissionReview with a request.
    async fn read(&self, request: Request) -> Result<AdmissionRequest<DynamicObject>, Refusal> {
        let bad = |kind, message: String| Refusal {
            status: StatusCode::BAD_REQUEST,
            kind,
            message,
        };
        if let Some(value) = request.headers().get(header::CONTENT_TYPE)
            && !is_json(value)
        {
            return Err(Refusal {
                status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
                kind: "media-type",
                message: format!(
                    "Content-Type {:?} is not JSON; send application/json",
                    String::from_utf8_lossy(value.as_bytes())
                ),
            });
        }

        let limit = self.config.body_limit;
        let too_large = || Refusal {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            kind: "too-large",
            message: format!("request body exceeds the limit of {limit} bytes"),
        };
        let body = request.into_body();
        if usize::try_from(hyper::body::Body::size_hint(&body).lower()).map_or(true, |n| n > limit)
        {
            return Err(too_large());
        }
        let bytes = match Limited::new(body, limit).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(error) if error.downcast_ref::<LengthLimitError>().is_some() => {
                return Err(too_large());
            }
            Err(error) => {
                return Err(bad(
                    "body",
                    format!("cannot read the request body: {}", Report(&*error)),
                ));
            }
        };

        let review: AdmissionReview<DynamicObject> =
            serde_json::from_slice(&bytes).map_err(|error| {
                bad(
                    "malformed",
                    format!("malformed AdmissionReview: {}", Report(&error)),
                )
            })?;
        if review.types.api_version != META_API_VERSION_V1 || review.types.kind != META_KIND {
            return Err(bad(
                "version",
                format!(
                    "unsupported {}/{}: only {META_API_VERSION_V1} {META_KIND} is served; set \
                     admissionReviewVersions: [v1] in the webhook configuration",
                    review.types.api_version, review.types.kind
                ),
            ));
        }
        let mut request: AdmissionRequest<DynamicObject> = review
            .try_into()
            .map_err(|_| bad("no-request", "AdmissionReview has no request".to_owned()))?;
        for object in [&mut request.object, &mut request.old_object]
            .into_iter()
            .flatten()
        {
            object.metadata.managed_fields = None;
        }
        Ok(request)
    }

    /// Runs the handler under the deadline and answers 200 with an AdmissionReview.
    async fn review(
        &self,
        request: AdmissionRequest<DynamicObject>,
        deadline: Duration,
    ) -> Response {
        let base = AdmissionResponse::from(&request);
        let uid = request.uid.clone();
        let namespace = request.namespace.clone().unwrap_or_default();
        let (name, generate_name) = request.object.as_ref().map_or_else(Default::default, |o| {
            (
                o.metadata.name.clone().unwrap_or_default(),
                o.metadata.generate_name.clone().unwrap_or_default(),
            )
        });
        let operation = request.operation.clone();
        let dry_run = request.dry_run;

        let handler = self.handler.clone();
        let ran = if handler.is_inline() {
            // Pure CPU work: run it here; a deadline can only be judged afterwards.
            let started = std::time::Instant::now();
            let result =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler.review(&request)));
            match result {
                Ok(_) if started.elapsed() > deadline => Err(()),
                Ok(reviewed) => Ok(Ok(reviewed)),
                Err(_) => Ok(Err("the handler panicked".to_string())),
            }
        } else {
            let task = tokio::task::spawn_blocking(move || handler.review(&request));
            match tokio::time::timeout(deadline, task).await {
                Ok(Ok(reviewed)) => Ok(Ok(reviewed)),
                Ok(Err(error)) => Ok(Err(Report(&error).to_string())),
                Err(_) => Err(()),
            }
        };
        let reviewed = match ran {
            Ok(Ok(reviewed)) => reviewed,
            Ok(Err(error)) => {
                self.metrics.error("panic");
                tracing::error!(%uid, %namespace, %name, %generate_name, %error, "handler panicked");
                return self.answer_error(base, "panic", "internal error (the handler panicked)");
            }
            Err(()) => {
                self.metrics.error("deadline");
                tracing::warn!(%uid, %namespace, %name, %generate_name, ?deadline, "handler missed the deadline");
                return self.answer_error(
                    base,
                    "deadline",
                    &format!("internal deadline of {deadline:?} exceeded"),
                );
            }
        };

        match reviewed {
            Reviewed::Allow(allowed) => {
                let mut response = base.clone();
                if let Some(patch) = allowed.patch.filter(|p| !p.0.is_empty()) {
                    response = match response.with_patch(patch) {
                        Ok(response) => response,
                        Err(error) => {
                            self.metrics.error("encode");
                            tracing::error!(%uid, error = %Report(&error), "cannot encode the patch");
                            let what = "internal error (cannot encode the patch)";
                            return self.answer_error(base, "encode", what);
                        }
                    };
                }
                if !allowed.warnings.is_empty() {
                    response.warnings = Some(allowed.warnings);
                }
                response.audit_annotations = allowed.audit.into_iter().collect::<HashMap<_, _>>();
                let outcome = allowed.outcome.as_str();
                self.metrics.answered(outcome, allowed.reason);
                tracing::debug!(%uid, %namespace, %name, %generate_name, ?operation, dry_run, outcome, reason = allowed.reason, "admitted");
                self.answer(response)
            }
            Reviewed::Deny { message, reason } => {
                self.metrics.answered("denied", reason);
                tracing::debug!(%uid, %namespace, %name, %generate_name, ?operation, dry_run, reason, %message, "denied");
                let mut response = base.deny(&message);
                response.result = Status::failure(&message, "Forbidden").with_code(403);
                self.answer(response)
            }
            Reviewed::Error { message } => {
                self.metrics.error("handler");
                tracing::error!(%uid, %namespace, %name, %generate_name, ?operation, error = %message, "handler failed");
                self.answer_error(base, "handler", &format!("internal error: {message}"))
            }
        }
    }

    /// Answers an undecided review according to the error policy.
    fn answer_error(&self, base: AdmissionResponse, kind: &'static str, what: &str) -> Response {
        self.metrics.answered("error", kind);
        let response = match self.config.on_error {
            ErrorPolicy::Deny => {
                let message = format!(
                    "rdma-streams injector: {what}; the object was not admitted, retry or see the \
                     injector's logs"
                );
                let mut response = base.deny(&message);
                response.result = Status::failure(&message, "InternalError").with_code(500);
                response
            }
            ErrorPolicy::Allow => {
                let mut response = base;
                response.warnings = Some(vec![format!(
                    "rdma-streams injector: {what}; admitted without injection"
                )]);
                response
            }
        };
        self.answer(response)
    }

    /// 200 with the AdmissionReview v1 wrapping `response` (uid, apiVersion and kind echoed).
    ///
    /// kube-core serialises `patch` (a Go `[]byte`) as an array of numbers; the API server's
    /// decoder tolerates that, but the documented form is a base64 string, which is also a third
    /// of the size, so that is what is sent.
    fn answer(&self, response: AdmissionResponse) -> Response {
        let patch = response.patch.as_deref().map(base64);
        let encoded = serde_json::to_value(response.into_review()).and_then(|mut review| {
            if let (Some(patch), Some(slot)) = (patch, review.pointer_mut("/response/patch")) {
                *slot = serde_json::Value::String(patch);
            }
            serde_json::to_vec(&review)
        });
        match encoded {
            Ok(body) => json_response(StatusCode::OK, body),
            Err(error) => {
                self.metrics.error("encode");
                tracing::error!(error = %Report(&error), "cannot encode the AdmissionReview");
                status_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "cannot encode the AdmissionReview",
                )
            }
        }
    }

    fn refuse(&self, refusal: Refusal) -> Response {
        self.metrics
            .bad_request(status_label(refusal.status), refusal.kind);
        tracing::debug!(status = refusal.status.as_u16(), kind = refusal.kind, message = %refusal.message, "refused");
        status_response(refusal.status, &refusal.message)
    }
}

fn status_label(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "400",
        404 => "404",
        413 => "413",
        415 => "415",
        _ => "other",
    }
}

/// A Kubernetes `Status` body for a refused request.
fn status_response(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": status.canonical_reason().unwrap_or_default().replace(' ', ""),
        "code": status.as_u16(),
    });
    json_response(status, body.to_string().into_bytes())
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

/// Standard base64 with padding (RFC 4648), as Go's `encoding/json` writes a `[]byte`.
fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn is_json(value: &header::HeaderValue) -> bool {
    let Ok(value) = value.to_str() else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Parses the Go `time.Duration` strings the API server sends (`5s`, `1.5s`, `500ms`, `1m0s`).
fn parse_go_duration(text: &str) -> Option<Duration> {
    let mut rest = text;
    let mut total = 0.0_f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(split);
        let number: f64 = number.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += number * scale;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse_go_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_go_duration("1m0s"), Some(Duration::from_secs(60)));
        assert_eq!(parse_go_duration(""), None);
        assert_eq!(parse_go_duration("5"), None);
        assert_eq!(parse_go_duration("s"), None);
        assert_eq!(parse_go_duration("5x"), None);
    }

    /// The API server's `?timeout=` is peer input: whatever it says, the parse ends, and the
    /// deadline is never zero and never longer than the configured one.
    #[test]
    fn timeouts_of_any_text_give_a_bounded_deadline() {
        use proptest::prelude::*;
        let admission = Admission {
            handler: Arc::new(|_: &AdmissionRequest<DynamicObject>| Reviewed::skipped("test")),
            config: AdmissionConfig::default(),
            metrics: AdmissionMetrics::default(),
        };
        let number = "[0-9]{0,25}(\\.[0-9]{0,25})?";
        let unit = "(h|m|s|ms|us|µs|ns|x|\\.|)";
        let text = prop_oneof![
            "(?s).{0,40}",
            proptest::collection::vec((number, unit), 0..6)
                .prop_map(|parts| parts.into_iter().map(|(n, u)| n + &u).collect::<String>()),
        ];
        rdma_streams_testkit::fuzz::run(
            "admission timeout query",
            5_000,
            Duration::from_secs(30),
            move || text,
            move |text| {
                let parsed = parse_go_duration(&text);
                let whole_seconds = text.strip_suffix('s').filter(|n| {
                    !n.is_empty() && n.len() < 10 && n.bytes().all(|b| b.is_ascii_digit())
                });
                if let Some(n) = whole_seconds {
                    prop_assert_eq!(parsed, Some(Duration::from_secs(n.parse().unwrap())));
                }
                let deadline = admission.deadline(Some(&format!("a=b&timeout={text}")));
                prop_assert!(
                    !deadline.is_zero() && deadline <= DEFAULT_DEADLINE,
                    "{deadline:?}"
                );
                Ok(())
            },
        );
    }

    #[test]
    fn base64_rfc4648_vectors() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (input, expected) in cases {
            assert_eq!(base64(input.as_bytes()), expected);
        }
    }

    #[test]
    fn json_content_types() {
        let ok = |s: &'static str| is_json(&header::HeaderValue::from_static(s));
        assert!(ok("application/json"));
        assert!(ok("application/json; charset=utf-8"));
        assert!(ok("Application/JSON"));
        assert!(ok("application/merge-patch+json"));
        assert!(!ok("text/plain"));
        assert!(!ok("application/yaml"));
    }
}
