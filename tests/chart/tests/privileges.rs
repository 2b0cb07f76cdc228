//! docs/security.md against the chart: every RBAC rule, capability, host namespace,
//! host path, privileged container, root user, RDMA device request and mounted API token that
//! any value set renders has its row there, and every row there is rendered by some value set.

// An integration test: its helpers panic to fail the test, as its `#[test]` functions may.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rdma_streams_chart_tests::{
    RELEASE, Rendered, VALUE_SETS, all_containers, helm, ident, render, repo_root, value_set,
};
use rdma_streams_testkit::within;
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(300);
const DOC: &str = "docs/security.md";
/// The release's name prefix, as the doc writes it.
const RELEASE_PREFIX: &str = "<release>";

/// One RBAC rule: (component, role kind, apiGroups, resources, resourceNames, verbs), each list
/// sorted and joined with ", ".
type Rule = (String, String, String, String, String, String);
/// One pod privilege: (component, access), with the access as the doc's second column names it.
type Access = (String, String);

/// Every value set, plus the optional host network of the device plugin, which none of them
/// turns on.
fn renders() -> Option<Vec<(String, Rendered)>> {
    let helm = helm()?;
    let mut out: Vec<(String, Rendered)> = VALUE_SETS
        .iter()
        .map(|s| (s.name.to_string(), render(&helm, *s, &[])))
        .collect();
    out.push((
        "default + devicePlugin.hostNetwork".into(),
        render(
            &helm,
            value_set("default"),
            &["--set", "devicePlugin.hostNetwork=true"],
        ),
    ));
    Some(out)
}

fn component(doc: &Value) -> String {
    doc["metadata"]["labels"]["app.kubernetes.io/component"]
        .as_str()
        .unwrap_or_else(|| panic!("{} has no component label", ident(doc)))
        .to_string()
}

fn joined(v: &Value) -> String {
    let mut items: Vec<&str> = v
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    items.sort_unstable();
    items.join(", ")
}

fn rendered_rules(r: &Rendered) -> BTreeSet<Rule> {
    let mut roles = r.all("ClusterRole");
    roles.extend(r.all("Role"));
    let mut out = BTreeSet::new();
    for role in roles {
        for rule in role["rules"].as_array().unwrap() {
            out.insert((
                component(role),
                role["kind"].as_str().unwrap().to_string(),
                joined(&rule["apiGroups"]),
                joined(&rule["resources"]),
                joined(&rule["resourceNames"])
                    .replace(&format!("{RELEASE}-"), &format!("{RELEASE_PREFIX}-")),
                joined(&rule["verbs"]),
            ));
        }
    }
    out
}

/// (component, access) of every privilege a workload of `r` has, and for host paths whether the
/// mount is read-only.
fn rendered_access(r: &Rendered) -> BTreeMap<Access, Option<bool>> {
    let mut out = BTreeMap::new();
    for w in r.workloads() {
        let c = component(w);
        let spec = &w["spec"]["template"]["spec"];
        let mut add = |access: String, read_only: Option<bool>| {
            out.insert((c.clone(), access), read_only);
        };
        for ns in ["hostNetwork", "hostPID", "hostIPC"] {
            if spec[ns] == true {
                add(ns.to_string(), None);
            }
        }
        if spec["automountServiceAccountToken"] != false {
            add("API token".into(), None);
        }
        let host_paths: BTreeSet<&str> = spec["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v["hostPath"].is_object())
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        for container in all_containers(spec) {
            let sc = &container["securityContext"];
            if sc["privileged"] == true {
                add("privileged".into(), None);
            }
            if sc["runAsUser"] == 0
                || (sc["runAsUser"].is_null() && spec["securityContext"]["runAsUser"] == 0)
            {
                add("user root".into(), None);
            }
            for cap in sc["capabilities"]["add"].as_array().into_iter().flatten() {
                add(format!("capability `{}`", cap.as_str().unwrap()), None);
            }
            for m in container["volumeMounts"].as_array().into_iter().flatten() {
                let name = m["name"].as_str().unwrap();
                if host_paths.contains(name) {
                    add(format!("hostPath `{name}`"), Some(m["readOnly"] == true));
                }
            }
            let limits = container["resources"]["limits"].as_object();
            if limits.is_some_and(|l| l.keys().any(|k| k.contains('/'))) {
                add("RDMA devices".into(), None);
            }
        }
    }
    out
}

/// The rows of the markdown table under `## {heading}`, as trimmed cells.
fn table(text: &str, heading: &str) -> Vec<Vec<String>> {
    let start = text
        .find(&format!("\n## {heading}\n"))
        .unwrap_or_else(|| panic!("{DOC} has no section {heading:?}"));
    let section = &text[start + heading.len() + 5..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2) // header and separator
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// A cell of code spans (`` `a`, `b` ``) as the sorted list it names.
fn list_cell(cell: &str) -> String {
    let mut items: Vec<String> = cell
        .split(',')
        .map(|s| s.trim().trim_matches('`').to_string())
        .filter(|s| !s.is_empty())
        .map(|s| if s == "\"\"" { String::new() } else { s })
        .collect();
    items.sort_unstable();
    items.join(", ")
}

#[test]
fn privileges_table_matches_the_chart() {
    within(LIMIT, || {
        let Some(renders) = renders() else { return };
        let text = std::fs::read_to_string(repo_root().join(DOC)).expect(DOC);

        let mut documented_rules: BTreeSet<Rule> = BTreeSet::new();
        for row in table(&text, "RBAC rules") {
            assert_eq!(row.len(), 8, "{DOC}: RBAC row {row:?}");
            assert!(!row[7].is_empty(), "{DOC}: no reason for {row:?}");
            let rule = (
                row[0].clone(),
                row[1].clone(),
                list_cell(&row[2]),
                list_cell(&row[3]),
                list_cell(&row[4]),
                list_cell(&row[5]),
            );
            assert!(
                documented_rules.insert(rule),
                "{DOC}: duplicate row {row:?}"
            );
        }
        let mut documented_access: BTreeMap<Access, String> = BTreeMap::new();
        for row in table(&text, "Pod privileges") {
            assert_eq!(row.len(), 5, "{DOC}: privileges row {row:?}");
            assert!(!row[4].is_empty(), "{DOC}: no reason for {row:?}");
            let key = (row[0].clone(), row[1].clone());
            assert!(
                documented_access.insert(key, row[2].clone()).is_none(),
                "{DOC}: duplicate row {row:?}"
            );
        }
        assert!(documented_rules.len() >= 6 && documented_access.len() >= 20);

        let mut rendered_rule_set = BTreeSet::new();
        let mut rendered_access_set = BTreeSet::new();
        for (set, r) in &renders {
            for rule in rendered_rules(r) {
                assert!(
                    documented_rules.contains(&rule),
                    "{set}: the rule {rule:?} is not in {DOC}"
                );
                rendered_rule_set.insert(rule);
            }
            for (access, read_only) in rendered_access(r) {
                let detail = documented_access
                    .get(&access)
                    .unwrap_or_else(|| panic!("{set}: {access:?} is not in {DOC}"));
                if let Some(read_only) = read_only {
                    let says = if read_only { "read-only" } else { "read-write" };
                    assert!(
                        detail.contains(says),
                        "{set}: {access:?} is mounted {says}; {DOC} says {detail:?}"
                    );
                }
                rendered_access_set.insert(access);
            }
        }
        let stale_rules: Vec<_> = documented_rules.difference(&rendered_rule_set).collect();
        assert!(
            stale_rules.is_empty(),
            "{DOC} lists rules no value set renders: {stale_rules:?}"
        );
        let stale_access: Vec<_> = documented_access
            .keys()
            .filter(|a| !rendered_access_set.contains(*a))
            .collect();
        assert!(
            stale_access.is_empty(),
            "{DOC} lists privileges no value set renders: {stale_access:?}"
        );
    });
}
