//! Booting guests with vng: [`run`] one, [`run_pair`] two joined by a wire. Each run gets a
//! host work directory under `<target>/softroce/runs/`, shared read-write with the guest at the
//! same path (`vng --rwdir`): the init script, `guest.env`, and what the guest leaves behind
//! (`status`, `stdout`, `stderr`) are in `<run dir>/<guest name>/`, with `console.log`.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::Error;
use crate::accel::{Accel, accel};
use crate::locate::{Tools, state_dir, tools, vng_command};
use crate::process::{describe, kill_tree};
use crate::spec::{GuestSpec, Net, WireRole, free_port};

/// The guest's init script (`tests/softroce/guest/init.sh`), copied into every run.
pub const INIT_SH: &str = include_str!("../guest/init.sh");

/// Receives every console line of a guest as it arrives: (guest name, line).
pub type Sink<'a> = &'a (dyn Fn(&str, &str) + Sync);

/// vng options of every guest: the root and the work directory over 9p (vng would first try
/// virtiofsd, which fails here after about 3 s per share: "fuse: invalid argument"), and
/// udev's coldplug does not load modules the guests never use (kvm alone took 8 s to load
/// under TCG; the boot to the init script went from about 33 s to 19 s of guest time).
pub const VNG_OPTIONS: &[&str] = &[
    "--force-9p",
    "--append",
    "modprobe.blacklist=kvm,kvm_amd,kvm_intel,sr_mod,cdrom,psmouse,ccp,i2c_i801,lpc_ich,\
     iTCO_wdt,evdev,serio_raw",
];

/// More kernel command-line options for every guest (`SOFTROCE_APPEND`, for experiments: for
/// example `idle=poll`, so that an idle vCPU spins instead of halting and a wake-up costs no
/// QEMU kick; benchmarks.md says what that changes).
pub const APPEND_VAR: &str = "SOFTROCE_APPEND";

/// The `--append` options [`APPEND_VAR`] asks for: none when unset or blank.
fn extra_append() -> Vec<String> {
    match std::env::var(APPEND_VAR) {
        Ok(v) if !v.trim().is_empty() => vec!["--append".into(), v.trim().to_owned()],
        _ => Vec::new(),
    }
}

/// After one guest of a pair has finished, the other gets this long before it is killed.
pub const PEER_GRACE: Duration = Duration::from_secs(120);

/// What a guest run produced.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The guest's name.
    pub name: String,
    /// The command's exit status, from the status file the init script writes; `None` when it
    /// never finished (timeout, crash) or setup failed.
    pub exit: Option<i32>,
    /// The init script's failing setup step, when setup failed (the command did not run).
    pub setup_failed: Option<String>,
    /// The run passed its timeout and QEMU was killed.
    pub timed_out: bool,
    /// The command's standard output.
    pub stdout: String,
    /// The command's standard error.
    pub stderr: String,
    /// Everything the guest printed: kernel console, init script, and the command's output.
    pub console: String,
    /// How vng (QEMU) ended.
    pub vng_status: ExitStatus,
    /// The accelerator used.
    pub accel: Accel,
    /// From starting vng to its end.
    pub elapsed: Duration,
    /// From starting vng to the init script's first line (the boot time).
    pub boot: Option<Duration>,
    /// From starting vng to the topology being ready (the command starting).
    pub ready: Option<Duration>,
    /// This guest's own directory: `init.sh`, `guest.env`, `status`, `stdout`, `stderr`,
    /// `console.log`, and whatever the command wrote there.
    pub work_dir: PathBuf,
    /// The run's directory, shared by both guests of a pair (`SOFTROCE_WORK` inside).
    pub shared_dir: PathBuf,
}

impl Outcome {
    /// The command ran and exited 0 in time.
    pub fn success(&self) -> bool {
        self.exit == Some(0) && !self.timed_out
    }

    /// The last `n` lines of the console log.
    pub fn console_tail(&self, n: usize) -> String {
        tail(&self.console, n)
    }

    /// One line: how the run ended and how long it took.
    pub fn summary(&self) -> String {
        let end = if let Some(step) = &self.setup_failed {
            format!("setup failed at `{step}`")
        } else if self.timed_out {
            format!("timed out after {:.1} s", self.elapsed.as_secs_f64())
        } else if let Some(code) = self.exit {
            format!("command exit {code}")
        } else {
            format!(
                "the command never finished (vng {})",
                describe(self.vng_status)
            )
        };
        let secs =
            |d: Option<Duration>| d.map_or("-".into(), |d| format!("{:.1} s", d.as_secs_f64()));
        format!(
            "guest {} ({}): {end}; booted in {}, ready in {}, total {:.1} s",
            self.name,
            self.accel,
            secs(self.boot),
            secs(self.ready),
            self.elapsed.as_secs_f64()
        )
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Boots one guest and runs `spec.command` in it.
pub fn run(spec: &GuestSpec) -> Result<Outcome, Error> {
    run_with(spec, &|_, _| {})
}

/// [`run`], handing every console line to `sink` as it arrives.
pub fn run_with(spec: &GuestSpec, sink: Sink<'_>) -> Result<Outcome, Error> {
    spec.validate()?;
    let tools = tools()?;
    let accel = accel(&tools)?;
    let dir = new_run_dir(&spec.name)?;
    boot(&tools, accel, spec, &dir, sink, None)
}

/// Boots two guests joined by a QEMU socket netdev (`a` must be [`Net::Wire`] role A, `b`
/// role B; port 0 on both: a free port is picked) and returns both outcomes. A's QEMU is
/// started first and B's once A listens. When one guest has ended, the other is killed after
/// [`PEER_GRACE`] unless it ends by itself.
pub fn run_pair(a: &GuestSpec, b: &GuestSpec) -> Result<(Outcome, Outcome), Error> {
    run_pair_with(a, b, &|_, _| {})
}

/// [`run_pair`], handing every console line of both guests to `sink` as it arrives.
pub fn run_pair_with(
    a: &GuestSpec,
    b: &GuestSpec,
    sink: Sink<'_>,
) -> Result<(Outcome, Outcome), Error> {
    a.validate()?;
    b.validate()?;
    let port = match (a.net, b.net) {
        (
            Net::Wire {
                role: WireRole::A,
                port: pa,
            },
            Net::Wire {
                role: WireRole::B,
                port: pb,
            },
        ) if pa == pb => pa,
        _ => {
            return Err(Error::Invalid(format!(
                "run_pair: {} must be Net::Wire role A and {} role B, with the same port",
                a.name, b.name
            )));
        }
    };
    if a.name == b.name {
        return Err(Error::Invalid(format!(
            "run_pair: both guests are named {:?}",
            a.name
        )));
    }
    let port = if port == 0 {
        free_port().map_err(|e| Error::io("picking a free port", e))?
    } else {
        port
    };
    let (mut a, mut b) = (a.clone(), b.clone());
    a.net = Net::Wire {
        role: WireRole::A,
        port,
    };
    b.net = Net::Wire {
        role: WireRole::B,
        port,
    };
    let tools = tools()?;
    let accel = accel(&tools)?;
    let dir = new_run_dir(&format!("{}+{}", a.name, b.name))?;
    let (a_done, b_done) = (AtomicBool::new(false), AtomicBool::new(false));
    thread::scope(|s| {
        let ha = s.spawn(|| {
            let r = boot(&tools, accel, &a, &dir, sink, Some(&b_done));
            a_done.store(true, Ordering::SeqCst);
            r
        });
        // B's QEMU connects once, at start, and neither retries nor fails when nothing
        // listens: wait until A's QEMU listens.
        let deadline = Instant::now() + Duration::from_secs(120);
        while !listening(port) && !ha.is_finished() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(100));
        }
        let hb = s.spawn(|| {
            let r = boot(&tools, accel, &b, &dir, sink, Some(&a_done));
            b_done.store(true, Ordering::SeqCst);
            r
        });
        let ra = ha.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        let rb = hb.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        Ok((ra?, rb?))
    })
}

/// A listening TCP socket on 127.0.0.1:`port` exists (from `/proc/net/tcp`; connecting to
/// check would take QEMU's one connection).
fn listening(port: u16) -> bool {
    let want = format!("0100007F:{port:04X}");
    fs::read_to_string("/proc/net/tcp").is_ok_and(|t| {
        t.lines().skip(1).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1] == want && f[3] == "0A"
        })
    })
}

/// Run directories older than this are removed when a new run starts (no run lasts that long).
pub const KEEP_RUNS_FOR: Duration = Duration::from_secs(3 * 24 * 3600);

fn prune(runs: &Path, age: Duration) {
    let Ok(entries) = fs::read_dir(runs) else {
        return;
    };
    for e in entries.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|elapsed| elapsed > age);
        if old {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// A new directory `<target>/softroce/runs/<prefix>-<time>-<random>`, kept after the run (the
/// caller removes it; directories older than [`KEEP_RUNS_FOR`] are removed here).
pub fn new_run_dir(prefix: &str) -> Result<PathBuf, Error> {
    let runs = state_dir().join("runs");
    fs::create_dir_all(&runs).map_err(|e| Error::io(format!("creating {}", runs.display()), e))?;
    prune(&runs, KEEP_RUNS_FOR);
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let dir = tempfile::Builder::new()
        .prefix(&format!("{prefix}-{secs}-"))
        .tempdir_in(&runs)
        .map_err(|e| Error::io(format!("creating a run directory in {}", runs.display()), e))?
        .keep();
    // vng passes the path on QEMU's command line (-fsdev path=...) and the kernel's.
    let text = dir.to_string_lossy();
    if !text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+".contains(c))
    {
        let _ = fs::remove_dir(&dir);
        return Err(Error::Invalid(format!(
            "the run directory {text} has characters vng cannot pass to QEMU; set \
             CARGO_TARGET_DIR to a plain path"
        )));
    }
    Ok(dir)
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The `guest.env` the init script sources.
pub fn guest_env(spec: &GuestSpec, shared: &Path, own: &Path) -> String {
    let mut env = format!(
        "SOFTROCE_ROLE={}\nSOFTROCE_WORK={}\nSOFTROCE_OUT={}\n",
        spec.net.role_str(),
        shell_quote(&shared.to_string_lossy()),
        shell_quote(&own.to_string_lossy())
    );
    if let Ok(mtu) = std::env::var("SOFTROCE_MTU") {
        env.push_str(&format!("SOFTROCE_MTU={}\n", shell_quote(&mtu)));
    }
    for (k, v) in &spec.env {
        env.push_str(&format!("export {k}={}\n", shell_quote(v)));
    }
    let argv: Vec<String> = spec.command.iter().map(|a| shell_quote(a)).collect();
    env.push_str(&format!("SOFTROCE_CMD=({})\n", argv.join(" ")));
    env
}

fn boot(
    tools: &Tools,
    accel: Accel,
    spec: &GuestSpec,
    shared: &Path,
    sink: Sink<'_>,
    peer_done: Option<&AtomicBool>,
) -> Result<Outcome, Error> {
    let own = shared.join(&spec.name);
    fs::create_dir_all(&own).map_err(|e| Error::io(format!("creating {}", own.display()), e))?;
    let init = own.join("init.sh");
    fs::write(&init, INIT_SH)
        .and_then(|()| fs::write(own.join("guest.env"), guest_env(spec, shared, &own)))
        .map_err(|e| Error::io(format!("writing {}", own.display()), e))?;
    let mut cmd = vng_command(&tools.vng);
    cmd.arg("--verbose")
        .args(VNG_OPTIONS)
        .args(extra_append())
        .args(accel.vng_args())
        .arg("--run")
        .arg(&tools.kernel.image)
        .arg("--memory")
        .arg(&spec.memory)
        .arg("--cpus")
        .arg(spec.cpus.to_string())
        .arg("--name")
        .arg(format!("softroce-{}", spec.name))
        .arg(format!("--rwdir={}", shared.display()))
        .arg("--exec")
        .arg(format!("bash {} --work {}", init.display(), own.display()))
        .current_dir(&own);
    if let Some(opts) = spec.net.qemu_opts() {
        cmd.arg(format!("--qemu-opts={opts}"));
    }
    let console_path = own.join("console.log");
    let launched = launch(
        cmd,
        &spec.name,
        spec.timeout,
        &console_path,
        sink,
        peer_done,
    )?;
    let console = fs::read_to_string(&console_path).unwrap_or_default();
    let mark = |name: &str| {
        launched
            .marks
            .iter()
            .find(|(m, _)| m == name)
            .map(|(_, d)| *d)
    };
    let boot = mark("INIT-START");
    if boot.is_none() {
        let reason = if launched.timed_out {
            format!(
                "the init script did not start within {:.0} s",
                spec.timeout.as_secs_f64()
            )
        } else {
            format!(
                "vng ended ({}) before the init script started",
                describe(launched.status)
            )
        };
        return Err(Error::Boot {
            name: spec.name.clone(),
            reason: format!(
                "{reason}; the console's last lines:\n{}",
                tail(&console, 25)
            ),
            console: console_path,
        });
    }
    let status = fs::read_to_string(own.join("status")).unwrap_or_default();
    let status = status.trim();
    let (exit, setup_failed) = if let Some(code) = status.strip_prefix("exit ") {
        (code.parse().ok(), None)
    } else if let Some(step) = status.strip_prefix("setup-failed ") {
        (None, Some(step.to_string()))
    } else {
        (None, None)
    };
    Ok(Outcome {
        name: spec.name.clone(),
        exit,
        setup_failed,
        timed_out: launched.timed_out,
        stdout: fs::read_to_string(own.join("stdout")).unwrap_or_default(),
        stderr: fs::read_to_string(own.join("stderr")).unwrap_or_default(),
        console,
        vng_status: launched.status,
        accel,
        elapsed: launched.elapsed,
        boot,
        ready: mark("SETUP-DONE"),
        work_dir: own,
        shared_dir: shared.to_path_buf(),
    })
}

/// How a vng process ended.
#[derive(Debug)]
pub(crate) struct Launched {
    pub status: ExitStatus,
    pub timed_out: bool,
    pub elapsed: Duration,
    /// `SOFTROCE-MARK <name>` lines of the init script, with when they were seen.
    pub marks: Vec<(String, Duration)>,
}

/// Runs `cmd` (vng) with its stdout and stderr (console) written line by line to `console` and
/// `sink`, killing it and all its descendants after `timeout`, or [`PEER_GRACE`] after
/// `peer_done` turns true. vng stays in our process group, so a Ctrl-C reaches QEMU too.
pub(crate) fn launch(
    mut cmd: Command,
    name: &str,
    timeout: Duration,
    console: &Path,
    sink: Sink<'_>,
    peer_done: Option<&AtomicBool>,
) -> Result<Launched, Error> {
    let mut log = File::create(console)
        .map_err(|e| Error::io(format!("creating {}", console.display()), e))?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::io(format!("starting {:?}", cmd.get_program()), e))?;
    let (tx, rx) = mpsc::channel::<String>();
    let mut readers = Vec::new();
    let pipes: [Option<Box<dyn std::io::Read + Send>>; 2] = [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    ];
    for pipe in pipes.into_iter().flatten() {
        let tx = tx.clone();
        readers.push(thread::spawn(move || {
            let mut reader = BufReader::new(pipe);
            let mut buf = Vec::new();
            while reader.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
                let line = String::from_utf8_lossy(&buf);
                let line = line.trim_end_matches(['\n', '\r']).replace('\r', "");
                if tx.send(line).is_err() {
                    break;
                }
                buf.clear();
            }
        }));
    }
    drop(tx);
    let mut deadline = started + timeout;
    let mut peer_seen = false;
    let mut timed_out = false;
    let mut marks = Vec::new();
    let mut closed = false;
    let mut exited = None;
    loop {
        if let Some(done) = peer_done
            && !peer_seen
            && done.load(Ordering::SeqCst)
        {
            peer_seen = true;
            deadline = deadline.min(Instant::now() + PEER_GRACE);
        }
        let now = Instant::now();
        if now >= deadline && !timed_out {
            timed_out = true;
            let _ = writeln!(
                log,
                "softroce: {name}: killing vng and QEMU after {:.0} s",
                started.elapsed().as_secs_f64()
            );
            kill_tree(child.id(), false);
            // Whatever still holds the pipes gets a few seconds to close them.
            deadline = now + Duration::from_secs(10);
        } else if now >= deadline {
            break;
        }
        if closed {
            if exited.is_none() {
                exited = child.try_wait().ok().flatten();
            }
            if exited.is_some() {
                break;
            }
            thread::sleep(Duration::from_millis(50));
            continue;
        }
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(250));
        match rx.recv_timeout(wait) {
            Ok(line) => {
                if let Some(rest) = line.strip_prefix("SOFTROCE-MARK ") {
                    let mark = rest
                        .split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_string();
                    if !marks.iter().any(|(m, _)| *m == mark) {
                        marks.push((mark, started.elapsed()));
                    }
                }
                let _ = writeln!(log, "{line}");
                sink(name, &line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => closed = true,
        }
    }
    let status = match exited {
        Some(s) => s,
        None => {
            kill_tree(child.id(), false);
            child
                .wait()
                .map_err(|e| Error::io(format!("waiting for vng of {name}"), e))?
        }
    };
    // Readers end when the pipes close; a reader stuck on a pipe some stray process holds is
    // left behind rather than waited for.
    for r in readers {
        if r.is_finished() {
            let _ = r.join();
        }
    }
    Ok(Launched {
        status,
        timed_out,
        elapsed: started.elapsed(),
        marks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_env_quotes_everything() {
        let spec = GuestSpec::new("g1", ["/bin/echo", "it's", "a b"])
            .env("X", "1 2")
            .net(Net::Wire {
                role: WireRole::B,
                port: 5,
            });
        let env = guest_env(&spec, Path::new("/w"), Path::new("/w/g1"));
        assert!(env.contains("SOFTROCE_ROLE=b\n"), "{env}");
        assert!(env.contains("SOFTROCE_OUT='/w/g1'\n"), "{env}");
        assert!(env.contains("export X='1 2'\n"), "{env}");
        assert!(
            env.contains(r"SOFTROCE_CMD=('/bin/echo' 'it'\''s' 'a b')"),
            "{env}"
        );
    }

    #[test]
    fn guest_env_runs_in_bash() {
        let spec = GuestSpec::new("g1", ["printf", "%s|", "it's", "a b"]).env("X", "$HOME `x`");
        let env = guest_env(&spec, Path::new("/w"), Path::new("/w/g1"));
        let script = format!("{env}\nprintf '%s|' \"$X\"; \"${{SOFTROCE_CMD[@]}}\"");
        let out = Command::new("bash").arg("-c").arg(script).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "$HOME `x`|it's|a b|");
    }

    #[test]
    fn launch_streams_lines_marks_and_kills_on_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("console.log");
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg("echo 'SOFTROCE-MARK INIT-START uptime=1'; echo err >&2; sleep 300");
        let lines = std::sync::Mutex::new(Vec::new());
        let sink = |n: &str, l: &str| lines.lock().unwrap().push(format!("{n}:{l}"));
        let l = launch(cmd, "t", Duration::from_secs(1), &log, &sink, None).unwrap();
        assert!(l.timed_out);
        assert!(l.elapsed < Duration::from_secs(20));
        assert_eq!(l.marks.len(), 1);
        let lines = lines.lock().unwrap();
        assert!(lines.contains(&"t:err".to_string()), "{lines:?}");
        let text = fs::read_to_string(&log).unwrap();
        assert!(text.contains("killing vng"), "{text}");
    }

    #[test]
    fn vng_options_are_single_words() {
        let blacklist = VNG_OPTIONS[2];
        assert!(blacklist.starts_with("modprobe.blacklist=kvm,"));
        assert!(!blacklist.contains(char::is_whitespace), "{blacklist}");
    }

    #[test]
    fn qemu_options_of_a_wire() {
        let a = Net::Wire {
            role: WireRole::A,
            port: 4000,
        };
        assert_eq!(
            a.qemu_opts().unwrap(),
            "-netdev socket,id=n0,listen=127.0.0.1:4000 -device virtio-net-pci,netdev=n0,mac=52:54:00:00:00:01"
        );
        assert!(Net::Loop.qemu_opts().is_none());
    }
}
