//! The tables of `docs/device-plugin.md` that repeat the code, checked against it: the flags
//! table against the command line (the metrics table is checked against a running plugin's
//! `/metrics` in `process.rs`).

use clap::CommandFactory;
use rdma_device_plugin::cli::Args;
use rdma_streams_testkit::docs;

#[test]
fn the_flags_table_is_the_command_line() {
    let doc = docs::read("device-plugin.md");
    let rows = docs::table(&doc, &["flag", "env var", "default", "meaning"]);
    let cmd = Args::command();
    let mut flags = docs::flags_of(&cmd);
    for sub in cmd.get_subcommands() {
        flags.extend(docs::flags_of(sub));
    }
    flags.sort();
    assert_eq!(
        docs::flags_in_table(&rows),
        flags,
        "docs/device-plugin.md's flags table and `rdma-device-plugin --help` differ"
    );
}
