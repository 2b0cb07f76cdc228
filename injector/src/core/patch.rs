//! Building a JSON Patch that cannot clobber what it did not mean to touch.
//!
//! The builder keeps a working copy of the pod and applies every operation to it as it is
//! emitted, so (a) later steps see earlier ones (a parent created once is not created twice),
//! and (b) the finished patch is known to apply to the pod it was planned on. Rules:
//! - `add` only where nothing is (or `null`), with missing parents created first, as empty
//!   objects or lists; list items are appended with `/-`;
//! - changing an existing value is a `test` of the old value followed by `replace` (or by `add`
//!   for a whole object member), so a concurrent change makes the patch fail instead of
//!   silently overwriting;
//! - pointers are built from tokens, so `rdma-streams.io/hca` is escaped as
//!   `rdma-streams.io~1hca`.

use json_patch::jsonptr::{Pointer, PointerBuf};
use json_patch::{AddOperation, Patch, PatchOperation, ReplaceOperation, TestOperation};
use serde_json::{Map, Value};

use super::Halt;
use super::pod::malformed;

/// The container kind a missing parent is created as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Object,
    List,
}

impl Kind {
    fn empty(self) -> Value {
        match self {
            Self::Object => Value::Object(Map::new()),
            Self::List => Value::Array(Vec::new()),
        }
    }

    fn matches(self, value: &Value) -> bool {
        match self {
            Self::Object => value.is_object(),
            Self::List => value.is_array(),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::Object => "an object",
            Self::List => "a list",
        }
    }
}

/// Collects operations and keeps the patched working copy.
#[derive(Debug, Clone)]
pub(crate) struct PatchBuilder {
    doc: Value,
    ops: Vec<PatchOperation>,
}

impl PatchBuilder {
    pub(crate) fn new(pod: &Value) -> Self {
        Self {
            doc: pod.clone(),
            ops: Vec::new(),
        }
    }

    /// The value at `path` in the working copy; `null` counts as absent.
    pub(crate) fn get(&self, path: &Pointer) -> Option<&Value> {
        self.doc.pointer(path.as_str()).filter(|v| !v.is_null())
    }

    /// Makes sure `base/keys[0]/keys[1]/...` exists, creating missing levels as objects and the
    /// last one as `leaf`. `base` must exist. Returns the full pointer.
    pub(crate) fn ensure(
        &mut self,
        base: &Pointer,
        keys: &[&str],
        leaf: Kind,
    ) -> Result<PointerBuf, Halt> {
        let mut path = base.to_buf();
        for (i, key) in keys.iter().enumerate() {
            path.push_back(*key);
            let kind = if i + 1 == keys.len() {
                leaf
            } else {
                Kind::Object
            };
            match self.get(&path) {
                Some(existing) if kind.matches(existing) => {}
                Some(existing) => return Err(malformed(path.as_str(), kind.describe(), existing)),
                None => self.push(PatchOperation::Add(AddOperation {
                    path: path.clone(),
                    value: kind.empty(),
                }))?,
            }
        }
        Ok(path)
    }

    /// Adds a member that must not exist yet (`null` counts as absent).
    pub(crate) fn add(&mut self, path: PointerBuf, value: Value) -> Result<(), Halt> {
        debug_assert!(
            self.get(&path).is_none(),
            "add over an existing value at {path}"
        );
        self.push(PatchOperation::Add(AddOperation { path, value }))
    }

    /// Appends to the list at `list`.
    pub(crate) fn append(&mut self, list: &Pointer, value: Value) -> Result<(), Halt> {
        let path = list.with_trailing_token("-");
        self.push(PatchOperation::Add(AddOperation { path, value }))
    }

    /// `test` that `path` holds `old`, then `replace` it with `new`.
    pub(crate) fn replace_tested(
        &mut self,
        path: PointerBuf,
        old: Value,
        new: Value,
    ) -> Result<(), Halt> {
        self.push(PatchOperation::Test(TestOperation {
            path: path.clone(),
            value: old,
        }))?;
        self.push(PatchOperation::Replace(ReplaceOperation {
            path,
            value: new,
        }))
    }

    /// Sets an object member: a plain `add` when absent, else `test` of the old value and an
    /// `add` (which replaces an existing member, RFC 6902 4.1).
    pub(crate) fn set_member_tested(&mut self, path: PointerBuf, new: Value) -> Result<(), Halt> {
        if let Some(old) = self.get(&path).cloned() {
            self.push(PatchOperation::Test(TestOperation {
                path: path.clone(),
                value: old,
            }))?;
        }
        self.push(PatchOperation::Add(AddOperation { path, value: new }))
    }

    fn push(&mut self, op: PatchOperation) -> Result<(), Halt> {
        json_patch::patch(&mut self.doc, std::slice::from_ref(&op))?;
        self.ops.push(op);
        Ok(())
    }

    pub(crate) fn finish(self) -> Patch {
        Patch(self.ops)
    }
}

/// `/metadata/annotations/<key>`, escaped.
pub(crate) fn annotation_pointer(key: &str) -> PointerBuf {
    PointerBuf::from_tokens(["metadata", "annotations", key])
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn pointers_escape_slashes_and_tildes() {
        assert_eq!(
            annotation_pointer("rdma-streams.io/status").as_str(),
            "/metadata/annotations/rdma-streams.io~1status"
        );
        assert_eq!(
            PointerBuf::from_tokens(["a~b/c"]).as_str(),
            "/a~0b~1c",
            "tilde before slash, RFC 6901"
        );
    }

    #[test]
    fn ensure_creates_parents_once_and_in_order() {
        let pod = json!({"spec": {"containers": [{"name": "a"}]}});
        let mut builder = PatchBuilder::new(&pod);
        let base = PointerBuf::parse("/spec/containers/0").expect("pointer");
        let first = builder
            .ensure(&base, &["resources", "limits"], Kind::Object)
            .expect("ensure");
        let again = builder
            .ensure(&base, &["resources", "limits"], Kind::Object)
            .expect("ensure");
        assert_eq!(first, again);
        let patch = builder.finish();
        let paths: Vec<&str> = patch.iter().map(|op| op.path().as_str()).collect();
        assert_eq!(
            paths,
            [
                "/spec/containers/0/resources",
                "/spec/containers/0/resources/limits"
            ]
        );
    }

    #[test]
    fn ensure_rejects_wrong_types() {
        let pod = json!({"spec": {"containers": [{"name": "a", "env": "oops"}]}});
        let mut builder = PatchBuilder::new(&pod);
        let base = PointerBuf::parse("/spec/containers/0").expect("pointer");
        assert!(matches!(
            builder.ensure(&base, &["env"], Kind::List),
            Err(Halt::Deny(super::super::DenyReason::MalformedPod, _))
        ));
    }

    #[test]
    fn null_parents_are_replaced_by_add() {
        let pod = json!({"metadata": {"annotations": null}});
        let mut builder = PatchBuilder::new(&pod);
        builder
            .ensure(
                &PointerBuf::parse("/metadata").expect("pointer"),
                &["annotations"],
                Kind::Object,
            )
            .expect("ensure");
        builder
            .add(annotation_pointer("x/y"), json!("1"))
            .expect("add");
        let patched = crate::core::apply(&pod, &builder.finish()).expect("apply");
        assert_eq!(patched, json!({"metadata": {"annotations": {"x/y": "1"}}}));
    }

    #[test]
    fn tested_replace_fails_on_a_changed_value() {
        let pod = json!({"a": "old"});
        let mut builder = PatchBuilder::new(&pod);
        builder
            .replace_tested(
                PointerBuf::parse("/a").expect("pointer"),
                json!("old"),
                json!("new"),
            )
            .expect("replace");
        let patch = builder.finish();
        assert_eq!(
            crate::core::apply(&pod, &patch).expect("apply"),
            json!({"a": "new"})
        );
        assert!(crate::core::apply(&json!({"a": "changed"}), &patch).is_err());
    }
}
