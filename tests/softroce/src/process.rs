//! Child processes with a deadline: spawn, capture output, and on timeout kill the child and
//! everything it started (its process group and every descendant found in `/proc`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// What a finished (or killed) child left behind.
#[derive(Clone, Debug)]
pub struct Captured {
    /// How it ended (after a timeout: killed by SIGKILL).
    pub status: ExitStatus,
    /// It ran past its deadline and was killed.
    pub timed_out: bool,
    /// Its standard output (with standard error too when they were merged).
    pub stdout: String,
    /// Its standard error (empty when merged into `stdout`).
    pub stderr: String,
    /// From spawn to exit.
    pub elapsed: Duration,
}

impl Captured {
    /// Exited 0 before its deadline.
    pub fn success(&self) -> bool {
        !self.timed_out && self.status.success()
    }

    /// `Ok(self)` when it succeeded, else an error with its status and output.
    pub fn check(self, what: &str) -> anyhow::Result<Self> {
        if self.success() {
            Ok(self)
        } else {
            Err(anyhow::anyhow!("{what} failed: {self}"))
        }
    }
}

impl fmt::Display for Captured {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.timed_out {
            write!(f, "timed out after {:.1} s", self.elapsed.as_secs_f64())?;
        } else {
            write!(
                f,
                "{} after {:.1} s",
                describe(self.status),
                self.elapsed.as_secs_f64()
            )?;
        }
        for (name, text) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            if !text.is_empty() {
                write!(f, "\n--- {name}:\n{}", text.trim_end())?;
            }
        }
        Ok(())
    }
}

/// "exit 3" or "killed by SIGKILL".
pub fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit {code}"),
        (None, Some(sig)) => match Signal::try_from(sig) {
            Ok(s) => format!("killed by {s}"),
            Err(_) => format!("killed by signal {sig}"),
        },
        _ => format!("{status}"),
    }
}

/// How a child's output is collected.
#[derive(Debug, Default)]
pub struct Capture {
    /// Standard error goes into the same pipe as standard output (one interleaved stream).
    pub merge: bool,
    /// Every byte read is also written here as it arrives (a log that survives a crash).
    pub tee: Option<File>,
    /// The child leads a new process group (killed as a whole); otherwise it stays in ours and
    /// only it and its descendants are killed.
    pub own_group: bool,
}

/// A running child whose output is being collected. Dropping it kills the child's tree.
#[derive(Debug)]
pub struct Running {
    child: Option<Child>,
    own_group: bool,
    started: Instant,
    stdout: Collector,
    stderr: Option<Collector>,
    /// Set: dropped unwaited (a scenario that failed early), the process's end and output go
    /// to stdout (the scenario's log) under this name.
    report_as: Option<String>,
}

impl Running {
    /// Spawns `cmd` (stdin from /dev/null) and collects its output per `capture`.
    pub fn spawn(mut cmd: Command, capture: Capture) -> io::Result<Running> {
        cmd.stdin(Stdio::null());
        if capture.own_group {
            cmd.process_group(0);
        }
        let tee = capture.tee.map(|f| Arc::new(Mutex::new(f)));
        let (out_r, out_w) = io::pipe()?;
        let err = if capture.merge {
            cmd.stdout(out_w.try_clone()?).stderr(out_w);
            None
        } else {
            let (err_r, err_w) = io::pipe()?;
            cmd.stdout(out_w).stderr(err_w);
            Some(err_r)
        };
        let started = Instant::now();
        let child = cmd.spawn()?;
        // The command holds the pipes' write ends: drop them so EOF comes when the child's
        // tree closes them.
        drop(cmd);
        Ok(Running {
            child: Some(child),
            own_group: capture.own_group,
            started,
            stdout: Collector::start(out_r, tee.clone()),
            stderr: err.map(|r| Collector::start(r, tee)),
            report_as: None,
        })
    }

    /// Dropped without a wait, the process is killed and its output printed on stdout
    /// under `name` (the scenario's log, where it would otherwise be lost).
    #[must_use]
    pub fn report_as(mut self, name: impl Into<String>) -> Running {
        self.report_as = Some(name.into());
        self
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Still running?
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Waits until the child exits or `timeout` passes (then kills its tree). Leftover
    /// processes of its own group are killed either way.
    pub fn wait_timeout(mut self, timeout: Duration) -> io::Result<Captured> {
        let deadline = Instant::now() + timeout;
        let own_group = self.own_group;
        let child = self.running_child()?;
        let mut timed_out = false;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if Instant::now() >= deadline {
                timed_out = true;
                kill_tree(child.id(), own_group);
                break child.wait()?;
            }
            thread::sleep(Duration::from_millis(20));
        };
        Ok(self.finish(status, timed_out))
    }

    /// Kills the child's tree now and collects what it wrote.
    pub fn kill(mut self) -> io::Result<Captured> {
        let own_group = self.own_group;
        let child = self.running_child()?;
        kill_tree(child.id(), own_group);
        let status = child.wait()?;
        Ok(self.finish(status, false))
    }

    /// The child, there until [`Self::finish`] (which only the consuming methods call).
    fn running_child(&mut self) -> io::Result<&mut Child> {
        self.child
            .as_mut()
            .ok_or_else(|| io::Error::other("the child was already waited for"))
    }

    fn finish(&mut self, status: ExitStatus, timed_out: bool) -> Captured {
        // The child has been waited for: forget it (Drop would kill its tree).
        let id = self.child.as_ref().map_or(0, Child::id);
        self.child = None;
        if self.own_group {
            // Background leftovers of the group would hold the pipes open.
            let _ = killpg(pid(id), Signal::SIGKILL);
        }
        let elapsed = self.started.elapsed();
        // A process that left the group (setsid) may still hold a pipe: do not wait forever.
        let grace = Instant::now() + Duration::from_secs(3);
        Captured {
            status,
            timed_out,
            stdout: self.stdout.take(grace),
            stderr: self
                .stderr
                .as_ref()
                .map(|c| c.take(grace))
                .unwrap_or_default(),
            elapsed,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let running = matches!(child.try_wait(), Ok(None));
        kill_tree(child.id(), self.own_group);
        let Ok(status) = child.wait() else {
            return;
        };
        if let Some(name) = self.report_as.take() {
            self.child = Some(child);
            let c = self.finish(status, false);
            let how = if running {
                "still running, killed"
            } else {
                "had ended"
            };
            let out = format!("{c}").replace('\n', "\n     ");
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "[background] {name} ({how}): {out}");
            let _ = stdout.flush();
        }
    }
}

#[derive(Debug)]
struct Collector {
    buf: Arc<Mutex<(Vec<u8>, bool)>>,
}

impl Collector {
    fn start(mut pipe: io::PipeReader, tee: Option<Arc<Mutex<File>>>) -> Collector {
        let buf = Arc::new(Mutex::new((Vec::new(), false)));
        let shared = buf.clone();
        thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            loop {
                match pipe.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if let Some(tee) = &tee {
                            let mut f = tee.lock().unwrap_or_else(|e| e.into_inner());
                            let _ = f.write_all(&chunk[..n]);
                        }
                        shared
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .0
                            .extend_from_slice(&chunk[..n]);
                    }
                }
            }
            shared.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
        });
        Collector { buf }
    }

    fn take(&self, until: Instant) -> String {
        while !self.buf.lock().unwrap_or_else(|e| e.into_inner()).1 && Instant::now() < until {
            thread::sleep(Duration::from_millis(10));
        }
        let guard = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&guard.0).into_owned()
    }
}

fn pid(p: u32) -> Pid {
    Pid::from_raw(i32::try_from(p).unwrap_or(i32::MAX))
}

/// Every live descendant of `root` (children, their children, ...), from `/proc/*/stat`.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(ppid) = parent_of(p) {
                children.entry(ppid).or_default().push(p);
            }
        }
    }
    let mut seen = BTreeSet::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or_default() {
            if seen.insert(c) {
                stack.push(c);
            }
        }
    }
    seen.into_iter().collect()
}

/// The parent pid of `p` (field 4 of `/proc/p/stat`; the name in field 2 may hold spaces).
pub fn parent_of(p: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// SIGKILLs `root`, its process group when `group` (it leads one), and every descendant. The
/// tree is read before anything is killed (orphans are re-parented and would be lost), and read
/// again afterwards for children forked meanwhile.
pub fn kill_tree(root: u32, group: bool) {
    for _ in 0..2 {
        let tree = descendants(root);
        let _ = kill(pid(root), Signal::SIGSTOP);
        if group {
            let _ = killpg(pid(root), Signal::SIGKILL);
        }
        for p in tree.iter().rev() {
            let _ = kill(pid(*p), Signal::SIGKILL);
        }
        let _ = kill(pid(root), Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bash(script: &str) -> Command {
        let mut c = Command::new("bash");
        c.arg("-c").arg(script);
        c
    }

    #[test]
    fn output_and_status_are_captured() {
        let cap = Capture {
            own_group: true,
            ..Capture::default()
        };
        let r = Running::spawn(bash("echo out; echo err >&2; exit 3"), cap).unwrap();
        let c = r.wait_timeout(Duration::from_secs(20)).unwrap();
        assert_eq!(c.status.code(), Some(3));
        assert!(!c.timed_out && !c.success());
        assert_eq!((c.stdout.as_str(), c.stderr.as_str()), ("out\n", "err\n"));
    }

    #[test]
    fn merged_output_is_one_stream_and_teed() {
        let log = tempfile::NamedTempFile::new().unwrap();
        let cap = Capture {
            merge: true,
            tee: Some(log.reopen().unwrap()),
            own_group: false,
        };
        let c = Running::spawn(bash("echo a; echo b >&2; echo c"), cap)
            .unwrap()
            .wait_timeout(Duration::from_secs(20))
            .unwrap();
        assert!(c.success());
        assert_eq!(c.stdout, "a\nb\nc\n");
        assert_eq!(fs::read_to_string(log.path()).unwrap(), "a\nb\nc\n");
    }

    #[test]
    fn a_timeout_kills_the_whole_tree() {
        let dir = tempfile::tempdir().unwrap();
        let pids = dir.path().join("pids");
        // A grandchild in another process group (setsid) must die too.
        let script = format!(
            "sleep 300 & echo $! >>{p}; setsid sleep 300 & echo $! >>{p}; sleep 300",
            p = pids.display()
        );
        let cap = Capture {
            own_group: true,
            ..Capture::default()
        };
        let c = Running::spawn(bash(&script), cap)
            .unwrap()
            .wait_timeout(Duration::from_millis(500))
            .unwrap();
        assert!(c.timed_out && !c.success());
        assert!(c.elapsed < Duration::from_secs(10), "{c}");
        for p in fs::read_to_string(&pids).unwrap().split_whitespace() {
            let p: u32 = p.parse().unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            // Killed children may linger as zombies until reaped by init: dead either way.
            while Instant::now() < deadline
                && fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| !s.contains(") Z "))
            {
                thread::sleep(Duration::from_millis(20));
            }
            let stat = fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            assert!(
                stat.is_empty() || stat.contains(") Z "),
                "{p} survived: {stat}"
            );
        }
    }

    #[test]
    fn descendants_are_found() {
        let cap = Capture {
            own_group: true,
            ..Capture::default()
        };
        let mut r = Running::spawn(bash("sleep 30 | cat; true"), cap).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while descendants(r.pid()).len() < 2 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(descendants(r.pid()).len(), 2);
        assert!(r.is_running());
        let c = r.kill().unwrap();
        assert_eq!(c.status.signal(), Some(9));
    }
}
