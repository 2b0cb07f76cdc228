//! Kubernetes plumbing for the binaries that talk to an API server (feature `kube`).
//!
//! - [`Watch`]: kube-runtime's `watcher` with its default backoff, its errors logged, a
//!   [`Synced`] signal and an end at shutdown; [`Cache`]: the same watch kept in a
//!   kube-runtime `reflector` store. Modelled on kubert's `Runtime::watch`/`cache`.

mod watch;

pub use watch::{Cache, Synced, Watch};
