//! Certificates for the webhook's HTTPS server.
//!
//! Two modes (see `docs/injector.md`):
//! - **cert-manager**: cert-manager writes `tls.crt`/`tls.key` into a mounted Secret and
//!   injects the caBundle; the server only has to read the files per handshake. Nothing here
//!   runs.
//! - **self-managed**: at start [`bootstrap()`] gets or creates the CA Secret (creation is the
//!   lock between replicas), issues the serving certificate and writes it for the server;
//!   [`run_serving_cert_renewal`] replaces it at two thirds of its life, and
//!   [`run_ca_bundle_controller`] keeps the caBundle of our MutatingWebhookConfiguration equal
//!   to the CA and re-patches it on drift; [`run_ca_follower`] follows the CA Secret, so a
//!   replaced or deleted CA reaches every replica without a restart ([`rotation`]: the
//!   bundle keeps the previous certificates for a new CA's first minutes).
//!
//! Layout: [`ca`] and [`issue`] are pure (rcgen); [`files`] writes atomically;
//! [`rotation`] is the pure bundle rule; [`bootstrap`](mod@bootstrap), [`follow`] and
//! [`cabundle`] talk to the API server through kube;
//! [`renew`] is the renewal loop.

pub mod bootstrap;
pub mod ca;
pub mod cabundle;
mod error;
pub mod files;
pub mod follow;
pub mod issue;
pub mod metrics;
pub mod renew;
pub mod rotation;

pub use bootstrap::{BootstrapConfig, bootstrap, get_or_create_ca};
pub use ca::CertAuthority;
pub use cabundle::run_ca_bundle_controller;
pub use error::CertError;
pub use files::{TLS_CERT_FILE, TLS_KEY_FILE, write_serving_cert};
pub use follow::run_ca_follower;
pub use issue::{ServiceIdentity, ServingCert, issue_serving_cert};
pub use metrics::CaMetrics;
pub use renew::run_serving_cert_renewal;
