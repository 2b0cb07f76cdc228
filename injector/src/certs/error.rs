//! The one error type of the certificate layer.

use std::path::PathBuf;

/// Why a certificate operation failed. Nothing in `certs` panics on these; callers decide
/// whether to retry (see [`CertError::is_transient`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// rcgen could not generate a key pair or sign a certificate.
    #[error("certificate generation failed")]
    Generate(#[source] rcgen::Error),

    /// A CA certificate or key given as PEM could not be parsed.
    #[error("invalid CA {what} PEM: {reason}")]
    InvalidCaPem {
        /// `certificate` or `key`.
        what: &'static str,
        /// What the parser said.
        reason: String,
    },

    /// The CA key does not belong to the CA certificate.
    #[error("the CA key does not match the CA certificate")]
    CaKeyMismatch,

    /// A serving certificate does not verify against the CA for one of its DNS names.
    #[error(
        "serving certificate does not verify against the CA for {dns_name}: {reason} \
         (a CA not created by rdma-stream-injector, whose subject is not \
         CN={ca_cn}, cannot sign for us: delete the CA Secret to let the injector create one)",
        ca_cn = super::ca::CA_COMMON_NAME
    )]
    Verify {
        /// The DNS name that was checked.
        dns_name: String,
        /// What the verifier said.
        reason: String,
    },

    /// The CA Secret exists but lacks a key, or holds something that is not a usable CA.
    #[error(
        "CA Secret {namespace}/{name} is unusable: {reason} (delete it to let the injector create a new CA)"
    )]
    CaSecretUnusable {
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The CA Secret was reported as existing on CREATE and as absent on GET, repeatedly.
    #[error("CA Secret {namespace}/{name} kept disappearing between CREATE and GET")]
    CaSecretRace {
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
    },

    /// The MutatingWebhookConfiguration whose caBundle we keep does not exist.
    #[error("MutatingWebhookConfiguration {name} not found")]
    WebhookConfigNotFound {
        /// Its name.
        name: String,
    },

    /// A Kubernetes API call failed (transport error or an error Status from the API server).
    #[error("{action}")]
    Kube {
        /// What we were doing, e.g. `create Secret ns/name`.
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },

    /// Writing the serving certificate or key to disk failed.
    #[error("writing {path}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl CertError {
    /// A short, stable label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Generate(_) => "generate",
            Self::InvalidCaPem { .. } => "invalid_ca_pem",
            Self::CaKeyMismatch => "ca_key_mismatch",
            Self::Verify { .. } => "verify",
            Self::CaSecretUnusable { .. } => "ca_secret_unusable",
            Self::CaSecretRace { .. } => "ca_secret_race",
            Self::WebhookConfigNotFound { .. } => "webhook_config_not_found",
            Self::Kube { .. } => "kube",
            Self::Io { .. } => "io",
        }
    }

    /// Whether trying again later may succeed without anyone changing the cluster:
    /// transport errors, 409 conflicts, 429 and 5xx answers, and the CREATE/GET race.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Kube { source, .. } => match source {
                kube::Error::Api(status) => {
                    status.code == 409 || status.code == 429 || status.code >= 500
                }
                _ => true,
            },
            Self::CaSecretRace { .. } => true,
            _ => false,
        }
    }

    pub(crate) fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            action: action.into(),
            source,
        }
    }
}
