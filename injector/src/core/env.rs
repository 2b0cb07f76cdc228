//! Target container environment: `LD_PRELOAD` and the profile's variables.
//!
//! `LD_PRELOAD`:
//! - absent: added with the shim path;
//! - a literal: the shim path is appended with `:` unless it is already one of the entries
//!   (glibc splits on `:` and spaces); the old value is `test`ed before the `replace`;
//! - `valueFrom`: left alone, with a warning (the value is unknown at admission time);
//! - duplicated names: Kubernetes uses the last entry, so that is the one extended.
//!
//! Profile variables are added only when the container does not set them already: the user's
//! value wins, with a warning when it differs.

use serde_json::{Value, json};

use super::Halt;
use super::effective::Effective;
use super::names;
use super::patch::{Kind, PatchBuilder};
use super::pod::{ContainerView, malformed, non_null};

/// Adds env to one target container.
pub(crate) fn inject(
    builder: &mut PatchBuilder,
    container: &ContainerView<'_>,
    effective: &Effective,
    warnings: &mut Vec<String>,
) -> Result<(), Halt> {
    let Some(shim) = effective.shim() else {
        return Ok(());
    };
    let library = shim.library_path();
    let env_pointer = container.pointer().with_trailing_token("env");
    let entries = container.list("env")?;

    let mut named = Vec::with_capacity(entries.len());
    for (index, entry) in entries.iter().enumerate() {
        if !entry.is_object() {
            return Err(malformed(
                &format!("{env_pointer}/{index}"),
                "an object",
                entry,
            ));
        }
        match entry.get("name").and_then(Value::as_str) {
            Some(name) => named.push((index, name, entry)),
            None => {
                return Err(malformed(
                    &format!("{env_pointer}/{index}/name"),
                    "a string",
                    entry.get("name").unwrap_or(&Value::Null),
                ));
            }
        }
    }
    let last = |wanted: &str| {
        named
            .iter()
            .rev()
            .find(|(_, name, _)| *name == wanted)
            .copied()
    };

    let mut additions = Vec::new();
    for (name, value) in &effective.env {
        match last(name) {
            None => additions.push(json!({"name": name, "value": value})),
            Some((_, _, entry)) => {
                let current = non_null(entry.get("value")).and_then(Value::as_str);
                if current != Some(value.as_str()) {
                    warnings.push(format!(
                        "rdma-streams: container {:?} sets {name} itself; kept (the profile says \
                         {value:?})",
                        container.name
                    ));
                }
            }
        }
    }

    match last(names::LD_PRELOAD) {
        None => {
            if container.field("envFrom").is_some() {
                warnings.push(format!(
                    "rdma-streams: container {:?} uses envFrom; an LD_PRELOAD set there is \
                     overridden by the injected one",
                    container.name
                ));
            }
            additions.push(json!({"name": names::LD_PRELOAD, "value": library}));
        }
        Some((index, _, entry)) => {
            preload_existing(
                builder,
                container,
                &env_pointer,
                index,
                entry,
                &library,
                warnings,
            )?;
        }
    }

    if !additions.is_empty() {
        let list = builder.ensure(&container.pointer(), &["env"], Kind::List)?;
        for addition in additions {
            builder.append(&list, addition)?;
        }
    }
    Ok(())
}

fn preload_existing(
    builder: &mut PatchBuilder,
    container: &ContainerView<'_>,
    env_pointer: &json_patch::jsonptr::Pointer,
    index: usize,
    entry: &Value,
    library: &str,
    warnings: &mut Vec<String>,
) -> Result<(), Halt> {
    if non_null(entry.get("valueFrom")).is_some() {
        warnings.push(format!(
            "rdma-streams: container {:?} sets LD_PRELOAD with valueFrom; left alone, so the \
             shim ({library}) is not preloaded unless that value includes it",
            container.name
        ));
        return Ok(());
    }
    let value_pointer = env_pointer
        .with_trailing_token(index)
        .with_trailing_token("value");
    match non_null(entry.get("value")) {
        None => builder.add(value_pointer, json!(library)),
        Some(Value::String(current)) => {
            if preload_entries(current).any(|item| item == library) {
                return Ok(());
            }
            let new = if current.trim().is_empty() {
                library.to_owned()
            } else if current.ends_with([':', ' ', '\t']) {
                format!("{current}{library}")
            } else {
                format!("{current}:{library}")
            };
            builder.replace_tested(value_pointer, json!(current), json!(new))
        }
        Some(other) => Err(malformed(value_pointer.as_str(), "a string", other)),
    }
}

/// The entries of an `LD_PRELOAD` value, split as glibc splits them.
pub(crate) fn preload_entries(value: &str) -> impl Iterator<Item = &str> {
    value
        .split([':', ' ', '\t'])
        .filter(|item| !item.is_empty())
}

#[cfg(test)]
mod tests {
    use super::preload_entries;

    #[test]
    fn preload_splits_on_colons_and_spaces() {
        let items: Vec<&str> = preload_entries("a.so: b.so\t:c.so").collect();
        assert_eq!(items, ["a.so", "b.so", "c.so"]);
    }
}
