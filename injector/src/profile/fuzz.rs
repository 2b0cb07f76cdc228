//! Fuzzing of the profile config (`--config`, hot-reloaded): [`parse`] over arbitrary text,
//! over valid configs with bytes mutated and with any value replaced by a hostile one (huge,
//! negative and non-finite numbers, tags, aliases, unicode, long strings, deep nesting).
//!
//! Whatever the input: no panic, an error, or a config that validates, that the pure core plans
//! with without an internal error for every profile, and whose YAML ([`Config::to_yaml`])
//! parses back to the same config. Deep nesting, alias bombs and a mebibyte of nested flow
//! mappings are answered in bounded time.

use std::time::Duration;

use proptest::prelude::*;
use rdma_streams_testkit::fuzz;
use serde_json::{Value, json};

use super::*;
use crate::core::{NamespaceFacts, PlanInput, plan};

const LIMIT: Duration = Duration::from_secs(30);
const BOUND: Duration = Duration::from_secs(10);

/// The test profiles (every delivery, network, env and Pod Security variant), the built-in
/// default, and a JSON form with every optional field.
fn seeds() -> Vec<String> {
    vec![
        include_str!("../../tests/data/config/profiles.yaml").to_owned(),
        Config::builtin_default().to_yaml().unwrap(),
        json!({
            "defaultProfile": "p",
            "allowedHostPathRoots": ["/opt/rdma-streams"],
            "profiles": {"p": {
                "resource": {"name": "example.com/rdma", "count": 4_294_967_295u32},
                "shim": {"delivery": "host-path", "hostPath": "/opt/rdma-streams/x",
                         "image": "r.example/shim@sha256:0123", "imagePullPolicy": "Always",
                         "mountPath": "/opt/s", "library": "./lib/x.so",
                         "initCommand": ["/bin/sh", "-c", "cp -R /bundle/. /opt/s"]},
                "env": {"A": 1, "B": true, "C": 1.5, "D": "x", "E": -1, "F": 18_446_744_073_709_551_615u64},
                "ipcLock": false,
                "network": {"name": "rdma-net", "namespace": "infra", "interface": "net1"},
                "podSecurity": "degrade"
            }}
        })
        .to_string(),
    ]
}

/// An opted-in pod asking for `profile`.
fn pod(profile: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": "app-",
            "labels": {"rdma-streams.io/inject": "true"},
            "annotations": {"rdma-streams.io/profile": profile}
        },
        "spec": {"containers": [{"name": "app", "image": "x"}]}
    })
}

/// What every parse result must be: an error, or a valid config that survives its own YAML and
/// that the core plans with, in a plain and in a restricted namespace, without failing.
fn check(text: &str, parsed: Result<Config, ProfileError>) -> Result<(), TestCaseError> {
    let Ok(config) = parsed else {
        return Ok(());
    };
    prop_assert!(config.validate().is_ok(), "{:?}", text);
    let yaml = config
        .to_yaml()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    match parse(&yaml, "rewritten") {
        Ok(again) => prop_assert_eq!(&again, &config, "{:?} rewritten as {:?}", text, yaml),
        Err(e) => prop_assert!(false, "{text:?} rewritten as {yaml:?}: {e}"),
    }
    let namespaces = [
        NamespaceFacts {
            name: "team-a".into(),
            labels: Default::default(),
        },
        NamespaceFacts {
            name: "team-b".into(),
            labels: [(
                "pod-security.kubernetes.io/enforce".to_owned(),
                "restricted".to_owned(),
            )]
            .into(),
        },
    ];
    for name in config.profile_names() {
        for namespace in &namespaces {
            let pod = pod(name);
            let planned = plan(&PlanInput {
                pod: &pod,
                namespace,
                config: &config,
            });
            prop_assert!(
                planned.is_ok(),
                "profile {:?} of {:?}: {:?}",
                name,
                text,
                planned
            );
        }
    }
    Ok(())
}

#[test]
fn the_seeds_are_valid_configs() {
    rdma_streams_testkit::within(BOUND, || {
        for seed in seeds() {
            let config = parse(&seed, "seed").unwrap_or_else(|e| panic!("{seed:?}: {e}"));
            assert_eq!(parse(&config.to_yaml().unwrap(), "again").unwrap(), config);
        }
    });
}

#[test]
fn arbitrary_text_is_a_config_or_an_error() {
    fuzz::run(
        "injector profiles arbitrary text",
        2_000,
        LIMIT,
        fuzz::yaml_text,
        |text| check(&text, parse(&text, "fuzz")),
    );
}

#[test]
fn mutated_configs_are_configs_or_errors() {
    fuzz::run(
        "injector profiles mutated files",
        1_000,
        LIMIT,
        || fuzz::mutated_text(seeds(), fuzz::TOKENS),
        |text| check(&text, parse(&text, "fuzz")),
    );
}

#[test]
fn configs_with_a_hostile_value_anywhere_are_configs_or_errors() {
    let docs: Vec<Value> = seeds()
        .iter()
        .map(|s| rdma_streams_yaml::from_str::<Value>(s).unwrap())
        .collect();
    fuzz::run(
        "injector profiles hostile values",
        1_000,
        LIMIT,
        move || proptest::sample::select(docs).prop_flat_map(fuzz::replaced_text),
        |text| check(&text, parse(&text, "fuzz")),
    );
}

// === Inputs that must be refused in bounded time ===

fn refused_in_time(what: &str, text: String) -> String {
    let (parsed, _) = fuzz::timed(what, BOUND, move || {
        parse(&text, "fuzz").map(|_| ()).map_err(|e| e.to_string())
    });
    parsed.expect_err("refused")
}

#[test]
fn nesting_ten_thousand_deep_is_refused_quickly() {
    let deep = 10_000;
    for (what, text) in [
        (
            "injector profiles env nested 10000 deep",
            format!(
                "profiles: {{p: {{shim: {{delivery: init-copy, image: x}}, env: {{A: {}}}}}}}",
                fuzz::nested_text(deep, false)
            ),
        ),
        (
            "injector profiles nested mappings 10000 deep",
            format!("profiles: {}", fuzz::nested_text(deep, true)),
        ),
        (
            "injector profiles block sequences 10000 deep",
            format!("allowedHostPathRoots: {}x", "- ".repeat(deep)),
        ),
    ] {
        refused_in_time(what, text);
    }
}

#[test]
fn an_alias_bomb_is_refused_quickly() {
    // `env` values are read through serde's buffered untagged enum, which expands aliases.
    let mut text = String::from(
        "profiles:\n  p:\n    shim: {delivery: init-copy, image: x}\n    env:\n      A0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n",
    );
    for level in 1..9 {
        let prev = level - 1;
        text.push_str(&format!(
            "      A{level}: &a{level} [{}]\n",
            vec![format!("*a{prev}"); 10].join(", ")
        ));
    }
    refused_in_time("injector profiles alias bomb", text);
}

/// unsafe-libyaml (behind serde_yaml, the parser before serde-saphyr) scanned flow collections
/// nested n deep in O(n²) time and worse: 320 KiB of `{a: ` took 32.5 s in a release build,
/// and the profiles are re-read on every change of their ConfigMap. The parser now refuses
/// such nesting as it scans.
#[test]
fn regression_deeply_nested_flow_mappings_took_minutes_to_refuse() {
    let mib = 1 << 20;
    for (what, text) in [
        ("{a: ", "{a: ".repeat(mib / 4)),
        (
            "profiles: {p: {env: ",
            format!("profiles: {{p: {}", "{env: ".repeat(mib / 6)),
        ),
        ("[ \"]\" ,", "[ \"]\" ,".repeat(mib / 7)),
    ] {
        let e = refused_in_time(&format!("injector profiles of 1 MiB of {what:?}"), text);
        assert!(
            e.contains("recursion limit exceeded") || e.contains("budget breached: Depth"),
            "{e}"
        );
        assert!(e.starts_with("fuzz:1:"), "{e}");
    }
}
