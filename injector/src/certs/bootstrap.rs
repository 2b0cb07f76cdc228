//! Self-managed mode at start-up: get or create the CA Secret, issue the serving certificate
//! from it, write `tls.crt`/`tls.key` for the HTTPS server.
//!
//! The CA Secret's creation is the lock between replicas: every replica generates a candidate
//! CA and tries to CREATE the Secret; exactly one CREATE succeeds, the others get 409
//! AlreadyExists, GET the Secret and use the CA in it. So two replicas starting together
//! converge on one CA, and the caBundle they both keep patched is the same.

use std::{collections::BTreeMap, path::PathBuf};

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use rdma_streams_common::report::Report;
use tracing::{debug, info};

use super::{
    CertAuthority, CertError, ServiceIdentity, ServingCert, issue_serving_cert, write_serving_cert,
};

/// Key of the CA certificate (PEM) in the CA Secret.
pub const CA_CERT_KEY: &str = "ca.crt";
/// Key of the CA private key (PEM) in the CA Secret.
pub const CA_KEY_KEY: &str = "ca.key";
/// Field manager recorded on objects we write.
pub const FIELD_MANAGER: &str = "rdma-stream-injector";

/// How often CREATE-409-GET-404 (someone deleting the Secret while we race) is retried.
const CREATE_ATTEMPTS: usize = 3;

/// Where the self-managed certificates live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapConfig {
    /// The injector's namespace: holds the CA Secret and the webhook Service.
    pub namespace: String,
    /// Name of the CA Secret (`<name>-ca`).
    pub ca_secret: String,
    /// The Service the serving certificate is for.
    pub identity: ServiceIdentity,
    /// Directory that receives `tls.crt` and `tls.key`.
    pub cert_dir: PathBuf,
}

impl BootstrapConfig {
    /// `name` is the deployment's base name (the chart's fullname): the CA Secret is
    /// `<name>-ca`; `service` is the webhook Service in `namespace`.
    pub fn new(
        name: &str,
        namespace: impl Into<String>,
        service: impl Into<String>,
        cert_dir: impl Into<PathBuf>,
    ) -> Self {
        let namespace = namespace.into();
        Self {
            ca_secret: format!("{name}-ca"),
            identity: ServiceIdentity::new(service, namespace.clone()),
            namespace,
            cert_dir: cert_dir.into(),
        }
    }
}

/// Whether this replica created the CA or found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaOrigin {
    /// Our CREATE succeeded: the CA is the one we generated.
    Created,
    /// The Secret existed (another replica, or an earlier run): we use its CA.
    Existing,
}

/// What [`bootstrap`] produced.
#[derive(Debug)]
pub struct Bootstrapped {
    /// The CA: its PEM is the caBundle, it signs renewals.
    pub ca: CertAuthority,
    /// Whether we created it.
    pub origin: CaOrigin,
    /// The serving certificate now on disk.
    pub serving: ServingCert,
}

/// Gets or creates the CA Secret, issues the serving certificate and writes it into
/// `config.cert_dir`. API errors are returned (see [`CertError::is_transient`]); nothing is
/// written to disk unless a CA was obtained.
pub async fn bootstrap(
    client: &Client,
    config: &BootstrapConfig,
) -> Result<Bootstrapped, CertError> {
    let (ca, origin) = get_or_create_ca(client, &config.namespace, &config.ca_secret).await?;
    let serving = issue_serving_cert(&ca, &config.identity)?;
    write_serving_cert(&config.cert_dir, &serving).await?;
    info!(
        secret = %format!("{}/{}", config.namespace, config.ca_secret),
        ?origin,
        dir = %config.cert_dir.display(),
        renew_at = ?serving.renew_at(),
        "serving certificate issued"
    );
    Ok(Bootstrapped {
        ca,
        origin,
        serving,
    })
}

/// CREATE the CA Secret `namespace/name` with a freshly generated CA; on 409 AlreadyExists,
/// GET it and load the CA it holds.
pub async fn get_or_create_ca(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<(CertAuthority, CaOrigin), CertError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let candidate = CertAuthority::generate()?;
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    let secret = ca_secret(namespace, name, &candidate);
    for _ in 0..CREATE_ATTEMPTS {
        match secrets.create(&params, &secret).await {
            Ok(_) => {
                info!(secret = %format!("{namespace}/{name}"), "created CA Secret");
                return Ok((candidate, CaOrigin::Created));
            }
            Err(kube::Error::Api(status)) if status.is_already_exists() || status.code == 409 => {
                debug!(secret = %format!("{namespace}/{name}"), "CA Secret exists; reading it");
            }
            Err(e) => {
                return Err(CertError::kube(
                    format!("create Secret {namespace}/{name}"),
                    e,
                ));
            }
        }
        match secrets.get_opt(name).await {
            Ok(Some(existing)) => {
                let ca = ca_from_secret(namespace, name, &existing)?;
                return Ok((ca, CaOrigin::Existing));
            }
            // Deleted between our CREATE and GET: race again.
            Ok(None) => continue,
            Err(e) => return Err(CertError::kube(format!("get Secret {namespace}/{name}"), e)),
        }
    }
    Err(CertError::CaSecretRace {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    })
}

fn ca_secret(namespace: &str, name: &str, ca: &CertAuthority) -> Secret {
    let labels = BTreeMap::from([
        (
            "app.kubernetes.io/name".to_owned(),
            "rdma-stream-injector".to_owned(),
        ),
        (
            "app.kubernetes.io/component".to_owned(),
            "webhook-ca".to_owned(),
        ),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            "rdma-stream-injector".to_owned(),
        ),
    ]);
    let data = BTreeMap::from([
        (
            CA_CERT_KEY.to_owned(),
            ByteString(ca.cert_pem().as_bytes().to_vec()),
        ),
        (
            CA_KEY_KEY.to_owned(),
            ByteString(ca.key_pem().as_bytes().to_vec()),
        ),
    ]);
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(data),
        ..Secret::default()
    }
}

pub(crate) fn ca_from_secret(
    namespace: &str,
    name: &str,
    secret: &Secret,
) -> Result<CertAuthority, CertError> {
    let unusable = |reason: String| CertError::CaSecretUnusable {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        reason,
    };
    let field = |key: &'static str| -> Result<String, CertError> {
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| unusable(format!("no key {key}")))?;
        String::from_utf8(bytes.0.clone()).map_err(|_| unusable(format!("{key} is not UTF-8 PEM")))
    };
    let cert_pem = field(CA_CERT_KEY)?;
    let key_pem = field(CA_KEY_KEY)?;
    CertAuthority::from_pem(&cert_pem, &key_pem).map_err(|e| unusable(Report(&e).to_string()))
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use http::Method;
    use serde_json::{Value, json};

    use super::*;
    use crate::certs::{TLS_CERT_FILE, TLS_KEY_FILE, issue::verify_serving_cert};
    use rdma_streams_testkit::mock_api::{
        ApiServerVerifier, body_json, mock_client, respond, status_failure, timeout_after_1s,
    };

    const NS: &str = "rdma-streams";
    const SECRET: &str = "rdma-stream-injector-ca";
    const SECRETS_PATH: &str = "/api/v1/namespaces/rdma-streams/secrets";
    const SECRET_PATH: &str = "/api/v1/namespaces/rdma-streams/secrets/rdma-stream-injector-ca";

    /// The API calls a test expects, in order.
    enum Scenario {
        /// POST of a new CA Secret, answered 201.
        FreshCluster,
        /// POST answered 409, then GET answered with a Secret holding `existing`.
        SecretExists { existing: Value },
        /// POST answered 409, GET 404 (deleted meanwhile), POST again answered 201.
        SecretDeletedMidRace,
        /// POST answered 500.
        ApiServerError,
    }

    /// Answers the calls of `scenario`, in order, in a spawned task.
    fn run(mut api: ApiServerVerifier, scenario: Scenario) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            match scenario {
                Scenario::FreshCluster => handle_create(&mut api, 201).await,
                Scenario::SecretExists { existing } => {
                    handle_create(&mut api, 409).await;
                    let (_, send) = api.expect(Method::GET, SECRET_PATH).await;
                    respond(send, 200, &existing);
                }
                Scenario::SecretDeletedMidRace => {
                    handle_create(&mut api, 409).await;
                    let (_, send) = api.expect(Method::GET, SECRET_PATH).await;
                    respond(
                        send,
                        404,
                        &status_failure(404, "NotFound", "secrets not found"),
                    );
                    handle_create(&mut api, 201).await;
                }
                Scenario::ApiServerError => {
                    let (_, send) = api.expect(Method::POST, SECRETS_PATH).await;
                    respond(
                        send,
                        500,
                        &status_failure(500, "InternalError", "etcd down"),
                    );
                }
            }
        })
    }

    /// Expects the CREATE of a well-formed CA Secret and answers with `code`.
    async fn handle_create(api: &mut ApiServerVerifier, code: u16) {
        let (request, send) = api.expect(Method::POST, SECRETS_PATH).await;
        assert!(
            request
                .uri()
                .query()
                .unwrap_or_default()
                .contains("fieldManager=rdma-stream-injector"),
            "{}",
            request.uri()
        );
        let body = body_json(request).await;
        assert_eq!(body["metadata"]["name"], SECRET);
        assert_eq!(body["type"], "Opaque");
        let secret: Secret = serde_json::from_value(body.clone()).unwrap();
        // What we send must be a CA we can load again.
        ca_from_secret(NS, SECRET, &secret).unwrap();
        if code == 201 {
            respond(send, 201, &body);
        } else {
            respond(
                send,
                409,
                &status_failure(
                    409,
                    "AlreadyExists",
                    "secrets \"rdma-stream-injector-ca\" already exists",
                ),
            );
        }
    }

    fn config(dir: &std::path::Path) -> BootstrapConfig {
        BootstrapConfig::new("rdma-stream-injector", NS, "rdma-stream-injector", dir)
    }

    fn secret_json(ca: &CertAuthority) -> Value {
        serde_json::to_value(ca_secret(NS, SECRET, ca)).unwrap()
    }

    /// The leaf on disk verifies against `ca_pem` for every Service DNS name.
    fn assert_leaf_on_disk_signed_by(dir: &std::path::Path, ca_pem: &str) {
        let cert = std::fs::read_to_string(dir.join(TLS_CERT_FILE)).unwrap();
        let key = std::fs::read_to_string(dir.join(TLS_KEY_FILE)).unwrap();
        assert!(key.contains("PRIVATE KEY"));
        let identity = ServiceIdentity::new("rdma-stream-injector", NS);
        for name in identity.dns_names() {
            verify_serving_cert(ca_pem, &cert, &name, SystemTime::now()).unwrap();
        }
    }

    #[test]
    fn config_names_the_secret_after_the_deployment() {
        let c = config(std::path::Path::new("/certs"));
        assert_eq!(c.ca_secret, "rdma-stream-injector-ca");
        assert_eq!(
            c.identity.primary_dns_name(),
            "rdma-stream-injector.rdma-streams.svc"
        );
    }

    #[tokio::test]
    async fn fresh_cluster_creates_the_ca_and_writes_a_leaf_it_signed() {
        let (client, verifier) = mock_client();
        let scenario = run(verifier, Scenario::FreshCluster);
        let tmp = tempfile::tempdir().unwrap();
        let out = bootstrap(&client, &config(tmp.path())).await.unwrap();
        timeout_after_1s(scenario).await;
        assert_eq!(out.origin, CaOrigin::Created);
        assert_leaf_on_disk_signed_by(tmp.path(), out.ca.cert_pem());
        assert_eq!(
            std::fs::read_to_string(tmp.path().join(TLS_CERT_FILE)).unwrap(),
            out.serving.cert_pem
        );
    }

    #[tokio::test]
    async fn existing_ca_secret_wins_and_signs_the_leaf() {
        let existing = CertAuthority::generate().unwrap();
        let (client, verifier) = mock_client();
        let scenario = run(
            verifier,
            Scenario::SecretExists {
                existing: secret_json(&existing),
            },
        );
        let tmp = tempfile::tempdir().unwrap();
        let out = bootstrap(&client, &config(tmp.path())).await.unwrap();
        timeout_after_1s(scenario).await;
        assert_eq!(out.origin, CaOrigin::Existing);
        assert_eq!(out.ca.cert_pem(), existing.cert_pem());
        assert_leaf_on_disk_signed_by(tmp.path(), existing.cert_pem());
    }

    #[tokio::test]
    async fn secret_deleted_between_conflict_and_get_is_created_again() {
        let (client, verifier) = mock_client();
        let scenario = run(verifier, Scenario::SecretDeletedMidRace);
        let (ca, origin) = get_or_create_ca(&client, NS, SECRET).await.unwrap();
        timeout_after_1s(scenario).await;
        assert_eq!(origin, CaOrigin::Created);
        assert!(ca.cert_pem().contains("BEGIN CERTIFICATE"));
    }

    #[tokio::test]
    async fn unusable_existing_secret_is_reported_not_overwritten() {
        let (client, verifier) = mock_client();
        let broken = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": NS},
            "type": "Opaque",
            "data": {"ca.crt": "bm90IGEgY2VydA=="}
        });
        let scenario = run(verifier, Scenario::SecretExists { existing: broken });
        let tmp = tempfile::tempdir().unwrap();
        let err = bootstrap(&client, &config(tmp.path())).await.unwrap_err();
        timeout_after_1s(scenario).await;
        assert!(matches!(err, CertError::CaSecretUnusable { .. }), "{err}");
        assert!(!err.is_transient());
        assert!(!tmp.path().join(TLS_CERT_FILE).exists());
    }

    #[tokio::test]
    async fn api_error_is_returned_without_writing_anything() {
        let (client, verifier) = mock_client();
        let scenario = run(verifier, Scenario::ApiServerError);
        let tmp = tempfile::tempdir().unwrap();
        let err = bootstrap(&client, &config(tmp.path())).await.unwrap_err();
        timeout_after_1s(scenario).await;
        assert!(matches!(err, CertError::Kube { .. }), "{err}");
        assert!(err.is_transient());
        assert_eq!(err.metric_label(), "kube");
        assert!(!tmp.path().join(TLS_CERT_FILE).exists());
        assert!(!tmp.path().join(TLS_KEY_FILE).exists());
    }
}
