//! KVM or TCG: `SOFTROCE_ACCEL` forces one; otherwise one probe boot decides and its result
//! is cached in `<target>/softroce/accel-<kernel release>` (re-probed when the host kernel
//! changes), so a test run pays the probe at most once.

use std::env;
use std::fmt;
use std::fs::{self, OpenOptions};
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::Error;
use crate::guest::launch;
use crate::locate::{Tools, state_dir, vng_command};

/// How QEMU runs the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualization (a boot takes a few seconds).
    Kvm,
    /// QEMU's emulator, `vng --disable-kvm` (about 25-40 s to boot on the development machines).
    Tcg,
}

impl Accel {
    /// "kvm" or "tcg".
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }

    /// A generous bound on boot plus topology setup, added to the commands' own timeouts.
    pub fn boot_allowance(self) -> Duration {
        match self {
            Accel::Kvm => Duration::from_secs(120),
            Accel::Tcg => Duration::from_secs(300),
        }
    }

    pub(crate) fn vng_args(self) -> &'static [&'static str] {
        match self {
            Accel::Kvm => &[],
            Accel::Tcg => &["--disable-kvm"],
        }
    }
}

impl fmt::Display for Accel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How long the KVM probe may take before TCG is chosen.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(30);
const PROBE_MARKER: &str = "SOFTROCE-KVM-OK";

/// The accelerator for `tools.kernel`: `SOFTROCE_ACCEL=kvm|tcg`, else the cached probe result,
/// else a probe ([`probe_kvm`]) whose result is cached.
pub fn accel(tools: &Tools) -> Result<Accel, Error> {
    choose(tools).map(|(accel, _)| accel)
}

/// [`accel`], with why it was chosen.
pub fn choose(tools: &Tools) -> Result<(Accel, String), Error> {
    match env::var("SOFTROCE_ACCEL").unwrap_or_default().as_str() {
        "kvm" => return Ok((Accel::Kvm, "SOFTROCE_ACCEL=kvm".into())),
        "tcg" => return Ok((Accel::Tcg, "SOFTROCE_ACCEL=tcg".into())),
        "" => {}
        other => {
            return Err(Error::Invalid(format!(
                "SOFTROCE_ACCEL={other}: expected kvm or tcg"
            )));
        }
    }
    let host = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let host = host.trim();
    let cache = state_dir().join(format!("accel-{}", tools.kernel.version));
    if let Ok(text) = fs::read_to_string(&cache) {
        let mut lines = text.lines();
        let accel = match lines.next() {
            Some("kvm") => Some(Accel::Kvm),
            Some("tcg") => Some(Accel::Tcg),
            _ => None,
        };
        if let Some(accel) = accel
            && lines.next() == Some(&format!("host {host}"))
        {
            let why = lines.next().unwrap_or_default();
            return Ok((accel, format!("cached in {}: {why}", cache.display())));
        }
    }
    let (accel, why) = probe_kvm(tools)?;
    let dir = state_dir();
    fs::create_dir_all(&dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let tmp = cache.with_extension("tmp");
    fs::write(&tmp, format!("{accel}\nhost {host}\n{why}\n"))
        .and_then(|()| fs::rename(&tmp, &cache))
        .map_err(|e| Error::io(format!("writing {}", cache.display()), e))?;
    Ok((accel, why))
}

/// Boots a trivial guest with KVM (bounded by [`PROBE_TIMEOUT`]) when `/dev/kvm` opens
/// read-write; KVM if it printed its marker, else TCG. Returns the choice and why. Nested KVM
/// on the development machines either hangs after "Probing EDD" or QEMU aborts on an MSR.
pub fn probe_kvm(tools: &Tools) -> Result<(Accel, String), Error> {
    if let Err(e) = OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        return Ok((Accel::Tcg, format!("/dev/kvm: {e}")));
    }
    let dir = state_dir();
    fs::create_dir_all(&dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let log = dir.join(format!("accel-probe-{}.log", tools.kernel.version));
    // A vng that cannot even assemble QEMU's command line says nothing about KVM.
    let dry = vng_command(&tools.vng)
        .args(["--dry-run", "--run"])
        .arg(&tools.kernel.image)
        .args(["--exec", "true"])
        .current_dir(Path::new("/"))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::io(format!("running {}", tools.vng.display()), e))?;
    if !dry.status.success() {
        return Err(Error::Invalid(format!(
            "`{} --dry-run` fails ({}): {}{}",
            tools.vng.display(),
            crate::process::describe(dry.status),
            String::from_utf8_lossy(&dry.stdout),
            String::from_utf8_lossy(&dry.stderr)
        )));
    }
    let mut cmd = vng_command(&tools.vng);
    cmd.arg("--verbose")
        .args(crate::guest::VNG_OPTIONS)
        .arg("--run")
        .arg(&tools.kernel.image)
        .args(["--memory", "1G", "--cpus", "1", "--exec"])
        .arg(format!("echo {PROBE_MARKER}"))
        .current_dir(Path::new("/"));
    let seen = AtomicBool::new(false);
    let sink = |_: &str, line: &str| {
        if line.trim() == PROBE_MARKER {
            seen.store(true, Ordering::SeqCst);
        }
    };
    let launched = launch(cmd, "kvm-probe", PROBE_TIMEOUT, &log, &sink, None)?;
    Ok(if seen.load(Ordering::SeqCst) {
        (
            Accel::Kvm,
            format!(
                "a KVM guest booted in {:.1} s",
                launched.elapsed.as_secs_f64()
            ),
        )
    } else if launched.timed_out {
        (
            Accel::Tcg,
            format!(
                "a KVM guest did not finish booting within {} s (log: {})",
                PROBE_TIMEOUT.as_secs(),
                log.display()
            ),
        )
    } else {
        (
            Accel::Tcg,
            format!(
                "a KVM guest failed ({}; log: {})",
                crate::process::describe(launched.status),
                log.display()
            ),
        )
    })
}
