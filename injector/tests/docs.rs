//! The flags table of `docs/injector.md` checked against the command line of
//! `rdma-stream-injector serve` (the metrics table is checked against a running injector's
//! `/metrics` in `serve.rs`).

use clap::CommandFactory;
use rdma_stream_injector::cli::Args;
use rdma_streams_testkit::docs;

#[test]
fn the_flags_table_is_the_serve_command_line() {
    let cmd = Args::command();
    let serve = cmd
        .get_subcommands()
        .find(|c| c.get_name() == "serve")
        .expect("a serve subcommand");
    let mut flags = docs::flags_of(&cmd);
    flags.extend(docs::flags_of(serve));
    flags.sort();
    let doc = docs::read("injector.md");
    let rows = docs::table(&doc, &["flag", "env", "default", "meaning"]);
    assert_eq!(
        docs::flags_in_table(&rows),
        flags,
        "docs/injector.md's flags table and `rdma-stream-injector serve --help` differ"
    );
}
