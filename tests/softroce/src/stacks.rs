//! What a hung scenario was doing: before the runner kills a scenario that passed its timeout,
//! it writes the thread stacks of the scenario's processes into the scenario's log, so a hang
//! in CI can be read without reproducing it.
//!
//! Each process under the scenario (but shells and the harness's own helpers) is attached with
//! `gdb -p PID -batch` behind `timeout` (an attach under TCG takes seconds; a wedged one must
//! not hold the runner): at most [`MOST`] processes, [`ALLOWANCE`] in all, which the guest's own
//! bound includes. Without gdb on `PATH` the log says so and nothing else happens.

use std::fs;
use std::io::Write;
use std::process::{Command, Stdio};

use crate::process::descendants;

/// Processes not worth a stack: the shells and wrappers every scenario runs through.
const SKIPPED: &[&str] = &["sh", "bash", "dash", "unshare", "timeout", "sleep", "gdb"];
/// At most this many processes are attached (each takes a while under TCG).
const MOST: usize = 4;
/// What the dumps of one hung scenario may take, at most.
pub const ALLOWANCE: std::time::Duration = std::time::Duration::from_secs(4 * 60);
/// The bound on one attach, in seconds (`timeout`'s argument).
const ATTACH_SECS: &str = "60";

/// Writes the stacks of `root`'s descendants to `log`.
pub fn dump(root: u32, log: &mut impl Write) {
    let gdb_found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("gdb").is_file()));
    if !gdb_found {
        let _ = writeln!(
            log,
            "softroce runner: no gdb on PATH, so no stacks of the hung processes"
        );
        return;
    }
    let interesting: Vec<(u32, String)> = descendants(root)
        .into_iter()
        .filter_map(|p| {
            let comm = fs::read_to_string(format!("/proc/{p}/comm")).ok()?;
            let comm = comm.trim().to_owned();
            (!SKIPPED.contains(&comm.as_str())).then_some((p, comm))
        })
        .collect();
    for (p, comm) in interesting.iter().take(MOST) {
        let cmdline = fs::read(format!("/proc/{p}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        let _ = writeln!(
            log,
            "softroce runner: stacks of pid {p} ({comm}): {}",
            cmdline.trim()
        );
        let out = Command::new("timeout")
            .args(["-s", "KILL", ATTACH_SECS, "gdb", "-nx", "-batch", "-p"])
            .arg(p.to_string())
            .args(["-ex", "thread apply all bt 40"])
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(out) => {
                // gdb's own chatter (symbol loading, "[New LWP") says nothing about the hang.
                for line in String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter(|l| l.starts_with('#') || l.starts_with("Thread "))
                {
                    let _ = writeln!(log, "  {line}");
                }
            }
            Err(e) => {
                let _ = writeln!(log, "  (gdb did not run: {e})");
            }
        }
    }
    if interesting.len() > MOST {
        let _ = writeln!(
            log,
            "softroce runner: {} more processes not attached",
            interesting.len() - MOST
        );
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::thread;
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_stuck_process_under_a_shell_leaves_its_stack_and_the_shell_none() {
        // `make deps` installs gdb; this is the one test that needs it. Debian's own python,
        // not whatever `python3` is first on PATH: a pyenv shim is a bash script named python3
        // that execs bash and env before python, so its name alone says nothing.
        let mut shell = Command::new("sh")
            .args([
                "-c",
                "/usr/bin/python3 -c 'import time; time.sleep(120)'; true",
            ])
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        // Until the shell's child has exec'd python (a fresh fork is still called sh) and its
        // arguments are in place (exec names the process before it sets up its command line,
        // which reads empty meanwhile).
        let started = || {
            descendants(shell.id()).iter().any(|p| {
                fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "python3")
                    && fs::read(format!("/proc/{p}/cmdline"))
                        .is_ok_and(|c| c.windows(11).any(|w| w == b"import time"))
            })
        };
        while !started() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        let mut log = Vec::new();
        dump(shell.id(), &mut log);
        crate::process::kill_tree(shell.id(), false);
        let _ = shell.wait();
        let log = String::from_utf8(log).unwrap();
        assert!(
            log.contains("(python3): ") && log.contains("-c import time"),
            "{log}"
        );
        assert!(!log.contains("(sh)"), "shells are skipped: {log}");
        assert!(log.contains("#0 "), "a frame: {log}");
        assert!(log.contains("sleep") || log.contains("select"), "{log}");
    }
}
