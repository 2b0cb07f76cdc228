//! Test doubles of the device plugin, used only as a dev-dependency (its unit and integration
//! tests, the benchmark, the examples), so the shipped binary carries none of them.
//!
//! - [`fixture`]: sysfs and dev trees in the kernel's layout ([`fixture::FixtureTree`]).
//! - [`fake_kubelet`]: a kubelet device manager and plugin watcher on the real protos.
//!
//! It does not depend on the plugin crate (the plugin's unit tests use it, and a dependency
//! back would build a second copy of the plugin's types): where the plugin has a type, the
//! fixture takes the kernel's plain values, and tests convert.

pub mod fake_kubelet;
pub mod fixture;
