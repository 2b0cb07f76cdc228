//! rdma-stream-injector: one label opts a pod in to RDMA streams.
//!
//! ```text
//!  AdmissionReview ──HTTPS──> server ──Handler──> webhook ──> core::plan (pure) ──> JSON Patch
//!                                                  │  namespace facts: namespaces (reflector)
//!                                                  │  profiles: profile_watch (last good wins)
//!  inject -f FILE ───────────────────────────────> workloads ──> core::plan + apply ──> YAML
//!  audit (kubeconfig) ── pods, namespaces ───────> audit ──> core::plan ──> not injected?
//!  certs: self-managed CA in a Secret, serving cert files, caBundle kept patched
//! ```

pub mod audit;
pub mod certs;
pub mod cli;
pub mod core;
pub mod namespaces;
pub mod profile;
pub mod profile_watch;
pub mod server;
pub mod webhook;
pub mod workloads;
