//! Another project's socket tests under the shim: CPython's own test suite (Debian's
//! `libpython3.11-testsuite`, run by Debian's `python3`), nobody on this project wrote it. The
//! chosen modules and classes are the ones whose clients and servers talk TCP; they run twice
//! in the loop guest, without and with the shim, with `localhost` resolving to the rxe address
//! (a bind mount over `/etc/hosts` in a mount namespace of their own), so that their
//! connections upgrade. Every test must end as it did without the shim (passed, skipped or
//! failed alike); the run reports the counts: tests, upgraded connections, differences.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, ensure};
use rdma_streams_softroce::unittest_log::{self, End};
use rdma_streams_softroce::{Ctx, Scenario, Topology};

use super::support::{counts, file, shimmed};

pub const SCENARIOS: &[Scenario] = &[Scenario {
    name: "shim_cpython_socket_tests_end_as_without_the_shim",
    topology: Topology::Loop,
    timeout: Duration::from_secs(1500),
    run,
}];

/// Tests that end otherwise under the shim, each with why (docs/shim-conformance.md lists
/// them too). The run fails when one of them ends as it does without the shim, so the list
/// stays true as they are fixed.
const KNOWN: &[(&str, &str)] = &[];

/// Debian's interpreter, whose test package `libpython3.11-testsuite` installs (`make deps`).
const PYTHON: &str = "/usr/bin/python3";

/// The test modules, each with the classes run (none: the whole module). `test_socket`'s
/// other classes are about UDP, AF_UNIX, CAN, RDS, TIPC, VSOCK and the like.
const SUITES: &[(&str, &[&str])] = &[
    (
        "test_socket",
        &[
            "BasicTCPTest",
            "BasicTCPTest2",
            "NonBlockingTCPTests",
            "FileObjectClassTestCase",
            "UnbufferedFileObjectClassTestCase",
            "LineBufferedFileObjectClassTestCase",
            "SmallBufferedFileObjectClassTestCase",
            "UnicodeReadFileObjectClassTestCase",
            "UnicodeWriteFileObjectClassTestCase",
            "UnicodeReadWriteFileObjectClassTestCase",
            "NetworkConnectionNoServer",
            "NetworkConnectionAttributesTest",
            "NetworkConnectionBehaviourTest",
            "TCPCloserTest",
            "TCPTimeoutTest",
            "SendmsgTCPTest",
            "RecvmsgTCPTest",
            "RecvmsgIntoTCPTest",
            "SendfileUsingSendTest",
            "SendfileUsingSendfileTest",
            "ContextManagersTest",
            "CreateServerFunctionalTest",
        ],
    ),
    // An FTP client and server: ABOR goes as urgent data.
    ("test_ftplib", &[]),
    // A peer that sends bytes and resets before a TLS handshake (CVE-2023-40217's defence).
    ("test_ssl", &["TestPreHandshakeClose"]),
    // An event loop's non-blocking sockets and streams.
    ("test_asyncio.test_sock_lowlevel", &[]),
    ("test_asyncio.test_streams", &[]),
    // Forking and threading servers.
    ("test_socketserver", &[]),
    // Mail clients and servers, plain and with STARTTLS.
    ("test_smtplib", &[]),
    ("test_poplib", &[]),
];

/// The `python3 -m test` command line of the suites. `--timeout`: a test module that hangs
/// prints every thread's stack and ends the run (the tests it did not reach are run again).
fn command() -> String {
    let mut cmd = format!("{PYTHON} -m test -v -u network --timeout {MODULE_TIMEOUT_S}");
    for (module, _) in SUITES {
        cmd.push(' ');
        cmd.push_str(module);
    }
    cmd
}

/// The longest a test module may run (all of them take about 80 s together, with or without
/// the shim): a hang costs no more than this.
const MODULE_TIMEOUT_S: u32 = 180;

/// The selection of the first runs: the classes, and the modules run whole.
fn selection() -> String {
    let mut sel = String::new();
    let classes: Vec<&str> = SUITES.iter().flat_map(|(_, c)| c.iter().copied()).collect();
    // `-m` selects by any one part of a test's id: a class, or a module run whole (its last
    // part: `test.test_asyncio.test_sock_lowlevel.X.y` has `test_sock_lowlevel`).
    for (module, classes) in SUITES {
        if classes.is_empty() {
            let last = module.rsplit('.').next().unwrap_or(module);
            sel.push_str(&format!(" -m {last}"));
        }
    }
    for class in classes {
        sel.push_str(&format!(" -m {class}"));
    }
    sel
}

/// One run of the suites: `env` before the interpreter (empty: without the shim), `select`
/// after the modules; its output (also in `<tmp>/<tag>.out`) and how each test ended.
fn run_suites(
    ctx: &Ctx,
    hosts: &std::path::Path,
    tag: &str,
    env: &str,
    select: &str,
) -> anyhow::Result<(String, BTreeMap<String, End>)> {
    let out = ctx.tmp.join(format!("{tag}.out"));
    // Its own mount namespace: the other scenarios of this guest keep their /etc/hosts.
    ctx.bash(&format!(
        "cd {tmp} && timeout 900 unshare -m sh -c 'mount --bind {hosts} /etc/hosts && \
         exec {env} {cmd}{select}' > {out} 2>&1; echo exit $?; tail -n 5 {out}",
        tmp = ctx.tmp.display(),
        hosts = hosts.display(),
        out = out.display(),
        cmd = command(),
    ))?;
    let text = std::fs::read_to_string(&out)?;
    let run = unittest_log::read(&text);
    if let Some(id) = &run.unfinished {
        // The stack dump after it says where it waited (faulthandler's `Timeout (0:03:00)!`,
        // on the line the test's ` ... ` left open).
        let dump: String = text
            .match_indices("Timeout (")
            .find(|(at, m)| text[at + m.len()..].starts_with(|c: char| c.is_ascii_digit()))
            .map(|(at, _)| &text[at..])
            .unwrap_or_default()
            .lines()
            .take(40)
            .map(|l| format!("\n  {l}"))
            .collect();
        ctx.log(format_args!("{tag}: the run ended in {id}{dump}"));
    }
    Ok((text, run.ends))
}

/// One test id per line, for `--matchfile`.
fn lines(ids: &[&String]) -> String {
    ids.iter().map(|id| format!("{id}\n")).collect()
}

/// Whether test `id` ended as it should under the shim: as without it, or otherwise for a
/// listed one.
fn as_expected(id: &str, plain: &BTreeMap<String, End>, shim: &BTreeMap<String, End>) -> bool {
    let same = shim.get(id).is_some() && shim.get(id) == plain.get(id);
    same != KNOWN.iter().any(|(k, _)| *k == id)
}

fn run(ctx: &Ctx) -> anyhow::Result<()> {
    ensure!(
        std::path::Path::new("/usr/lib/python3.11/test/test_socket.py").exists(),
        "CPython's test suite is missing: apt-get install libpython3.11-testsuite (make deps)"
    );
    let hosts = file(
        ctx,
        "hosts",
        // IPv4 only: with `::1` too, clients try it first (a smaller scope) and some tests'
        // clients fail where their servers wait in `accept` without a timeout.
        &format!("{} localhost\n", ctx.addr_a),
    )?;
    let select = selection();
    let (_, mut plain) = run_suites(ctx, &hosts, "plain", "", &select)?;
    let (shim_out, shim) = run_suites(ctx, &hosts, "py", &shimmed(ctx, "py", "")?, &select)?;
    // A hang without the shim (CPython's own: a client that fails, say on a source port
    // `find_unused_port` found free but another address's TIME_WAIT holds for `0.0.0.0`, while
    // its server waits in `accept` without a timeout) ends that run early: the tests it did not
    // reach run again without the shim, so that they are judged against a run of their own.
    let missed: Vec<&String> = shim.keys().filter(|id| !plain.contains_key(*id)).collect();
    let missed_n = missed.len();
    if !missed.is_empty() {
        ctx.log(format_args!(
            "{} tests ended only with the shim; running them again without it",
            missed.len()
        ));
        let list = file(ctx, "missed", &lines(&missed))?;
        let again = format!(" --matchfile {}", list.display());
        let (_, more) = run_suites(ctx, &hosts, "plain-missed", "", &again)?;
        for (id, end) in more {
            plain.entry(id).or_insert(end);
        }
    }
    ensure!(
        plain.len() > 100,
        "only {} tests ran without the shim",
        plain.len()
    );
    // A test that ended otherwise runs again, with and without the shim: timing-dependent
    // tests (ports found free, then bound) and the tests a hang kept from running. It differs
    // only if it differs again; the report counts those that did not.
    let unexpected: Vec<&String> = plain
        .keys()
        .filter(|id| !as_expected(id, &plain, &shim))
        .collect();
    // The ends each test is judged by: its second run's, if it ran again.
    let (mut plain_end, mut shim_end, mut out) = (plain.clone(), shim.clone(), shim_out);
    let mut flaky = Vec::new();
    if !unexpected.is_empty() {
        let list = file(ctx, "again", &lines(&unexpected))?;
        let again = format!(" --matchfile {}", list.display());
        let (_, plain2) = run_suites(ctx, &hosts, "plain-again", "", &again)?;
        let (out2, shim2) =
            run_suites(ctx, &hosts, "py-again", &shimmed(ctx, "again", "")?, &again)?;
        for id in &unexpected {
            if as_expected(id, &plain2, &shim2) {
                flaky.push((*id).clone());
                ctx.log(format_args!(
                    "{id}: {:?} under the shim, {:?} without it; as expected when run again",
                    shim.get(*id),
                    plain.get(*id)
                ));
            }
            if let Some(&end) = plain2.get(*id) {
                plain_end.insert((*id).clone(), end);
            }
            match shim2.get(*id) {
                Some(&end) => shim_end.insert((*id).clone(), end),
                None => shim_end.remove(*id),
            };
        }
        // Only tests that ran again can differ now: their reports are in this output.
        out = out2;
    }
    let (mut differences, mut known) = (Vec::new(), 0);
    for (id, &want) in &plain_end {
        let got = shim_end.get(id).copied();
        let listed = KNOWN.iter().find(|(k, _)| k == id);
        match (got == Some(want), listed) {
            (true, None) => {}
            (false, Some((_, why))) => {
                known += 1;
                ctx.log(format_args!(
                    "{id}: {got:?} under the shim, as listed: {why}"
                ));
            }
            (true, Some(_)) => differences.push(format!(
                "{id}: ends as without the shim now; take it off the known differences"
            )),
            (false, None) => {
                ctx.log(format_args!("{id} under the shim:\n{}", failure(&out, id)));
                differences.push(format!("{id}: {want:?} without the shim, {got:?} with it"))
            }
        }
    }
    for id in shim.keys().filter(|id| !plain.contains_key(*id)) {
        differences.push(format!("{id}: ran only with the shim"));
    }
    let failing: Vec<&String> = plain
        .iter()
        .filter_map(|(id, e)| (*e == End::Failed).then_some(id))
        .collect();
    if !failing.is_empty() {
        ctx.log(format_args!("failing without the shim too: {failing:?}"));
    }
    let tally = |m: &BTreeMap<String, End>, e: End| m.values().filter(|&&v| v == e).count();
    // The shim's counts of both runs (a run a hang ended writes no stats file).
    let both = |role: &str| -> anyhow::Result<BTreeMap<String, u64>> {
        let mut all = BTreeMap::new();
        for tag in ["py", "again"] {
            for (k, n) in counts(ctx, tag, role).unwrap_or_default() {
                *all.entry(k).or_insert(0) += n;
            }
        }
        ensure!(!all.is_empty(), "no stats file py-*.json or again-*.json");
        Ok(all)
    };
    let client = both("client")?;
    let server = both("server")?;
    ctx.report(format_args!(
        "CPython tests: {} ({} passed, {} skipped, {} failed without the shim); with it: {} \
         passed, {} skipped, {} failed; {} differences ({known} known); {} ended otherwise \
         once and as expected when run again {flaky:?}; {missed_n} reached only by a second \
         run without the shim; connections: client {client:?}, server {server:?}",
        plain.len(),
        tally(&plain, End::Passed),
        tally(&plain, End::Skipped),
        tally(&plain, End::Failed),
        tally(&shim, End::Passed),
        tally(&shim, End::Skipped),
        tally(&shim, End::Failed),
        differences.len() + known,
        flaky.len(),
    ));
    let upgraded = client.get("rdma UPGRADED").copied().unwrap_or(0);
    ensure!(
        upgraded >= 100,
        "only {upgraded} of the suite's connections upgraded: {client:?}"
    );
    if !differences.is_empty() {
        bail!(
            "{} test(s) ended otherwise under the shim:\n{}",
            differences.len(),
            differences.join("\n")
        );
    }
    Ok(())
}

/// The report unittest printed for test `id` in `out` (`FAIL: name (id)` or `ERROR: ...`,
/// through its traceback), at most 80 lines.
fn failure(out: &str, id: &str) -> String {
    let tag = format!("({id})");
    let lines: Vec<&str> = out.lines().collect();
    let Some(start) = lines
        .iter()
        .position(|l| (l.starts_with("FAIL: ") || l.starts_with("ERROR: ")) && l.contains(&tag))
    else {
        return String::from("(no report)");
    };
    lines[start..]
        .iter()
        .skip(1)
        .take_while(|l| !l.starts_with("======"))
        .take(80)
        .copied()
        .collect::<Vec<_>>()
        .join("\n")
}
