//! What `docs/kubevirt.md` says of the gateway's interface, checked against the code: the flags
//! table is the command line, the fallback reasons table is `Fallback::ALL`, and every
//! `rdma_gw_` metric the docs name is one the gateway registers.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::cli::Args;
use crate::metrics::Metrics;
use crate::streams::Fallback;
use clap::CommandFactory;
use prometheus_client::registry::Registry;
use rdma_streams_common::reload_metrics::ReloadStatsCollector;
use rdma_streams_testkit::docs;

#[test]
fn the_flags_table_is_the_command_line() {
    let doc = docs::read("kubevirt.md");
    let rows = docs::table(&doc, &["flag", "env", "default", "meaning"]);
    assert_eq!(
        docs::flags_in_table(&rows),
        docs::flags_of(&Args::command()),
        "docs/kubevirt.md's flags table and `rdma-migration-gateway --help` differ"
    );
}

#[test]
fn the_fallback_reasons_table_is_every_reason() {
    let doc = docs::read("kubevirt.md");
    let rows = docs::table(
        &doc,
        &["reason (`rdma_gw_fallbacks_total{reason}`)", "when"],
    );
    let documented: BTreeSet<&str> = rows
        .iter()
        .map(|r| docs::first_code(&r[0]).expect("a reason"))
        .collect();
    let reasons: BTreeSet<&str> = Fallback::ALL.iter().map(|f| f.as_str()).collect();
    assert_eq!(documented, reasons);
}

#[test]
fn every_metric_the_docs_name_is_registered() {
    // The registry `cli::serve` builds: the gateway's metrics and its peer keys' reloads.
    let mut registry = Registry::default();
    let _metrics = Metrics::register(&mut registry);
    registry.register_collector(Box::new(ReloadStatsCollector::new(
        "rdma_gw_peer_keys",
        Arc::default(),
    )));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    docs::check_metrics_mentioned("rdma_gw_", &docs::metric_families(&text), &[&src]);
}
