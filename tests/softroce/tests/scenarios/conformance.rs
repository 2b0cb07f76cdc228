//! The differential suite of docs/shim-conformance.md: one probe program
//! (`scripts/conformance.py`, a row per socket behaviour) run on plain TCP, under the shim with
//! every connection upgraded, and under the shim with every connection fallen back after its
//! negotiation started, each row's answer compared with plain TCP's.
//!
//! The matrix in docs/shim-conformance.md is the expectation: a row whose cell says "as TCP"
//! must answer as plain TCP did, and a row documented as different must still differ (the
//! document stays true as rows are fixed). A probe row missing from the matrix, or a matrix row
//! the probe does not run, fails too.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, ensure};
use rdma_streams_softroce::{Ctx, Scenario, Topology};

use super::support::{counts, file, python, shimmed};

pub const SCENARIOS: &[Scenario] = &[Scenario {
    name: "shim_conformance_rows_answer_as_tcp_upgraded_and_fallen_back",
    topology: Topology::Loop,
    timeout: Duration::from_secs(900),
    run,
}];

const PROBE: &str = include_str!("scripts/conformance.py");
/// Rows whose connection the shim keeps on the kernel's TCP socket, and how the client counts
/// it (in both shimmed runs): zero-copy sends wait for completions only that socket gives.
const STAYS_TCP: &[(&str, &str)] = &[
    ("zerocopy_before_connect", "tcp UNSUPPORTED"),
    ("zerocopy_listener", "tcp PEER_NOT_SHIMMED"),
];
const MATRIX: &str = include_str!("../../../../docs/shim-conformance.md");

/// How a connection of a run ended up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Upgraded,
    FallenBack,
}

/// What the matrix says of a row in one mode: it answers as TCP; it differs, with this answer
/// (the cell's first `` `...` ``), for the reason the cell gives; or its answer varies from run
/// to run (a race the cell names), and the run only reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expected {
    AsTcp,
    Differs { answer: String, cell: String },
    Varies,
}

/// The probe rows of the matrix (the table whose first column is a `` `row` ``): row ->
/// (upgraded, fallen back).
fn matrix(text: &str) -> anyhow::Result<BTreeMap<String, (Expected, Expected)>> {
    let mut rows = BTreeMap::new();
    for line in text.lines() {
        let cells = cells(line);
        let Some(name) = cells
            .first()
            .and_then(|c| c.strip_prefix("`probe: "))
            .and_then(|c| c.strip_suffix('`'))
            .map(str::to_owned)
        else {
            continue;
        };
        ensure!(
            cells.len() >= 4,
            "matrix row {name}: fewer than 4 cells: {line}"
        );
        let expect = |cell: &str| -> anyhow::Result<Expected> {
            if cell.starts_with("as TCP") {
                return Ok(Expected::AsTcp);
            }
            if cell.starts_with("varies") {
                return Ok(Expected::Varies);
            }
            let answer = cell
                .strip_prefix("differs: `")
                .and_then(|rest| rest.split_once('`'))
                .map(|(answer, _)| answer.to_owned());
            let Some(answer) = answer else {
                bail!(
                    "matrix row {name}: a cell is neither `as TCP`, `differs: `answer`: why` \
                     nor `varies: why`: {cell}"
                );
            };
            Ok(Expected::Differs {
                answer,
                cell: cell.to_owned(),
            })
        };
        let n = cells.len();
        let old = rows.insert(
            name.clone(),
            (expect(&cells[n - 2])?, expect(&cells[n - 1])?),
        );
        ensure!(old.is_none(), "matrix row {name} twice");
    }
    ensure!(
        !rows.is_empty(),
        "docs/shim-conformance.md has no probe rows"
    );
    Ok(rows)
}

/// The cells of a Markdown table line, split at the `|` that are not escaped (`\|`).
fn cells(line: &str) -> Vec<String> {
    let line = line.trim().trim_start_matches('|');
    let mut cells = Vec::new();
    let mut cell = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cell.push('|');
                chars.next();
            }
            '|' => cells.push(std::mem::take(&mut cell).trim().to_owned()),
            c => cell.push(c),
        }
    }
    if !cell.trim().is_empty() {
        cells.push(cell.trim().to_owned());
    }
    cells
}

/// `row answer` lines -> row -> answer.
fn answers(out: &str) -> BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(row, answer)| (row.to_owned(), answer.to_owned()))
        .collect()
}

fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let py = python();
    let probe = file(ctx, "conformance.py", PROBE)?;
    let expected = matrix(MATRIX)?;
    // The plain run beside the fallen-back one: both mostly wait (the rows' pauses, the
    // fallback's negotiation bound) and neither moves a byte by RDMA. The upgraded run alone.
    let plain = ctx.spawn(&format!("{py} {} {a} 11000 upgraded", probe.display()))?;
    let fallen = ctx.sh(&format!(
        "{} {py} {} {a} 11200 fallback",
        // Shorter than the probe's FALLBACK_ACCEPT_AFTER: no CLAIM comes in time.
        shimmed(ctx, "fb", "STREAMSHIM_NEGOTIATE_MS=300")?,
        probe.display()
    ));
    let plain = ctx.wait("the plain run", plain)?;
    ensure!(plain.success(), "the plain run failed: {plain}");
    let (plain, fallen) = (answers(&plain.stdout), answers(&fallen?.stdout));
    let upgraded = answers(
        &ctx.sh(&format!(
            "{} {py} {} {a} 11100 upgraded",
            shimmed(ctx, "up", "")?,
            probe.display()
        ))?
        .stdout,
    );
    let rows = plain.len();
    ensure!(rows > 0, "the probe printed nothing");
    // Every connection of each shimmed run took the path its mode names, but those the shim
    // keeps on TCP by design.
    let expect = |mode: &str| {
        let mut want = BTreeMap::new();
        for row in plain.keys() {
            let path = STAYS_TCP
                .iter()
                .find(|(r, _)| r == row)
                .map_or(mode, |(_, path)| path);
            *want.entry(path.to_owned()).or_insert(0u64) += 1;
        }
        want
    };
    let up = counts(ctx, "up", "client")?;
    ctx.log(format_args!(
        "upgraded run, client: {up:?}; server: {:?}",
        counts(ctx, "up", "server")?
    ));
    let want = expect("rdma UPGRADED");
    ensure!(
        up == want,
        "the upgraded run's {rows} connections: {up:?}, expected {want:?}"
    );
    let fb = counts(ctx, "fb", "client")?;
    ctx.log(format_args!(
        "fallen-back run, client: {fb:?}; server: {:?}",
        counts(ctx, "fb", "server")?
    ));
    let want = expect("tcp TIMEOUT");
    ensure!(
        fb == want,
        "the fallen-back run's {rows} connections: {fb:?}, expected {want:?}"
    );

    let mut wrong = Vec::new();
    for (row, tcp) in &plain {
        let Some((want_up, want_fb)) = expected.get(row) else {
            wrong.push(format!(
                "{row}: not in docs/shim-conformance.md (TCP answers {tcp})"
            ));
            continue;
        };
        for (mode, got, want) in [
            (Mode::Upgraded, upgraded.get(row), want_up),
            (Mode::FallenBack, fallen.get(row), want_fb),
        ] {
            let got = got.map_or("(no answer)", String::as_str);
            ctx.report(format_args!("{row} {mode:?}: {got} (TCP: {tcp})"));
            match want {
                Expected::Varies => {}
                Expected::AsTcp if got == tcp => {}
                Expected::AsTcp => wrong.push(format!(
                    "{row} {mode:?}: answers {got}, TCP answers {tcp} (the matrix says as TCP)"
                )),
                Expected::Differs { .. } if got == tcp => wrong.push(format!(
                    "{row} {mode:?}: answers as TCP now ({tcp}); the matrix says it differs"
                )),
                Expected::Differs { answer, .. } if got == answer => {}
                Expected::Differs { answer, cell } => wrong.push(format!(
                    "{row} {mode:?}: answers {got}, TCP answers {tcp}; the matrix says {answer} ({cell})"
                )),
            }
        }
    }
    for row in expected.keys() {
        if !plain.contains_key(row) {
            wrong.push(format!("{row}: in the matrix, not run by the probe"));
        }
    }
    if !wrong.is_empty() {
        bail!(
            "{} difference(s) from docs/shim-conformance.md:\n{}",
            wrong.len(),
            wrong.join("\n")
        );
    }
    Ok(())
}
