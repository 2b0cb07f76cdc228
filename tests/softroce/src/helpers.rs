//! Helpers for scenarios: shell scripts with a timeout in their own process group, the
//! resources a process holds (fds, threads, pinned memory), waiting for a TCP port, file
//! digests, and rxe's packet counters.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub use crate::process::{Capture, Captured, Running};

fn bash_command(script: &str) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(script);
    cmd
}

/// Runs `script` with `bash -c` in its own process group and waits for it, at most `timeout`
/// (then the group and every descendant are killed; leftovers of the group are killed when the
/// script ends, too).
pub fn bash(script: &str, timeout: Duration) -> io::Result<Captured> {
    spawn_bash(script)?.wait_timeout(timeout)
}

/// Starts `script` with `bash -c` in its own process group, collecting its output; wait for it
/// with [`Running::wait_timeout`], or drop it to kill it.
pub fn spawn_bash(script: &str) -> io::Result<Running> {
    Running::spawn(
        bash_command(script),
        Capture {
            own_group: true,
            ..Capture::default()
        },
    )
}

/// What a process holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcStats {
    /// Open file descriptors (entries of `/proc/PID/fd`).
    pub fds: usize,
    /// Threads (`Threads:` of `/proc/PID/status`).
    pub threads: usize,
    /// Pinned memory in KiB (`VmPin:`: what RDMA memory registration pins).
    pub vm_pin_kib: u64,
    /// Locked memory in KiB (`VmLck:`).
    pub vm_lck_kib: u64,
}

/// The fds, threads and pinned memory of process `pid`.
pub fn proc_stats(pid: u32) -> io::Result<ProcStats> {
    let fds = fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok(ProcStats {
        fds,
        threads: usize::try_from(field("Threads:")).unwrap_or(usize::MAX),
        vm_pin_kib: field("VmPin:"),
        vm_lck_kib: field("VmLck:"),
    })
}

/// Waits until a TCP connect to `addr` succeeds, at most `timeout`.
pub fn wait_for_port(addr: SocketAddr, timeout: Duration) -> io::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(
            &addr,
            left.clamp(Duration::from_millis(10), Duration::from_secs(1)),
        ) {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{addr} did not accept within {timeout:?}: {e}"),
                ));
            }
            Err(_) => thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The SHA-256 of a file, in lowercase hex.
pub fn sha256_file(path: impl AsRef<Path>) -> io::Result<String> {
    let mut file = fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = io::Read::read(&mut file, &mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// The hardware counters of an RDMA device's port 1 (`/sys/class/infiniband/DEV/ports/1/
/// hw_counters/`; for rxe: `sent_pkts`, `rcvd_pkts`, `rdma_sends`, `rdma_recvs`, ...).
pub fn rdma_counters(device: &str) -> io::Result<BTreeMap<String, u64>> {
    let dir = format!("/sys/class/infiniband/{device}/ports/1/hw_counters");
    let mut out = BTreeMap::new();
    for e in fs::read_dir(dir)? {
        let e = e?;
        if let Ok(v) = fs::read_to_string(e.path())
            && let Ok(v) = v.trim().parse()
        {
            out.insert(e.file_name().to_string_lossy().into_owned(), v);
        }
    }
    Ok(out)
}

/// The RDMA devices present (`/sys/class/infiniband`).
pub fn rdma_devices() -> Vec<String> {
    let mut devs: Vec<String> = fs::read_dir("/sys/class/infiniband")
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    devs.sort();
    devs
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, TcpListener};

    #[test]
    fn bash_captures_and_times_out() {
        let c = bash("echo hi; exit 4", Duration::from_secs(20)).unwrap();
        assert_eq!((c.stdout.as_str(), c.status.code()), ("hi\n", Some(4)));
        let err = c.check("the script").unwrap_err().to_string();
        assert!(err.contains("exit 4") && err.contains("hi"), "{err}");
        let started = Instant::now();
        let c = bash("sleep 100 & sleep 100", Duration::from_millis(300)).unwrap();
        assert!(c.timed_out);
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn leftovers_of_the_group_do_not_hold_the_script() {
        let started = Instant::now();
        let c = bash("sleep 100 & echo started", Duration::from_secs(30)).unwrap();
        assert!(c.success(), "{c}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn stats_of_a_process() {
        let s = proc_stats(std::process::id()).unwrap();
        assert!(s.fds >= 3 && s.threads >= 1, "{s:?}");
        let r = spawn_bash("exec sleep 30").unwrap();
        let s = proc_stats(r.pid()).unwrap();
        assert_eq!(s.threads, 1);
        assert_eq!(s.vm_pin_kib, 0);
    }

    #[test]
    fn port_wait_and_digest() {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        wait_for_port(l.local_addr().unwrap(), Duration::from_secs(5)).unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let err = wait_for_port(
            (Ipv4Addr::LOCALHOST, port).into(),
            Duration::from_millis(200),
        );
        assert!(err.is_err());
        let f = tempfile::NamedTempFile::new().unwrap();
        fs::write(f.path(), b"abc").unwrap();
        assert_eq!(
            sha256_file(f.path()).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
