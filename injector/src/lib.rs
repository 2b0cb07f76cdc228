//! rdma-stream-injector: one label opts a pod in to RDMA streams.
//!
//! ```text
//!  AdmissionReview ──HTTPS──> server ──Handler──> webhook ──> core::plan (pure) ──> JSON Patch
//!                                                  │  namespace facts: namespaces (reflector)
//!                                                  │  profiles: profile::watch (last good wins)
//!  inject -f FILE ───────────────────────────────> workloads ──> core::plan + apply ──> YAML
//!  audit (kubeconfig) ── pods, namespaces ───────> audit ──> core::plan ──> not injected?
//!  certs: self-managed CA in a Secret, serving cert files, caBundle kept patched
//! ```
//!
//! Public: [`cli`] (the command line), [`profile`] (the config file's types and parser, which
//! the chart tests use), and the few types the tests and embedders name, re-exported here; the
//! modules behind them are private.

mod audit;
mod certs;
pub mod cli;
mod core;
mod namespaces;
pub mod profile;
mod server;
mod webhook;
mod workloads;

pub use core::apply;
pub use namespaces::NamespaceCache;
pub use server::{Handler, Outcome, Reviewed, Server, ServerConfig};
pub use webhook::InjectorHandler;
pub use workloads::parse_documents;
