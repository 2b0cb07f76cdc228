//! The `rdma-streams.io/status` annotation: what was injected, and a hash that makes
//! re-planning the same injection a no-op (reinvocation, two injector replicas, a pod created
//! from an offline-injected template).
//!
//! The hash covers the injection format, the mode, the profile name, the effective profile
//! (after Pod Security adjustments) and the target containers. It is FNV-1a (64 bit) over the
//! canonical JSON of those: an identity check between our own outputs, not a security
//! measure, so no cryptographic hash is needed (the `fnv` crate's hasher). The injector
//! version is recorded but not hashed, so upgrading the injector does not re-inject.

use std::hash::Hasher;

use fnv::FnvHasher;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::effective::Effective;
use super::patch::{Kind, PatchBuilder, annotation_pointer};
use super::{CoreError, Halt};
use json_patch::jsonptr::PointerBuf;

/// Bumped when the shape of an injection changes, so old pods are planned again.
const FORMAT: u32 = 1;

/// The status annotation's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InjectionStatus {
    /// Injector version that wrote it.
    pub version: String,
    /// Profile used.
    pub profile: String,
    /// Target containers.
    pub containers: Vec<String>,
    /// Hash of the injection (16 hex digits).
    pub hash: String,
}

#[derive(Serialize)]
struct Hashed<'a> {
    format: u32,
    profile: &'a str,
    containers: &'a [String],
    injection: &'a Effective,
}

impl InjectionStatus {
    pub(crate) fn new(
        profile: &str,
        containers: Vec<String>,
        effective: &Effective,
    ) -> Result<Self, CoreError> {
        let canonical = serde_json::to_vec(&Hashed {
            format: FORMAT,
            profile,
            containers: &containers,
            injection: effective,
        })?;
        Ok(Self {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            profile: profile.to_owned(),
            containers,
            hash: format!("{:016x}", fnv1a64(&canonical)),
        })
    }

    /// Reads an annotation value; `None` if it is not ours or unreadable.
    pub fn parse(value: &str) -> Option<Self> {
        serde_json::from_str(value).ok()
    }

    /// The annotation value.
    pub fn to_annotation(&self) -> Result<String, CoreError> {
        Ok(serde_json::to_string(self)?)
    }
}

/// Writes the status annotation (a `test`-guarded overwrite when an older one exists).
pub(crate) fn write(builder: &mut PatchBuilder, status: &InjectionStatus) -> Result<(), Halt> {
    builder.ensure(
        &PointerBuf::root(),
        &["metadata", "annotations"],
        Kind::Object,
    )?;
    builder.set_member_tested(
        annotation_pointer(super::names::STATUS_ANNOTATION),
        Value::String(status.to_annotation()?),
    )
}

/// FNV-1a 64 over exactly `bytes` (`Hasher::write`, not `Hash::hash`, which would add a
/// terminator byte to a `str`).
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hasher = FnvHasher::default();
    hasher.write(bytes);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn status_round_trips() {
        let status = InjectionStatus {
            version: "0.1.0".to_owned(),
            profile: "default".to_owned(),
            containers: vec!["app".to_owned()],
            hash: "0123456789abcdef".to_owned(),
        };
        let text = status.to_annotation().expect("encode");
        assert_eq!(InjectionStatus::parse(&text), Some(status));
        assert_eq!(InjectionStatus::parse("not json"), None);
    }
}
