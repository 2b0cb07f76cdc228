//! Scenarios: a name, a topology, a timeout and a function, run inside a guest (or on a host in
//! direct mode) by [`crate::runner`]. The function gets a [`Ctx`]: its role, the topology's
//! addresses, a scratch directory, its deadline, and helpers that log what they run.

use std::env;
use std::fmt::Display;
use std::fs;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::helpers::{self, Captured, Running};

/// A scenario's body: runs one guest's part and fails with an error (or a panic).
pub type ScenarioFn = fn(&Ctx) -> anyhow::Result<()>;

/// Where a scenario runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// In the loop guest: both ends in one guest, across a veth (rxea and rxeb).
    Loop,
    /// In both guests of a wire pair; the function runs once in each, with role A and role B.
    Wire,
}

/// One entry of a scenario registry.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    /// Unique; letters, digits and `_` (a libtest-like test name).
    pub name: &'static str,
    /// Loop guest or wire pair.
    pub topology: Topology,
    /// The bound on the scenario's run in the guest (booting is not included); past it the
    /// scenario fails and all its processes are killed.
    pub timeout: Duration,
    /// The body.
    pub run: ScenarioFn,
}

/// The part a guest plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The loop guest (or a host in direct mode).
    Loop,
    /// Wire guest A (198.18.1.1).
    A,
    /// Wire guest B (198.18.1.2).
    B,
}

impl Role {
    /// From `SOFTROCE_ROLE`: "loop", "a" or "b".
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "loop" => Some(Role::Loop),
            "a" => Some(Role::A),
            "b" => Some(Role::B),
            _ => None,
        }
    }

    /// "loop", "a" or "b".
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Loop => "loop",
            Role::A => "a",
            Role::B => "b",
        }
    }

    /// The other wire side (`None` for the loop).
    pub fn peer(self) -> Option<Role> {
        match self {
            Role::Loop => None,
            Role::A => Some(Role::B),
            Role::B => Some(Role::A),
        }
    }
}

/// What a scenario knows about where it runs.
#[derive(Debug)]
pub struct Ctx {
    /// The scenario's name.
    pub name: String,
    /// Loop, A or B.
    pub role: Role,
    /// 198.18.0.1 (loop, on va/rxea) or 198.18.1.1 (wire guest A).
    pub addr_a: Ipv4Addr,
    /// 198.18.0.2 (loop, on vb/rxeb) or 198.18.1.2 (wire guest B).
    pub addr_b: Ipv4Addr,
    /// The RDMA devices of the topology: `rxea rxeb` (loop) or `rxe0` (wire).
    pub devices: Vec<String>,
    /// The MTU of the topology's links (`SOFTROCE_MTU`, default 9000; rxe's path MTU is 4096
    /// from about 4200 up).
    pub mtu: u32,
    /// The run's shared host directory (`SOFTROCE_WORK`; both guests of a pair see it).
    pub work: PathBuf,
    /// A fresh directory for this scenario on a tmpfs (the 9p root cannot ftruncate or bind
    /// unix sockets).
    pub tmp: PathBuf,
    /// When the runner kills the scenario.
    pub deadline: Instant,
    started: Instant,
}

/// Variable with the scenario a runner child runs.
pub(crate) const ONE_VAR: &str = "SOFTROCE_ONE";
/// Variable with the scenario's timeout in milliseconds.
pub(crate) const TIMEOUT_VAR: &str = "SOFTROCE_TIMEOUT_MS";

impl Ctx {
    /// The context of the scenario this process runs, from the `SOFTROCE_*` variables.
    pub fn from_env() -> anyhow::Result<Ctx> {
        let var = |k: &str| env::var(k).with_context(|| format!("{k} is not set"));
        let name = var(ONE_VAR)?;
        let role = var("SOFTROCE_ROLE")?;
        let role = Role::parse(&role).with_context(|| format!("SOFTROCE_ROLE={role}"))?;
        let addr = |k: &str| -> anyhow::Result<Ipv4Addr> {
            var(k)?
                .parse()
                .with_context(|| format!("{k} is not an IPv4 address"))
        };
        let timeout = Duration::from_millis(var(TIMEOUT_VAR)?.parse().context(TIMEOUT_VAR)?);
        let work = PathBuf::from(var("SOFTROCE_WORK")?);
        let tmp_root = env::var_os("TMPDIR").map_or_else(env::temp_dir, PathBuf::from);
        let tmp = tmp_root.join(format!("{name}-{}", std::process::id()));
        fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        Ok(Ctx {
            name,
            role,
            addr_a: addr("SOFTROCE_ADDR_A")?,
            addr_b: addr("SOFTROCE_ADDR_B")?,
            devices: env::var("SOFTROCE_DEVICES")
                .unwrap_or_default()
                .split_whitespace()
                .map(String::from)
                .collect(),
            mtu: match env::var("SOFTROCE_MTU") {
                Ok(v) if !v.is_empty() => v.parse().with_context(|| format!("SOFTROCE_MTU={v}"))?,
                _ => 9000,
            },
            work,
            tmp,
            deadline: Instant::now() + timeout,
            started: Instant::now(),
        })
    }

    /// This side's address: A's in the loop and on guest A, B's on guest B.
    pub fn local_addr(&self) -> Ipv4Addr {
        if self.role == Role::B {
            self.addr_b
        } else {
            self.addr_a
        }
    }

    /// The other side's address: B's in the loop and on guest A, A's on guest B.
    pub fn peer_addr(&self) -> Ipv4Addr {
        if self.role == Role::B {
            self.addr_a
        } else {
            self.addr_b
        }
    }

    /// Time left before the deadline.
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Prints a line to the scenario's log, with the seconds since it started.
    pub fn log(&self, msg: impl Display) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "[{:7.3}] {msg}", self.started.elapsed().as_secs_f64());
        let _ = out.flush();
    }

    /// Logs a figure worth seeing in every run (the runner prints it with the scenario's
    /// result, also when it passed), on one line.
    pub fn report(&self, msg: impl Display) {
        let msg = msg.to_string();
        let one_line: Vec<&str> = msg.lines().map(str::trim).collect();
        self.log(format_args!("report: {}", one_line.join(" | ")));
    }

    /// Runs `script` (bash, own process group) until it ends or the deadline, logging the
    /// script and its output; does not judge its status.
    pub fn bash(&self, script: &str) -> anyhow::Result<Captured> {
        self.log(format_args!("$ {script}"));
        let c = helpers::bash(script, self.remaining())
            .with_context(|| format!("starting bash for {script}"))?;
        self.log(format_args!("  -> {}", indent(&c.to_string())));
        Ok(c)
    }

    /// [`Ctx::bash`], failing unless the script exits 0.
    pub fn sh(&self, script: &str) -> anyhow::Result<Captured> {
        let c = self.bash(script)?;
        if c.success() {
            Ok(c)
        } else {
            bail!("`{script}` failed: {}", describe_short(&c))
        }
    }

    /// Starts `script` in the background (bash, own process group), logging it; dropping the
    /// handle kills it and logs what it wrote (when [`Ctx::wait`] did not).
    pub fn spawn(&self, script: &str) -> anyhow::Result<Running> {
        self.log(format_args!("$ {script} &"));
        let name: String = script.chars().take(100).collect();
        helpers::spawn_bash(script)
            .map(|r| r.report_as(name))
            .with_context(|| format!("starting bash for {script}"))
    }

    /// Waits for a background script until the deadline and logs its end and output.
    pub fn wait(&self, what: &str, r: Running) -> anyhow::Result<Captured> {
        let c = r.wait_timeout(self.remaining())?;
        self.log(format_args!("{what}: {}", indent(&c.to_string())));
        Ok(c)
    }

    /// Wire only (a no-op in the loop): waits until the other guest has reached the barrier
    /// `tag` of this scenario too, or the deadline, or the other guest's scenario has failed.
    pub fn barrier(&self, tag: &str) -> anyhow::Result<()> {
        barrier(&self.work, &self.name, tag, self.role, self.remaining())
    }
}

fn indent(s: &str) -> String {
    s.replace('\n', "\n     ")
}

fn describe_short(c: &Captured) -> String {
    let mut s = if c.timed_out {
        "timed out".to_string()
    } else {
        crate::process::describe(c.status)
    };
    let out = format!("{}{}", c.stdout, c.stderr);
    let out = crate::guest::tail(out.trim_end(), 15);
    if !out.is_empty() {
        s.push_str(":\n");
        s.push_str(&out);
    }
    s
}

fn barrier_dir(work: &Path) -> PathBuf {
    work.join("barriers")
}

/// Marks scenario `name` as failed on this side, for the peer's barriers.
pub(crate) fn mark_failed(work: &Path, name: &str, role: Role) {
    let dir = barrier_dir(work);
    let _ = fs::create_dir_all(&dir);
    let _ = fs::write(dir.join(format!("{name}.FAILED.{}", role.as_str())), b"");
}

/// The file barrier both wire guests use: the shared run directory is one host directory
/// mounted over 9p in both guests, and a file one guest creates is visible to the other at
/// once (no caching: `sync,dirsync`, measured within the 100 ms polling interval).
pub(crate) fn barrier(
    work: &Path,
    name: &str,
    tag: &str,
    role: Role,
    timeout: Duration,
) -> anyhow::Result<()> {
    let Some(peer) = role.peer() else {
        return Ok(());
    };
    let dir = barrier_dir(work);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    fs::write(dir.join(format!("{name}.{tag}.{}", role.as_str())), b"")
        .with_context(|| format!("writing barrier {tag} in {}", dir.display()))?;
    let theirs = dir.join(format!("{name}.{tag}.{}", peer.as_str()));
    let failed = dir.join(format!("{name}.FAILED.{}", peer.as_str()));
    let deadline = Instant::now() + timeout;
    loop {
        if theirs.exists() {
            return Ok(());
        }
        if failed.exists() {
            bail!(
                "guest {} failed scenario {name} before barrier {tag}",
                peer.as_str()
            );
        }
        if Instant::now() >= deadline {
            bail!(
                "guest {} did not reach barrier {tag} of {name} within {:.0} s",
                peer.as_str(),
                timeout.as_secs_f64()
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn barrier_meets_and_reports_a_failed_peer() {
        let work = tempfile::tempdir().unwrap();
        let w = work.path().to_path_buf();
        let t = thread::spawn(move || barrier(&w, "s", "go", Role::B, Duration::from_secs(20)));
        barrier(work.path(), "s", "go", Role::A, Duration::from_secs(20)).unwrap();
        t.join().unwrap().unwrap();
        assert!(barrier(work.path(), "s", "x", Role::Loop, Duration::ZERO).is_ok());
        let err = barrier(work.path(), "s", "y", Role::A, Duration::from_millis(200)).unwrap_err();
        assert!(err.to_string().contains("did not reach"), "{err}");
        mark_failed(work.path(), "s", Role::B);
        let err = barrier(work.path(), "s", "z", Role::A, Duration::from_secs(20)).unwrap_err();
        assert!(err.to_string().contains("failed scenario"), "{err}");
    }
}
