//! The real server: TLS with a client that trusts only the test CA, HTTP/1.1 and HTTP/2 by
//! ALPN, the admin endpoints, start-up validation and the drain.

use std::time::Duration;

use http::{Method, StatusCode, header};
use hyper::body::Bytes;
use rdma_streams_common::report::Report;
use serde_json::Value;

use super::{
    FixedPatch, Started, denier, fixed_patch, fixtures,
    support::{Client, Pki, Proto, base64_decode, get_plain, serial_hex, start, within},
};
use crate::server::{Readiness, Server, ServerConfig, ServerError, TlsError};

#[tokio::test]
async fn fixtures_over_http1_and_http2() {
    within(async {
        let handler = FixedPatch::new();
        let server = start(handler.clone(), |_| {}).await;
        let client = server.client();
        for proto in Proto::BOTH {
            for (name, fixture) in fixtures::VALID {
                let reply = client.post(proto, "/mutate?timeout=5s", fixture).await;
                let expected_alpn: &[u8] = match proto {
                    Proto::Http1 => b"http/1.1",
                    Proto::Http2 => b"h2",
                };
                assert_eq!(
                    reply.alpn.as_deref(),
                    Some(expected_alpn),
                    "{proto:?} {name}"
                );
                assert_eq!(reply.status, StatusCode::OK, "{proto:?} {name}");
                assert_eq!(
                    reply.headers[header::CONTENT_TYPE],
                    "application/json",
                    "{proto:?} {name}"
                );
                let review = reply.json();
                assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
                assert_eq!(review["kind"], "AdmissionReview");
                let response = &review["response"];
                assert_eq!(response["uid"], fixtures::uid(fixture), "{proto:?} {name}");
                assert_eq!(response["allowed"], true);
                assert_eq!(response["patchType"], "JSONPatch");
                let patch = base64_decode(response["patch"].as_str().expect("base64 patch"));
                let patch: Value = serde_json::from_slice(&patch).expect("JSON patch");
                assert_eq!(patch, serde_json::to_value(fixed_patch()).expect("patch"));
            }
        }
        assert_eq!(handler.seen.lock().expect("not poisoned").len(), 6);
        assert_eq!(server.metrics.requests("injected", "default"), 6);
        server.shutdown.cancel();
        server.task.await.expect("server task");
    })
    .await;
}

#[tokio::test]
async fn refusals_over_http1_and_http2() {
    within(async {
        let server = start(FixedPatch::new(), |config| {
            config.admission.body_limit = 8 * 1024;
        })
        .await;
        let client = server.client();
        for proto in Proto::BOTH {
            let reply = client
                .post(proto, "/validate", fixtures::POD_CREATE_CONTROLLER)
                .await;
            assert_eq!(reply.status, StatusCode::NOT_FOUND, "{proto:?}");
            let reply = client
                .send(proto, Method::GET, "/mutate", Bytes::new(), &[])
                .await;
            assert_eq!(reply.status, StatusCode::NOT_FOUND, "{proto:?}");
            let reply = client.post(proto, "/mutate", fixtures::V1BETA1).await;
            assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{proto:?}");
            assert!(
                reply.json()["message"]
                    .as_str()
                    .expect("message")
                    .contains("admission.k8s.io/v1beta1")
            );
            let reply = client.post(proto, "/mutate", fixtures::REQUEST_NULL).await;
            assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{proto:?}");
            let reply = client.post(proto, "/mutate", fixtures::GARBAGE).await;
            assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{proto:?}");
            let big = vec![b' '; 9 * 1024];
            let reply = client.post(proto, "/mutate", big).await;
            assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE, "{proto:?}");
        }
        assert_eq!(server.metrics.bad_requests("413", "too-large"), 2);
        assert_eq!(server.metrics.bad_requests("404", "not-found"), 4);
        server.shutdown.cancel();
    })
    .await;
}

#[tokio::test]
async fn denials_over_http2() {
    within(async {
        let server = start(denier(), |_| {}).await;
        let reply = server
            .client()
            .post(Proto::Http2, "/mutate", fixtures::POD_CREATE_CONTROLLER)
            .await;
        assert_eq!(reply.status, StatusCode::OK);
        let response = &reply.json()["response"];
        assert_eq!(response["allowed"], false);
        assert!(
            response["status"]["message"]
                .as_str()
                .expect("message")
                .contains("restricted")
        );
        server.shutdown.cancel();
    })
    .await;
}

const TLS12_ONLY: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS12];

#[tokio::test]
async fn tls_versions_alpn_and_names() {
    within(async {
        let server = start(FixedPatch::new(), |_| {}).await;
        let client = server.client();

        let tls13 = client
            .connect(&[b"h2", b"http/1.1"])
            .await
            .expect("TLS 1.3");
        assert_eq!(
            tls13.get_ref().1.protocol_version(),
            Some(rustls::ProtocolVersion::TLSv1_3)
        );
        assert_eq!(tls13.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));

        let tls12 = client
            .clone()
            .versions(TLS12_ONLY)
            .connect(&[b"http/1.1"])
            .await
            .expect("TLS 1.2");
        assert_eq!(
            tls12.get_ref().1.protocol_version(),
            Some(rustls::ProtocolVersion::TLSv1_2)
        );
        assert_eq!(tls12.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));

        let no_alpn = client.connect(&[]).await.expect("no ALPN");
        assert_eq!(no_alpn.get_ref().1.alpn_protocol(), None);

        // The IP SAN works too (the API server may be given an IP in clientConfig.url).
        client
            .clone()
            .server_name("127.0.0.1")
            .connect(&[b"h2"])
            .await
            .expect("IP SAN");

        // A client that trusts another CA refuses the server.
        let stranger = Client::new(server.addr, &Pki::new("another root").ca_der);
        assert!(stranger.connect(&[b"h2"]).await.is_err());
        // A name the certificate does not carry is refused.
        assert!(
            client
                .clone()
                .server_name("example.com")
                .connect(&[b"h2"])
                .await
                .is_err()
        );

        assert_eq!(client.served_serial().await, serial_hex(1001));
        server.shutdown.cancel();
    })
    .await;
}

#[tokio::test]
async fn admin_live_ready_metrics() {
    within(async {
        let server = start(FixedPatch::new(), |_| {}).await;
        let admin = server.admin.expect("admin bound");
        let caches = server.readiness.gate("namespace cache");

        let live = get_plain(admin, "/live").await;
        assert_eq!(live.status, StatusCode::OK);

        let ready = get_plain(admin, "/ready").await;
        assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(String::from_utf8_lossy(&ready.body).contains("namespace cache"));
        caches.set(true);
        let ready = get_plain(admin, "/ready").await;
        assert_eq!(ready.status, StatusCode::OK);
        assert!(String::from_utf8_lossy(&ready.body).contains(&serial_hex(1001)));

        server
            .client()
            .post(Proto::Http2, "/mutate", fixtures::POD_CREATE_CONTROLLER)
            .await;
        server.client().post(Proto::Http1, "/nope", "").await;
        let metrics = get_plain(admin, "/metrics").await;
        assert_eq!(metrics.status, StatusCode::OK);
        let text = String::from_utf8_lossy(&metrics.body);
        for needle in [
            r#"rdma_stream_injector_admission_requests_total{outcome="injected",reason="default"} 1"#,
            r#"rdma_stream_injector_admission_bad_requests_total{status="404",kind="not-found"} 1"#,
            "rdma_stream_injector_admission_duration_seconds_count 1",
            "rdma_stream_injector_admission_in_flight 0",
            "rdma_stream_injector_tls_reloads_total 0",
            "rdma_stream_injector_tls_reload_failures_total 0",
            "rdma_stream_injector_tls_cert_not_after_seconds ",
        ] {
            assert!(text.contains(needle), "{needle} missing from\n{text}");
        }
        assert_eq!(get_plain(admin, "/nope").await.status, StatusCode::NOT_FOUND);
        server.shutdown.cancel();
    })
    .await;
}

#[tokio::test]
async fn drain_finishes_in_flight_reviews_then_stops() {
    within(async {
        let handler = Started::new(Duration::from_millis(600));
        let server = start(handler.clone(), |_| {}).await;
        let admin = server.admin.expect("admin bound");
        let mut in_flight = Vec::new();
        for proto in Proto::BOTH {
            let client = server.client();
            in_flight.push(tokio::spawn(async move {
                client
                    .post(proto, "/mutate", fixtures::POD_CREATE_CONTROLLER)
                    .await
            }));
        }
        handler.wait_for(2).await;
        server.shutdown.cancel();
        tokio::time::sleep(Duration::from_millis(50)).await;

        // Not ready while draining; new connections are refused.
        assert_eq!(
            get_plain(admin, "/ready").await.status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert!(server.client().connect(&[b"h2"]).await.is_err());

        for request in in_flight {
            let reply = request.await.expect("request task");
            assert_eq!(reply.status, StatusCode::OK);
            assert_eq!(reply.json()["response"]["allowed"], true);
        }
        server.task.await.expect("server stops after the drain");
        assert!(
            tokio::net::TcpStream::connect(admin).await.is_err(),
            "admin stopped last"
        );
    })
    .await;
}

#[tokio::test]
async fn the_drain_has_a_deadline() {
    within(async {
        let handler = Started::new(Duration::from_secs(3));
        let server = start(handler.clone(), |config| {
            config.admission.deadline = Duration::from_secs(30);
            config.http.drain_timeout = Duration::from_millis(300);
        })
        .await;
        let client = server.client();
        let stuck = tokio::spawn(async move {
            client
                .post(Proto::Http2, "/mutate", fixtures::POD_CREATE_CONTROLLER)
                .await
        });
        handler.wait_for(1).await;
        let started = std::time::Instant::now();
        server.shutdown.cancel();
        server.task.await.expect("server task");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        // The client sees its connection closed (its task fails); nothing else to check.
        let _ = stuck.await;
    })
    .await;
}

#[tokio::test]
async fn startup_errors_name_the_file() {
    within(async {
        let pki = Pki::new("root");
        let leaf = pki.leaf(7);
        let other = pki.leaf(8);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = |name: &str| dir.path().join(name);
        std::fs::write(path("good.crt"), &leaf.cert_pem).expect("write");
        std::fs::write(path("good.key"), &leaf.key_pem).expect("write");
        std::fs::write(path("other.key"), &other.key_pem).expect("write");
        std::fs::write(path("junk.pem"), "not PEM at all\n").expect("write");
        std::fs::write(
            path("broken.pem"),
            "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
        )
        .expect("write");

        let bind = |cert: &str, key: &str| {
            let config = ServerConfig::new(([127, 0, 0, 1], 0).into(), path(cert), path(key));
            async move {
                Server::bind(
                    config,
                    FixedPatch::new(),
                    Readiness::new(),
                    &mut Default::default(),
                )
                .await
            }
        };
        let message = |error: ServerError| Report(&error).to_string();

        let error = bind("missing.crt", "good.key")
            .await
            .expect_err("missing cert");
        assert!(matches!(error, ServerError::Tls(TlsError::Read { .. })));
        let text = message(error);
        assert!(
            text.contains("missing.crt")
                && text.ends_with(": No such file or directory (os error 2)"),
            "{text}"
        );

        let error = bind("junk.pem", "good.key")
            .await
            .expect_err("no certificate");
        assert!(matches!(
            error,
            ServerError::Tls(TlsError::NoCertificate { .. })
        ));
        assert!(message(error).contains("junk.pem"));

        let error = bind("broken.pem", "good.key").await.expect_err("bad PEM");
        assert!(message(error).contains("broken.pem"));

        let error = bind("good.crt", "junk.pem").await.expect_err("no key");
        assert!(message(error).contains("junk.pem"));

        let error = bind("good.crt", "other.key")
            .await
            .expect_err("mismatched key");
        assert!(matches!(error, ServerError::Tls(TlsError::Pair { .. })));
        let text = message(error);
        assert!(
            text.contains("good.crt") && text.contains("other.key"),
            "{text}"
        );

        let server = bind("good.crt", "good.key").await.expect("good pair");
        let taken = server.local_addr();
        let config = ServerConfig::new(taken, path("good.crt"), path("good.key"));
        let error = Server::bind(
            config,
            FixedPatch::new(),
            Readiness::new(),
            &mut Default::default(),
        )
        .await
        .expect_err("address in use");
        assert!(matches!(error, ServerError::Bind { .. }));
        assert!(error.to_string().contains(&taken.to_string()));
    })
    .await;
}

#[tokio::test]
async fn many_concurrent_reviews_on_one_http2_connection_and_many_http1() {
    within(async {
        let server = start(FixedPatch::new(), |_| {}).await;
        let mut tasks = Vec::new();
        for i in 0..32 {
            let client = server.client();
            let proto = if i % 2 == 0 {
                Proto::Http1
            } else {
                Proto::Http2
            };
            tasks.push(tokio::spawn(async move {
                client
                    .post(proto, "/mutate", fixtures::POD_CREATE_DRY_RUN)
                    .await
                    .status
            }));
        }
        for task in tasks {
            assert_eq!(task.await.expect("task"), StatusCode::OK);
        }
        assert_eq!(server.metrics.requests("injected", "default"), 32);
        server.shutdown.cancel();
    })
    .await;
}
