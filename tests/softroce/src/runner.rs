//! The scenario runner behind a `harness = false` test binary ([`main`]). One binary plays
//! every part, chosen by its environment:
//!
//! - **host** (default): boots one loop guest for all selected [`Topology::Loop`] scenarios and
//!   then one wire pair for all [`Topology::Wire`] ones, each running this same binary (readable
//!   in the guest through the shared root) with `--exact` and the scenario names; streams their
//!   results as libtest-like lines, prints the scenario's log and the guest's console on a
//!   failure, and exits non-zero on any failure or when no guest can boot;
//! - **in a guest** (`SOFTROCE_IN_GUEST=1`, set by the init script): runs the selected
//!   scenarios one by one, each in a child process in a fresh PID namespace (`unshare --pid
//!   --fork --kill-child --mount-proc`: when the scenario ends or passes its timeout and is
//!   killed, every process it started dies with it), and prints `SOFTROCE-RESULT` lines the
//!   host reads; wire guests meet at a file barrier before and after each scenario;
//! - **direct** (`SOFTROCE_DIRECT=1`, root, a host kernel with `rdma_rxe`): sets up the loop
//!   topology on this host with the same init script (`--setup-only`; in the initial network
//!   namespace, since rxe does not work in other namespaces on 6.1), runs the loop scenarios
//!   as in a guest, and removes the topology again (`--teardown`; after an interrupted run:
//!   `bash tests/softroce/guest/init.sh --teardown --role loop`). Wire scenarios need two
//!   guests and are reported `ignored` there;
//! - **scenario child** (`SOFTROCE_ONE=NAME`): runs one scenario's function.

use std::collections::{BTreeMap, BTreeSet};
use std::env;
use std::fmt;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::accel::{Accel, choose};
use crate::cli;
use crate::guest::{INIT_SH, Outcome, run_pair_with, run_with, tail};
use crate::helpers::rdma_devices;
use crate::locate::tools;
use crate::process::{Capture, Running};
use crate::scenario::{Ctx, ONE_VAR, Role, Scenario, TIMEOUT_VAR, Topology, barrier, mark_failed};
use crate::spec::{GuestSpec, LOOP_ADDRS, Net, WireRole};

/// How long a wire guest waits for the other one at a scenario's first barrier (the guests
/// boot at about the same time, B a few seconds after A).
pub const BEGIN_BARRIER: Duration = Duration::from_secs(240);
/// How much longer than its own timeout a wire guest waits for the other guest to finish a
/// scenario.
pub const END_BARRIER_SLACK: Duration = Duration::from_secs(60);
const RESULT: &str = "SOFTROCE-RESULT";

fn say(args: fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_fmt(args);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

macro_rules! say {
    ($($t:tt)*) => { say(format_args!($($t)*)) };
}

fn flag(name: &str) -> bool {
    env::var(name).is_ok_and(|v| v == "1")
}

/// Runs the scenario test binary: see the module docs. `scenarios` is the registry (names
/// unique, letters, digits and `_`).
pub fn main(scenarios: &[Scenario]) -> ExitCode {
    check_registry(scenarios);
    if let Ok(name) = env::var(ONE_VAR) {
        return child(scenarios, &name);
    }
    let args = cli::parse(env::args().skip(1));
    let selected: Vec<&Scenario> = scenarios.iter().filter(|s| args.selects(s.name)).collect();
    let filtered_out = scenarios.len() - selected.len();
    if args.list {
        for s in &selected {
            say!("{}: test", s.name);
        }
        return ExitCode::SUCCESS;
    }
    if flag("SOFTROCE_IN_GUEST") {
        return in_guest(&selected);
    }
    if flag("SOFTROCE_DIRECT") {
        return direct(&selected, filtered_out);
    }
    host(&selected, filtered_out)
}

fn check_registry(scenarios: &[Scenario]) {
    let mut names = BTreeSet::new();
    for s in scenarios {
        assert!(
            !s.name.is_empty()
                && s.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "scenario name {:?}: letters, digits and '_' only",
            s.name
        );
        assert!(
            names.insert(s.name),
            "scenario {} is registered twice",
            s.name
        );
    }
}

fn child(scenarios: &[Scenario], name: &str) -> ExitCode {
    let Some(s) = scenarios.iter().find(|s| s.name == name) else {
        say!("error: no scenario named {name}");
        return ExitCode::from(2);
    };
    let ctx = match Ctx::from_env() {
        Ok(ctx) => ctx,
        Err(e) => {
            say!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let r = (s.run)(&ctx);
    let _ = fs::remove_dir_all(&ctx.tmp);
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            say!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// How one scenario ended on one side.
#[derive(Clone, Debug, PartialEq)]
struct Verdict {
    status: Status,
    secs: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Ok,
    Failed,
    Timeout,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed => "FAILED",
            Status::Timeout => "TIMEOUT",
        }
    }

    fn parse(s: &str) -> Option<Status> {
        match s {
            "ok" => Some(Status::Ok),
            "FAILED" => Some(Status::Failed),
            "TIMEOUT" => Some(Status::Timeout),
            _ => None,
        }
    }
}

/// `SOFTROCE-RESULT <status> <secs> <name>` lines.
fn parse_result(line: &str) -> Option<(String, Verdict)> {
    let mut f = line.strip_prefix(RESULT)?.split_whitespace();
    let status = Status::parse(f.next()?)?;
    let secs = f.next()?.parse().ok()?;
    let name = f.next()?.to_string();
    Some((name, Verdict { status, secs }))
}

/// Marks a scenario's reported figure in its log ([`crate::Ctx::report`]).
pub(crate) const REPORT_TAG: &str = "] report: ";
/// Prefix of a reported figure on the guest's stdout, for the host.
const REPORT_MARK: &str = "SOFTROCE-REPORT";

fn results_of(stdout: &str) -> BTreeMap<String, Verdict> {
    stdout.lines().filter_map(parse_result).collect()
}

/// Where and how the scenarios of one side run.
struct Side {
    role: Role,
    work: PathBuf,
    log_dir: PathBuf,
    env: Vec<(String, String)>,
    pid_namespace: bool,
    /// Print the machine-readable result lines (for the host).
    report: bool,
}

fn pid_namespaces_work() -> bool {
    Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "--mount-proc", "true"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `scenarios` one by one in child processes; returns how each ended.
fn run_scenarios(scenarios: &[&Scenario], side: &Side) -> Vec<Status> {
    let exe = match env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            say!("error: cannot find this test binary: {e}");
            return vec![Status::Failed; scenarios.len()];
        }
    };
    if let Err(e) = fs::create_dir_all(&side.log_dir) {
        say!("error: creating {}: {e}", side.log_dir.display());
        return vec![Status::Failed; scenarios.len()];
    }
    let mut statuses = Vec::new();
    for s in scenarios {
        let started = Instant::now();
        let log_path = side.log_dir.join(format!("{}.log", s.name));
        let (status, note) = match run_one(s, side, &exe, &log_path) {
            Ok(status) => (status, None),
            Err(e) => (Status::Failed, Some(e)),
        };
        if let Some(note) = &note {
            // Runner-level trouble (barrier, spawn) goes to the scenario's log too.
            if let Ok(mut f) = fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
            {
                let _ = writeln!(f, "softroce runner: {note}");
            }
        }
        statuses.push(status);
        if status != Status::Ok {
            mark_failed(&side.work, s.name, side.role);
        }
        if side.role != Role::Loop
            && let Err(e) = barrier(
                &side.work,
                s.name,
                "end",
                side.role,
                s.timeout + END_BARRIER_SLACK,
            )
        {
            say!("softroce runner: {e:#}");
        }
        let secs = started.elapsed().as_secs_f64();
        for line in fs::read_to_string(&log_path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once(REPORT_TAG).map(|(_, m)| m))
        {
            say!("{REPORT_MARK} {} {line}", s.name);
        }
        say!(
            "test {} ... {} ({secs:.1} s){}",
            s.name,
            status.as_str(),
            note.map(|n| format!(": {n}")).unwrap_or_default()
        );
        if side.report {
            say!("{RESULT} {} {secs:.3} {}", status.as_str(), s.name);
        }
    }
    statuses
}

fn run_one(s: &Scenario, side: &Side, exe: &Path, log_path: &Path) -> Result<Status, String> {
    if side.role != Role::Loop {
        barrier(&side.work, s.name, "begin", side.role, BEGIN_BARRIER)
            .map_err(|e| format!("{e:#}"))?;
    }
    let log =
        File::create(log_path).map_err(|e| format!("creating {}: {e}", log_path.display()))?;
    let mut cmd = if side.pid_namespace {
        let mut c = Command::new("unshare");
        c.args(["--pid", "--fork", "--kill-child", "--mount-proc"])
            .arg(exe);
        c
    } else {
        Command::new(exe)
    };
    cmd.env(ONE_VAR, s.name)
        .env(TIMEOUT_VAR, s.timeout.as_millis().to_string())
        .envs(side.env.iter().map(|(k, v)| (k, v)));
    let running = Running::spawn(
        cmd,
        Capture {
            merge: true,
            tee: Some(log),
            own_group: true,
        },
    )
    .map_err(|e| format!("starting {}: {e}", exe.display()))?;
    let c = wait_or_dump(running, s.timeout, log_path)
        .map_err(|e| format!("waiting for the scenario: {e}"))?;
    if flag("SOFTROCE_VERBOSE") {
        for line in c.stdout.lines() {
            say!("  | {line}");
        }
    }
    Ok(if c.timed_out {
        if let Ok(mut f) = fs::OpenOptions::new().append(true).open(log_path) {
            let _ = writeln!(
                f,
                "softroce runner: timed out after {:.0} s; killed with all its processes",
                s.timeout.as_secs_f64()
            );
        }
        Status::Timeout
    } else if c.success() {
        Status::Ok
    } else {
        if let Ok(mut f) = fs::OpenOptions::new().append(true).open(log_path) {
            let _ = writeln!(f, "softroce runner: {}", crate::process::describe(c.status));
        }
        Status::Failed
    })
}

/// Waits for a scenario's process until `timeout`; one still running then has the stacks of
/// its processes written to its log ([`crate::stacks`]) before it is killed.
fn wait_or_dump(
    mut running: Running,
    timeout: Duration,
    log_path: &Path,
) -> std::io::Result<crate::process::Captured> {
    let deadline = Instant::now() + timeout;
    while running.is_running() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if running.is_running()
        && let Ok(mut f) = fs::OpenOptions::new().append(true).open(log_path)
    {
        crate::stacks::dump(running.pid(), &mut f);
    }
    running.wait_timeout(Duration::ZERO)
}

fn in_guest(selected: &[&Scenario]) -> ExitCode {
    let role = env::var("SOFTROCE_ROLE").unwrap_or_default();
    let Some(role) = Role::parse(&role) else {
        say!("error: SOFTROCE_ROLE={role:?}: expected loop, a or b");
        return ExitCode::from(2);
    };
    let work = env::var_os("SOFTROCE_WORK").map(PathBuf::from);
    let Some(work) = work else {
        say!("error: SOFTROCE_WORK is not set");
        return ExitCode::from(2);
    };
    let out = env::var_os("SOFTROCE_OUT").map_or_else(|| work.clone(), PathBuf::from);
    let want = if role == Role::Loop {
        Topology::Loop
    } else {
        Topology::Wire
    };
    let (mine, others): (Vec<&Scenario>, Vec<&Scenario>) =
        selected.iter().partition(|s| s.topology == want);
    for s in others {
        say!("test {} ... ignored (needs the other topology)", s.name);
    }
    let pid_namespace = pid_namespaces_work();
    say!(
        "softroce runner: {} scenarios as {}, {}",
        mine.len(),
        role.as_str(),
        if pid_namespace {
            "each in its own PID namespace"
        } else {
            "each in its own process group (unshare --pid does not work here)"
        }
    );
    let side = Side {
        role,
        work,
        log_dir: out.join("scenarios"),
        env: Vec::new(),
        pid_namespace,
        report: true,
    };
    if run_scenarios(&mine, &side).iter().all(|s| *s == Status::Ok) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Removes the direct mode's topology when dropped.
struct Teardown {
    init: PathBuf,
    state: PathBuf,
}

impl Drop for Teardown {
    fn drop(&mut self) {
        // The init script writes the state file once it has checked that no other run's
        // topology is there: without it there is nothing of ours to remove.
        if !self.state.exists() {
            return;
        }
        let mut cmd = Command::new("bash");
        cmd.arg(&self.init)
            .args(["--teardown", "--role", "loop"])
            .env("SOFTROCE_SYSCTL_STATE", &self.state);
        match Running::spawn(
            cmd,
            Capture {
                merge: true,
                ..Capture::default()
            },
        )
        .and_then(|r| r.wait_timeout(Duration::from_secs(60)))
        {
            Ok(c) if c.success() => say!("{}", c.stdout.trim_end()),
            Ok(c) => say!("softroce: teardown failed: {c}"),
            Err(e) => say!("softroce: teardown failed: {e}"),
        }
    }
}

fn direct(selected: &[&Scenario], filtered_out: usize) -> ExitCode {
    let started = Instant::now();
    say!(
        "\nrunning {} tests (direct mode: this host's rdma_rxe)",
        selected.len()
    );
    let (loops, wires): (Vec<&Scenario>, Vec<&Scenario>) =
        selected.iter().partition(|s| s.topology == Topology::Loop);
    for s in &wires {
        say!(
            "test {} ... ignored (wire scenarios need two guests; direct mode has one host)",
            s.name
        );
    }
    let tmp = match tempfile::Builder::new()
        .prefix("softroce-direct-")
        .tempdir()
    {
        Ok(t) => t,
        Err(e) => {
            say!("softroce: creating a temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let init = tmp.path().join("init.sh");
    let state = tmp.path().join("sysctl.state");
    let scratch = tmp.path().join("tmp");
    if let Err(e) = fs::write(&init, INIT_SH).and_then(|()| fs::create_dir_all(&scratch)) {
        say!("softroce: writing {}: {e}", init.display());
        return ExitCode::FAILURE;
    }
    let mut failed = 0;
    if !loops.is_empty() {
        let mut cmd = Command::new("bash");
        cmd.arg(&init)
            .args(["--setup-only", "--role", "loop"])
            .env("SOFTROCE_SYSCTL_STATE", &state);
        let setup = Running::spawn(
            cmd,
            Capture {
                merge: true,
                ..Capture::default()
            },
        )
        .and_then(|r| r.wait_timeout(Duration::from_secs(120)));
        let guard = Teardown {
            init: init.clone(),
            state: state.clone(),
        };
        match setup {
            Ok(c) if c.success() => {
                say!("softroce: loop topology set up:\n{}", c.stdout.trim_end())
            }
            Ok(c) => {
                say!(
                    "softroce: direct mode needs root and a kernel with rdma_rxe; setting up the \
                     loop topology failed: {c}"
                );
                return ExitCode::FAILURE;
            }
            Err(e) => {
                say!("softroce: running {}: {e}", init.display());
                return ExitCode::FAILURE;
            }
        }
        use nix::sys::resource::{RLIM_INFINITY, Resource, setrlimit};
        if let Err(e) = setrlimit(Resource::RLIMIT_MEMLOCK, RLIM_INFINITY, RLIM_INFINITY) {
            say!("softroce: cannot lift RLIMIT_MEMLOCK ({e}); RDMA registrations may fail");
        }
        let (a, b) = LOOP_ADDRS;
        let side = Side {
            role: Role::Loop,
            work: tmp.path().to_path_buf(),
            log_dir: tmp.path().join("scenarios"),
            env: vec![
                ("SOFTROCE_ROLE".into(), "loop".into()),
                ("SOFTROCE_ADDR_A".into(), a.to_string()),
                ("SOFTROCE_ADDR_B".into(), b.to_string()),
                ("SOFTROCE_DEVICES".into(), "rxea rxeb".into()),
                ("SOFTROCE_WORK".into(), tmp.path().display().to_string()),
                ("SOFTROCE_OUT".into(), tmp.path().display().to_string()),
                ("TMPDIR".into(), scratch.display().to_string()),
            ],
            pid_namespace: pid_namespaces_work(),
            report: false,
        };
        let statuses = run_scenarios(&loops, &side);
        for (s, status) in loops.iter().zip(&statuses) {
            if *status != Status::Ok {
                failed += 1;
                let log = side.log_dir.join(format!("{}.log", s.name));
                let text = fs::read_to_string(&log).unwrap_or_default();
                say!("\n---- {} ----\n{}", s.name, text.trim_end());
            }
        }
        drop(guard);
    }
    summary(
        selected.len() - wires.len() - failed,
        failed,
        wires.len(),
        filtered_out,
        started,
    )
}

fn summary(
    passed: usize,
    failed: usize,
    ignored: usize,
    filtered_out: usize,
    started: Instant,
) -> ExitCode {
    say!(
        "\ntest result: {}. {passed} passed; {failed} failed; {ignored} ignored; 0 measured; \
         {filtered_out} filtered out; finished in {:.2}s\n",
        if failed == 0 { "ok" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[derive(Default)]
struct LiveState {
    /// scenario -> guest -> verdict
    results: BTreeMap<String, BTreeMap<String, Verdict>>,
    printed: BTreeSet<String>,
}

/// Prints each scenario's libtest-like line as soon as every guest it runs in has reported.
struct Live {
    guests: Vec<String>,
    started: Instant,
    verbose: bool,
    seen: Mutex<LiveState>,
}

impl Live {
    fn new(guests: &[&str], verbose: bool) -> Live {
        Live {
            guests: guests.iter().map(|g| g.to_string()).collect(),
            started: Instant::now(),
            verbose,
            seen: Mutex::new(LiveState::default()),
        }
    }

    fn line(&self, guest: &str, line: &str) {
        if self.verbose {
            say!(
                "[{guest} {:6.1}] {line}",
                self.started.elapsed().as_secs_f64()
            );
        } else if let Some(rest) = line.strip_prefix(REPORT_MARK) {
            // A scenario's figure (`Ctx::report`), shown with every run.
            say!("  {guest}: {}", rest.trim());
        } else if let Some(rest) = line.strip_prefix("SOFTROCE-MARK ") {
            let mark = rest.split_whitespace().next().unwrap_or_default();
            let what = match mark {
                "INIT-START" => Some("booted"),
                "SETUP-DONE" => Some("topology ready"),
                _ => None,
            };
            if let Some(what) = what {
                say!(
                    "softroce: guest {guest}: {what} after {:.1} s",
                    self.started.elapsed().as_secs_f64()
                );
            }
        }
        let Some((name, verdict)) = parse_result(line) else {
            return;
        };
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let LiveState { results, printed } = &mut *seen;
        let per = results.entry(name.clone()).or_default();
        per.insert(guest.to_string(), verdict);
        if self.guests.iter().all(|g| per.contains_key(g)) && printed.insert(name.clone()) {
            let v = combine(per.values());
            say!("test {name} ... {} ({:.1} s)", v.status.as_str(), v.secs);
        }
    }

    fn printed(&self, name: &str) -> bool {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .printed
            .contains(name)
    }
}

fn combine<'a>(vs: impl Iterator<Item = &'a Verdict>) -> Verdict {
    let mut out = Verdict {
        status: Status::Ok,
        secs: 0.0,
    };
    for v in vs {
        out.secs = out.secs.max(v.secs);
        if out.status == Status::Ok || v.status == Status::Timeout {
            out.status = v.status;
        }
    }
    out
}

/// A scenario that failed, and where to look.
struct Failure {
    name: String,
    details: String,
}

fn guest_argv(exe: &Path, scenarios: &[&Scenario]) -> Vec<String> {
    let mut argv = vec![exe.display().to_string(), "--exact".to_string()];
    argv.extend(scenarios.iter().map(|s| s.name.to_string()));
    argv
}

fn passthrough(mut spec: GuestSpec) -> GuestSpec {
    for k in [
        "SOFTROCE_VERBOSE",
        "SOFTROCE_SHIM_LOG",
        "STREAMSHIM_LIB",
        "RUST_BACKTRACE",
        "RUST_LOG",
    ] {
        if let Ok(v) = env::var(k) {
            spec = spec.env(k, v);
        }
    }
    spec
}

/// Judges the scenarios that ran in `outcomes` (one guest, or both of a pair): results from
/// each guest's stdout file, failures with the scenario's log and the guest's console.
fn judge(
    scenarios: &[&Scenario],
    outcomes: &[&Outcome],
    live: &Live,
    failures: &mut Vec<Failure>,
) -> usize {
    let results: Vec<BTreeMap<String, Verdict>> =
        outcomes.iter().map(|o| results_of(&o.stdout)).collect();
    let mut passed = 0;
    for s in scenarios {
        let verdicts: Vec<Option<&Verdict>> = results.iter().map(|r| r.get(s.name)).collect();
        let complete: Vec<&Verdict> = verdicts.iter().flatten().copied().collect();
        let ok =
            complete.len() == outcomes.len() && complete.iter().all(|v| v.status == Status::Ok);
        if !live.printed(s.name) {
            let secs = complete.iter().map(|v| v.secs).fold(0.0, f64::max);
            let status = if ok {
                "ok".to_string()
            } else if complete.len() < outcomes.len() {
                "FAILED (did not finish)".to_string()
            } else {
                combine(complete.iter().copied())
                    .status
                    .as_str()
                    .to_string()
            };
            say!("test {} ... {status} ({secs:.1} s)", s.name);
        }
        if ok {
            passed += 1;
            continue;
        }
        let mut details = String::new();
        for (o, v) in outcomes.iter().zip(&verdicts) {
            let log = o.work_dir.join("scenarios").join(format!("{}.log", s.name));
            let state = v.map_or("did not finish".to_string(), |v| {
                format!("{} after {:.1} s", v.status.as_str(), v.secs)
            });
            details.push_str(&format!(
                "-- guest {}: {state}; log {}\n{}\n",
                o.name,
                log.display(),
                fs::read_to_string(&log)
                    .map(|t| tail(t.trim_end(), 200))
                    .unwrap_or_else(|e| format!("(no log: {e})"))
            ));
        }
        failures.push(Failure {
            name: s.name.to_string(),
            details,
        });
    }
    passed
}

/// How a guest ended, and where its files are; its console's tail too when the guest itself
/// went wrong (setup failed, timed out, crashed) rather than a scenario in it.
fn guest_report(o: &Outcome) -> String {
    let console = o.work_dir.join("console.log");
    if o.exit.is_some() && !o.timed_out {
        return format!(
            "{}\n  work dir {}\n  console {}",
            o.summary(),
            o.work_dir.display(),
            console.display()
        );
    }
    format!(
        "{}\n  work dir {}\n  console {} (last 120 lines below)\n{}",
        o.summary(),
        o.work_dir.display(),
        console.display(),
        o.console_tail(120)
    )
}

/// What one guest run (the loop guest, or the wire pair) ended with.
#[derive(Default)]
struct Part {
    passed: usize,
    failures: Vec<Failure>,
    /// Reports of guests that had a failing scenario.
    trouble: Vec<String>,
    /// Shared directories to keep (a failure's) and to remove.
    keep: Vec<PathBuf>,
    remove: Vec<PathBuf>,
}

impl Part {
    /// Every scenario of `scenarios` failed because its guest did: `why`.
    fn no_guest(scenarios: &[&Scenario], what: &str, why: &str) -> Part {
        let mut part = Part::default();
        for s in scenarios {
            say!("test {} ... FAILED (no guest)", s.name);
            part.failures.push(Failure {
                name: s.name.to_string(),
                details: format!("{what} failed: {why}"),
            });
        }
        part
    }
}

/// Boots the loop guest for `loops` (none: nothing to do) and judges them.
fn run_loop(loops: &[&Scenario], exe: &Path, accel: Accel, verbose: bool) -> Part {
    if loops.is_empty() {
        return Part::default();
    }
    let timeout: Duration = accel.boot_allowance()
        + loops.iter().map(|s| s.timeout).sum::<Duration>()
        + crate::stacks::ALLOWANCE
        + Duration::from_secs(60);
    let spec = passthrough(GuestSpec::new("loop", guest_argv(exe, loops)).timeout(timeout));
    say!(
        "softroce: booting the loop guest for {} scenarios",
        loops.len()
    );
    let live = Live::new(&["loop"], verbose);
    match run_with(&spec, &|g, l| live.line(g, l)) {
        Ok(o) => {
            say!("softroce: {}", o.summary());
            let mut part = Part::default();
            part.passed = judge(loops, &[&o], &live, &mut part.failures);
            if part.passed < loops.len() {
                part.trouble.push(guest_report(&o));
                part.keep.push(o.shared_dir.clone());
            } else {
                part.remove.push(o.shared_dir.clone());
            }
            part
        }
        Err(e) => {
            say!("softroce: the loop guest failed: {e}");
            Part::no_guest(loops, "the loop guest", &e.to_string())
        }
    }
}

/// Boots the wire pair for `wires` (none: nothing to do) and judges them.
fn run_wires(wires: &[&Scenario], exe: &Path, accel: Accel, verbose: bool) -> Part {
    if wires.is_empty() {
        return Part::default();
    }
    let timeout: Duration = accel.boot_allowance()
        + wires
            .iter()
            .map(|s| s.timeout + END_BARRIER_SLACK)
            .sum::<Duration>()
        + crate::stacks::ALLOWANCE
        + BEGIN_BARRIER;
    let argv = guest_argv(exe, wires);
    let side = |role: WireRole| {
        passthrough(
            GuestSpec::new(role.as_str(), argv.clone())
                .net(Net::Wire { role, port: 0 })
                .timeout(timeout),
        )
    };
    say!(
        "softroce: booting the wire pair for {} scenarios",
        wires.len()
    );
    let live = Live::new(&["a", "b"], verbose);
    match run_pair_with(&side(WireRole::A), &side(WireRole::B), &|g, l| {
        live.line(g, l)
    }) {
        Ok((a, b)) => {
            say!("softroce: {}", a.summary());
            say!("softroce: {}", b.summary());
            let mut part = Part::default();
            part.passed = judge(wires, &[&a, &b], &live, &mut part.failures);
            if part.passed < wires.len() {
                part.trouble.push(guest_report(&a));
                part.trouble.push(guest_report(&b));
                part.keep.push(a.shared_dir.clone());
            } else {
                part.remove.push(a.shared_dir.clone());
            }
            part
        }
        Err(e) => {
            say!("softroce: the wire pair failed: {e}");
            Part::no_guest(wires, "the wire pair", &e.to_string())
        }
    }
}

fn host(selected: &[&Scenario], filtered_out: usize) -> ExitCode {
    let started = Instant::now();
    say!("\nrunning {} tests", selected.len());
    if selected.is_empty() {
        return summary(0, 0, 0, filtered_out, started);
    }
    let no_guest = |why: String| {
        say!("softroce: {why}");
        for s in selected {
            say!("test {} ... FAILED (no guest)", s.name);
        }
        summary(0, selected.len(), 0, filtered_out, started)
    };
    let tools = match tools() {
        Ok(t) => t,
        Err(e) => return no_guest(format!("cannot boot a guest: {e}")),
    };
    let (accel, why) = match choose(&tools) {
        Ok(a) => a,
        Err(e) => return no_guest(format!("cannot choose an accelerator: {e}")),
    };
    let devices = rdma_devices();
    say!(
        "softroce: guests boot {} with {} under {accel} ({why}){}",
        tools.kernel.image.display(),
        tools.vng.display(),
        if devices.is_empty() {
            String::new()
        } else {
            format!(
                "; this host has RDMA devices ({}): SOFTROCE_DIRECT=1 runs the loop scenarios here",
                devices.join(" ")
            )
        }
    );
    let exe = match env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return no_guest(format!("cannot find this test binary: {e}")),
    };
    let verbose = flag("SOFTROCE_VERBOSE");
    let (loops, wires): (Vec<&Scenario>, Vec<&Scenario>) =
        selected.iter().partition(|s| s.topology == Topology::Loop);
    // One after the other: side by side on two cores, the wire pair's boots and its nested
    // QEMU migration slow the loop guest's scenarios about as much as they save.
    let on_loop = run_loop(&loops, &exe, accel, verbose);
    let on_wires = run_wires(&wires, &exe, accel, verbose);
    let mut failures = Vec::new();
    let mut passed = 0;
    let mut guest_trouble = Vec::new();
    let mut keep = Vec::new();
    let mut remove = Vec::new();
    for part in [on_loop, on_wires] {
        passed += part.passed;
        failures.extend(part.failures);
        guest_trouble.extend(part.trouble);
        keep.extend(part.keep);
        remove.extend(part.remove);
    }

    if !failures.is_empty() {
        say!("\nfailures:");
        for f in &failures {
            say!("\n---- {} ----\n{}", f.name, f.details.trim_end());
        }
        for g in &guest_trouble {
            say!("\n---- guest ----\n{g}");
        }
        say!("\nfailures:");
        for f in &failures {
            say!("    {}", f.name);
        }
        for dir in &keep {
            say!("softroce: kept {}", dir.display());
        }
    }
    for dir in remove {
        let _ = fs::remove_dir_all(dir);
    }
    summary(passed, failures.len(), 0, filtered_out, started)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_lines_round_trip() {
        let (name, v) = parse_result("SOFTROCE-RESULT TIMEOUT 12.500 smoke_x").unwrap();
        assert_eq!(name, "smoke_x");
        assert_eq!(v.status, Status::Timeout);
        assert!((v.secs - 12.5).abs() < 1e-9);
        assert!(parse_result("SOFTROCE-RESULT bogus 1 x").is_none());
        let r = results_of("noise\nSOFTROCE-RESULT ok 1.0 a\nSOFTROCE-RESULT FAILED 2.0 b\n");
        assert_eq!(r.len(), 2);
        assert_eq!(r["b"].status, Status::Failed);
    }

    #[test]
    fn a_pair_passes_only_when_both_sides_do() {
        let ok = Verdict {
            status: Status::Ok,
            secs: 1.0,
        };
        let bad = Verdict {
            status: Status::Failed,
            secs: 3.0,
        };
        let v = combine([&ok, &bad].into_iter());
        assert_eq!((v.status, v.secs), (Status::Failed, 3.0));
        assert_eq!(combine([&ok, &ok].into_iter()).status, Status::Ok);
    }
}
