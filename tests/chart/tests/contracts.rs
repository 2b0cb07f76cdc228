//! The chart against the components it deploys: every env variable it sets is a flag of the
//! binary and parses with the binary's own command line; every ConfigMap parses with the
//! component's own parser; every value in values.yaml is documented.

// An integration test: its helpers panic to fail the test, as its `#[test]` functions may.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use clap::{ArgAction, CommandFactory, Parser};
use rdma_streams_chart_tests::{Rendered, chart_dir, env_map, every_set, named, resolved_env};
use rdma_streams_testkit::within;
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(240);

/// The env variables the chart passes to `rdma-migration-gateway`: its contract (design.md
/// names the binary; the flags follow the `RDMA_DP_`/`RDMA_INJECTOR_` convention of one env
/// variable per flag), also parsed with its command line below.
const GATEWAY_ENV: [&str; 7] = [
    "RDMA_GW_NODE_NAME",
    "RDMA_GW_LISTEN",
    "RDMA_GW_ADVERTISE_ADDRESS",
    "RDMA_GW_ADMIN_LISTEN",
    "RDMA_GW_PROVIDER",
    "RDMA_GW_LOG_FORMAT",
    "RDMA_GW_LOG_LEVEL",
];

/// Also passed with `gateway.nodeHooks.enabled` (the `everything` value set): the KubeVirt node
/// hook socket.
const GATEWAY_NODE_HOOKS_ENV: &str = "RDMA_GW_NODE_HOOKS_SOCKET";

/// The peer keys file (`--peer-keys-file` / `RDMA_GW_PEER_KEYS_FILE`, a fixed contract): the
/// chart passes it always. The gateway's side is written on another branch; until its command
/// line has the flag, [`gateway_env_parses_with_its_command_line`] leaves this variable out of
/// the parse (and says so), and checks it like any other once the flag exists.
const GATEWAY_PEER_KEYS_ENV: &str = "RDMA_GW_PEER_KEYS_FILE";
const GATEWAY_PEER_KEYS_FLAG: &str = "peer-keys-file";
const GATEWAY_PEER_KEYS_FILE: &str = "/etc/rdma-streams/gateway/peer-keys/keys";

/// A line in the test's output (shown with `--nocapture` or on failure).
#[allow(clippy::print_stderr)]
fn note(message: &str) {
    eprintln!("{message}");
}

fn container<'a>(r: &'a Rendered, kind: &str, name: &str) -> Option<&'a Value> {
    r.find(kind, name)
        .map(|w| &w["spec"]["template"]["spec"]["containers"][0])
}

/// A container's env as its process sees it (downward-API references resolved).
fn pod_env(container: &serde_json::Value) -> BTreeMap<String, String> {
    resolved_env(container).unwrap_or_else(|e| panic!("{e}"))
}

/// Turns a container's env into command-line flags of `cmd` (and its `subcommand`), the way
/// clap reads the same variables. Fails on a variable that is no flag of the binary.
fn flags_from_env(
    cmd: &clap::Command,
    subcommand: Option<&str>,
    env: &BTreeMap<String, String>,
) -> Result<Vec<String>, String> {
    let mut args: Vec<&clap::Arg> = cmd.get_arguments().collect();
    if let Some(sub) = subcommand {
        let sub = cmd
            .find_subcommand(sub)
            .ok_or_else(|| format!("no subcommand {sub}"))?;
        args.extend(sub.get_arguments());
    }
    let mut argv = Vec::new();
    for (name, value) in env {
        let arg = args
            .iter()
            .find(|a| a.get_env().is_some_and(|e| e == name.as_str()))
            .ok_or_else(|| format!("{name} is not an env variable of {}", cmd.get_name()))?;
        let long = format!("--{}", arg.get_long().expect("long flag"));
        match arg.get_action() {
            ArgAction::SetTrue => match value.as_str() {
                "true" => argv.push(long),
                "false" => {}
                other => return Err(format!("{name}={other}: the flag takes true or false")),
            },
            _ => {
                argv.push(long);
                argv.push(value.to_string());
            }
        }
    }
    Ok(argv)
}

#[test]
fn device_plugin_env_parses_with_its_command_line() {
    within(LIMIT, || {
        let Some(sets) = every_set() else { return };
        for (set, r) in &sets {
            let c = container(r, "DaemonSet", &named("device-plugin")).expect("device plugin");
            let cmd = rdma_device_plugin::cli::Args::command();
            let flags =
                flags_from_env(&cmd, None, &pod_env(c)).unwrap_or_else(|e| panic!("{set}: {e}"));
            let mut argv = vec!["rdma-device-plugin".to_string()];
            argv.extend(flags);
            for a in c["args"].as_array().unwrap() {
                argv.push(a.as_str().unwrap().to_string());
            }
            let args = rdma_device_plugin::cli::Args::try_parse_from(&argv)
                .unwrap_or_else(|e| panic!("{set}: {argv:?}: {e}"));
            assert!(
                matches!(args.command, Some(rdma_device_plugin::cli::Command::Serve)),
                "{set}"
            );
            assert!(
                args.admin.listen.is_some(),
                "{set}: probes need the admin endpoint"
            );
        }
    });
}

#[test]
fn injector_env_parses_with_its_command_line() {
    within(LIMIT, || {
        let Some(sets) = every_set() else { return };
        for (set, r) in &sets {
            let c = container(r, "Deployment", &named("injector")).expect("injector");
            let cmd = rdma_stream_injector::cli::Args::command();
            let flags = flags_from_env(&cmd, Some("serve"), &pod_env(c))
                .unwrap_or_else(|e| panic!("{set}: {e}"));
            let mut argv = vec!["rdma-stream-injector".to_string()];
            for a in c["args"].as_array().unwrap() {
                argv.push(a.as_str().unwrap().to_string());
            }
            argv.extend(flags);
            let args = rdma_stream_injector::cli::Args::try_parse_from(&argv)
                .unwrap_or_else(|e| panic!("{set}: {argv:?}: {e}"));
            let rdma_stream_injector::cli::Command::Serve(serve) = args.command else {
                panic!("{set}: not serve");
            };
            assert!(
                serve.admin.listen.is_some(),
                "{set}: probes need the admin endpoint"
            );
            assert!(serve.config.is_some(), "{set}");
            let timeout_ms = r.get("MutatingWebhookConfiguration", &named("injector"))["webhooks"]
                [0]["timeoutSeconds"]
                .as_u64()
                .unwrap()
                * 1000;
            assert!(serve.request_timeout_ms < timeout_ms, "{set}");
        }
    });
}

#[test]
fn gateway_env_is_the_documented_contract() {
    within(LIMIT, || {
        let Some(sets) = every_set() else { return };
        for (set, r) in &sets {
            let Some(c) = container(r, "DaemonSet", &named("gateway")) else {
                continue;
            };
            let names: Vec<String> = env_map(c).into_keys().collect();
            let mut expected: Vec<String> = GATEWAY_ENV.iter().map(|s| s.to_string()).collect();
            expected.push(GATEWAY_PEER_KEYS_ENV.into());
            if *set == "everything" {
                expected.push(GATEWAY_NODE_HOOKS_ENV.into());
            }
            expected.sort();
            assert_eq!(names, expected, "{set}");
        }
    });
}

#[test]
fn gateway_env_parses_with_its_command_line() {
    within(LIMIT, || {
        let Some(sets) = every_set() else { return };
        for (set, r) in &sets {
            let Some(c) = container(r, "DaemonSet", &named("gateway")) else {
                continue;
            };
            let cmd = rdma_migration_gateway::cli::Args::command();
            let mut env = pod_env(c);
            assert_eq!(
                env.get(GATEWAY_PEER_KEYS_ENV).map(String::as_str),
                Some(GATEWAY_PEER_KEYS_FILE),
                "{set}"
            );
            match cmd
                .get_arguments()
                .find(|a| a.get_env().is_some_and(|e| e == GATEWAY_PEER_KEYS_ENV))
            {
                Some(arg) => assert_eq!(arg.get_long(), Some(GATEWAY_PEER_KEYS_FLAG), "{set}"),
                None => {
                    note(&format!(
                        "{set}: the gateway has no --{GATEWAY_PEER_KEYS_FLAG} yet: \
                         {GATEWAY_PEER_KEYS_ENV} is checked against the contract only"
                    ));
                    env.remove(GATEWAY_PEER_KEYS_ENV);
                }
            }
            let flags = flags_from_env(&cmd, None, &env).unwrap_or_else(|e| panic!("{set}: {e}"));
            let mut argv = vec!["rdma-migration-gateway".to_string()];
            argv.extend(flags);
            let args = rdma_migration_gateway::cli::Args::try_parse_from(&argv)
                .unwrap_or_else(|e| panic!("{set}: {argv:?}: {e}"));
            assert_eq!(
                args.capture_process, "virt-handler",
                "{set}: capture finds virt-handler by default"
            );
            let hooks = (*set == "everything").then(|| {
                std::path::PathBuf::from(
                    "/var/run/kubevirt/plugins/rdma-migration-gateway/node.sock",
                )
            });
            assert_eq!(args.node_hooks_socket, hooks, "{set}");
        }
    });
}

#[test]
fn configmaps_parse_with_the_components_parsers() {
    within(LIMIT, || {
        let Some(sets) = every_set() else { return };
        for (set, r) in &sets {
            let pools = rdma_device_plugin::config::parse(
                r.configmap_data(&named("device-plugin"), "config.yaml"),
                "config.yaml",
            )
            .unwrap_or_else(|e| panic!("{set}: device plugin config: {e}"));
            let profiles = rdma_stream_injector::profile::parse(
                r.configmap_data(&named("injector"), "profiles.yaml"),
                "profiles.yaml",
            )
            .unwrap_or_else(|e| panic!("{set}: injector profiles: {e}"));
            let default = profiles
                .profile(&profiles.default_profile)
                .unwrap_or_else(|| panic!("{set}: no default profile"));
            // Injected pods request a resource the device plugin advertises.
            assert!(
                pools
                    .pools
                    .iter()
                    .any(|p| p.resource_name == default.resource.name),
                "{set}: {} is not a device plugin pool",
                default.resource.name
            );
            if let Some(cm) = r.find("ConfigMap", &named("shim-policy")) {
                let text = cm["data"]["policy.yaml"].as_str().unwrap();
                streamshim_core::policy::Policy::parse(text)
                    .unwrap_or_else(|e| panic!("{set}: shim policy: {e}"));
            }
        }
    });
}

#[test]
fn chart_app_version_is_the_workspace_version() {
    let chart: serde_json::Value = rdma_streams_yaml::from_str(
        &std::fs::read_to_string(chart_dir().join("Chart.yaml")).expect("Chart.yaml"),
    )
    .expect("Chart.yaml parses");
    assert_eq!(
        chart["appVersion"].as_str(),
        Some(env!("CARGO_PKG_VERSION")),
        "images default to the chart's appVersion; keep it equal to the workspace version"
    );
}

/// Every key of values.yaml has a `# --` comment block right above it (helm-docs style), and
/// is in values.schema.json. Keys inside list items, block strings and free-form maps (such as
/// `resources` or `nodeSelector` defaults) are part of a value, not values themselves.
#[test]
fn every_value_is_documented_and_in_the_schema() {
    let text = std::fs::read_to_string(chart_dir().join("values.yaml")).expect("values.yaml");
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("values.schema.json")).expect("schema"),
    )
    .expect("schema parses");
    let mut undocumented = Vec::new();
    let mut unknown = Vec::new();
    let mut checked = 0;
    // (indent, key) of the mapping keys enclosing the current line.
    let mut path: Vec<(usize, String)> = Vec::new();
    // Lines indented deeper than this belong to a list item or a block string: skipped.
    let mut skip_deeper: Option<usize> = None;
    // Whether the comment block right above the current line has a `# --` line.
    let mut documented = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.is_empty() {
            documented = false;
            continue;
        }
        if trimmed.starts_with('#') {
            documented |= trimmed.starts_with("# --");
            continue;
        }
        let doc_above = std::mem::take(&mut documented);
        if let Some(limit) = skip_deeper {
            if indent > limit || (indent == limit && trimmed.starts_with("- ")) {
                continue;
            }
            skip_deeper = None;
        }
        if trimmed.starts_with("- ") {
            skip_deeper = Some(indent);
            continue;
        }
        let (key, rest) = trimmed
            .split_once(':')
            .unwrap_or_else(|| panic!("values.yaml: cannot read line {line:?}"));
        while path.last().is_some_and(|(i, _)| *i >= indent) {
            path.pop();
        }
        let mut parent = &schema;
        for (_, k) in &path {
            parent = &parent["properties"][k.as_str()];
        }
        path.push((indent, key.to_string()));
        let rest = rest.trim();
        if rest.starts_with('|') || rest.starts_with('>') {
            skip_deeper = Some(indent);
        }
        if parent.get("properties").is_none() {
            continue; // inside a free-form map's default
        }
        checked += 1;
        let dotted: Vec<&str> = path.iter().map(|(_, k)| k.as_str()).collect();
        let node = &parent["properties"][key];
        // Sections (objects with known keys) need no comment of their own; values do.
        if !doc_above && node.get("properties").is_none() {
            undocumented.push(dotted.join("."));
        }
        if node.is_null() {
            unknown.push(dotted.join("."));
        }
    }
    assert!(checked > 100, "only {checked} values checked");
    assert!(
        undocumented.is_empty(),
        "values without a `# --` comment: {undocumented:?}"
    );
    assert!(
        unknown.is_empty(),
        "values missing from values.schema.json: {unknown:?}"
    );
}
