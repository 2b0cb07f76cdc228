//! Fuzzing of the config file (`--config`, hot-reloaded from a ConfigMap): [`parse`] and
//! [`load`] over arbitrary text and bytes, over valid files of both forms (native and
//! Mellanox's, in YAML and JSON) with bytes mutated and with any value replaced by a hostile
//! one (huge, negative and non-finite numbers, tags, aliases, unicode, long strings, deep
//! nesting).
//!
//! Whatever the input: no panic, an error or a config that passes [`Config::validate`], whose
//! native form (`discover -o yaml` writes it) parses back to the same config. Deep nesting,
//! alias bombs and a mebibyte of nested flow mappings are answered in bounded time.

use std::path::Path;
use std::time::Duration;

use proptest::prelude::*;
use rdma_streams_testkit::fuzz;
use serde_json::Value;

use super::*;
use crate::inventory::hca::{Bus, Hca, Health, LinkLayer, Port};

const LIMIT: Duration = Duration::from_secs(30);
const BOUND: Duration = Duration::from_secs(10);

/// Valid files: both forms, YAML and JSON, every field.
const SEEDS: &[&str] = &[
    r#"
# every field of the native form
resyncSeconds: 45
pools:
  - resourceName: rdma-streams.io/hca
    slotsPerHca: 64
    selectors:
      vendors: ["15b3", "0x15B3"]
      deviceIDs: ["1017"]
      drivers: [mlx5_core]
      ifNames: [ens1f0]
      linkLayers: [InfiniBand, ether]
      rdmaDevices: ["mlx5_*"]
      pciAddresses: ["0000:3b:00.*"]
      numaNodes: [0, -1]
    mounts:
      - hostPath: /opt/rdma-streams/shim/0.1.0
        containerPath: /opt/rdma-streams/shim
  - resourceName: example.com/roce
    slotsPerHca: 10000
"#,
    r#"{"pools": [{"resourceName": "example.com/rdma", "slotsPerHca": 1,
        "selectors": {"linkLayers": ["Ethernet"]}}], "resyncSeconds": 86400}"#,
    r#"{"periodicUpdateInterval": 300,
  "configList": [{"resourceName": "hca_shared_devices_a", "resourcePrefix": "rdma",
    "rdmaHcaMax": 1000, "selectors": {"vendors": ["15b3"], "linkTypes": ["ether"],
    "deviceIDs": ["1017"], "drivers": ["mlx5_core"], "ifNames": ["ib0"]},
    "devices": ["ib0", "ib1"]}]}"#,
    "periodicUpdateInterval: 0\nconfigList:\n  - resourceName: hca\n    rdmaHcaMax: 10\n",
];

/// An HCA of each kind for the selectors to be asked about.
fn hcas() -> Vec<Hca> {
    let port = |link_layer| Port {
        number: 1,
        state: "4: ACTIVE".into(),
        phys_state: "5: LinkUp".into(),
        link_layer,
        netdevs: vec!["ens1f0".into()],
    };
    let hca = |name: &str, bus| Hca {
        name: name.into(),
        bus,
        vendor: Some("15b3".into()),
        device_id: Some("1017".into()),
        driver: Some("mlx5_core".into()),
        numa_node: Some(0),
        netdevs: vec!["ens1f0".into()],
        ports: vec![port(LinkLayer::InfiniBand), port(LinkLayer::Ethernet)],
        char_devices: vec![],
        health: Health::healthy(),
    };
    vec![
        hca(
            "mlx5_0",
            Bus::Pci {
                address: "0000:3b:00.0".into(),
            },
        ),
        hca("rxe0", Bus::Virtual),
    ]
}

/// What every parse result must be: an error, or a valid config whose pools' selectors can be
/// asked about any HCA and whose native form parses back to it.
fn check(text: &str, parsed: Result<Config, ConfigError>) -> Result<(), TestCaseError> {
    let Ok(config) = parsed else {
        return Ok(());
    };
    prop_assert_eq!(config.validate(), Ok(()), "{:?}", text);
    for pool in &config.pools {
        for hca in hcas() {
            let _ = pool.selectors.matches(&hca);
        }
    }
    let native =
        rdma_streams_yaml::to_string(&config).map_err(|e| TestCaseError::fail(e.to_string()))?;
    match parse(&native, "rewritten") {
        Ok(again) => prop_assert_eq!(again, config, "{:?} rewritten as {:?}", text, native),
        Err(e) => prop_assert!(false, "{text:?} rewritten as {native:?}: {e}"),
    }
    Ok(())
}

#[test]
fn the_seeds_are_valid_configs() {
    rdma_streams_testkit::within(BOUND, || {
        for seed in SEEDS {
            let config = parse(seed, "seed").unwrap_or_else(|e| panic!("{seed:?}: {e}"));
            let native = rdma_streams_yaml::to_string(&config).unwrap();
            assert_eq!(parse(&native, "rewritten").unwrap(), config);
        }
    });
}

#[test]
fn arbitrary_text_is_a_config_or_an_error() {
    fuzz::run(
        "device-plugin config arbitrary text",
        2_000,
        LIMIT,
        fuzz::yaml_text,
        |text| check(&text, parse(&text, "fuzz")),
    );
}

#[test]
fn mutated_configs_are_configs_or_errors() {
    fuzz::run(
        "device-plugin config mutated files",
        1_500,
        LIMIT,
        || {
            fuzz::mutated_text(
                SEEDS.iter().map(|s| (*s).to_owned()).collect(),
                fuzz::TOKENS,
            )
        },
        |text| check(&text, parse(&text, "fuzz")),
    );
}

#[test]
fn configs_with_a_hostile_value_anywhere_are_configs_or_errors() {
    let seeds: Vec<Value> = SEEDS
        .iter()
        .map(|s| rdma_streams_yaml::from_str::<Value>(s).unwrap())
        .collect();
    fuzz::run(
        "device-plugin config hostile values",
        1_500,
        LIMIT,
        move || proptest::sample::select(seeds).prop_flat_map(fuzz::replaced_text),
        |text| check(&text, parse(&text, "fuzz")),
    );
}

#[test]
fn config_files_of_arbitrary_bytes_load_or_fail() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    fuzz::run(
        "device-plugin config files",
        300,
        LIMIT,
        || fuzz::mutated_files(SEEDS),
        move |bytes| {
            std::fs::write(&path, &bytes).unwrap();
            let loaded = load(Some(&path));
            if std::str::from_utf8(&bytes).is_err() {
                prop_assert!(
                    matches!(loaded, Err(ConfigError::Read { .. })),
                    "{loaded:?}"
                );
            }
            check(&String::from_utf8_lossy(&bytes), loaded)
        },
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
            "device-plugin config pools nested 10000 deep",
            format!("pools: {}", fuzz::nested_text(deep, false)),
        ),
        (
            "device-plugin config selectors nested 10000 deep",
            format!(
                "pools: [{{resourceName: a.io/b, selectors: {{vendors: {}}}}}]",
                fuzz::nested_text(deep, true)
            ),
        ),
        (
            "device-plugin config block sequences 10000 deep",
            format!("pools: {}x", "- ".repeat(deep)),
        ),
    ] {
        refused_in_time(what, text);
    }
}

#[test]
fn an_alias_bomb_is_refused_quickly() {
    // The first read is into an untyped value, which expands aliases: nine levels of ten
    // would be a billion strings.
    let mut text = String::from("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for level in 1..9 {
        let prev = level - 1;
        text.push_str(&format!(
            "a{level}: &a{level} [{}]\n",
            vec![format!("*a{prev}"); 10].join(", ")
        ));
    }
    text.push_str("pools: [{resourceName: a.io/b}]\n");
    let e = refused_in_time("device-plugin config alias bomb", text);
    assert!(e.contains("budget breached"), "{e}");
}

/// unsafe-libyaml (behind serde_yaml, the parser before serde-saphyr) scanned flow collections
/// nested n deep in O(n²) time and worse: 320 KiB of `{a: ` took 32.5 s in a release build,
/// and the config is re-read on every change of its ConfigMap (whose limit is 1 MiB). The
/// parser now refuses such nesting as it scans.
#[test]
fn regression_deeply_nested_flow_mappings_took_minutes_to_refuse() {
    let mib = 1 << 20;
    for (what, text) in [
        ("{a: ", "{a: ".repeat(mib / 4)),
        (
            "pools: [{selectors: ",
            format!("pools: [{}", "{selectors: ".repeat(mib / 12)),
        ),
        ("[ \"]\" ,", "[ \"]\" ,".repeat(mib / 7)),
    ] {
        let e = refused_in_time(&format!("device-plugin config of 1 MiB of {what:?}"), text);
        assert!(e.contains("recursion limit exceeded"), "{e}");
        assert!(e.contains("at line 1 column"), "{e}");
    }
}

#[test]
fn a_config_file_of_a_mebibyte_loads_in_bounded_time() {
    // Many pools, each with a mount and a selector of every kind (the ConfigMap limit).
    let pool = |n: usize| {
        format!(
            "  - resourceName: example.com/pool-{n}\n    selectors: {{vendors: ['15b3'], \
             rdmaDevices: ['mlx5_{n}*'], numaNodes: [{}]}}\n    mounts: [{{hostPath: /opt/{n}, \
             containerPath: /opt/shim}}]\n",
            n % 8
        )
    };
    let mut text = String::from("resyncSeconds: 30\npools:\n");
    let mut n = 0;
    while text.len() + pool(n).len() <= 1 << 20 {
        text.push_str(&pool(n));
        n += 1;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, &text).unwrap();
    let (loaded, _) = fuzz::timed(
        &format!("device-plugin config of {} bytes, {n} pools", text.len()),
        BOUND,
        move || {
            load(Some(Path::new(&path)))
                .map(|c| c.pools.len())
                .map_err(|e| e.to_string())
        },
    );
    assert_eq!(loaded, Ok(n));
}
