//! Finding a network namespace and running code inside it.
//!
//! A network namespace is named by a path to its nsfs file: `/proc/<pid>/ns/net` (a process
//! in it, such as virt-handler, found with hostPID) or `/run/netns/<name>` (`ip netns`).
//! [`run_in`] runs a closure on a fresh thread that entered the namespace with `setns`
//! (`CLONE_NEWNET` affects the calling thread only); the thread ends with the closure, so
//! no thread of the gateway is ever left in a foreign namespace. Sockets created there stay
//! in that namespace after the thread is gone, and child processes spawned there (`nft`)
//! start in it.

use std::{
    fs::File,
    path::{Path, PathBuf},
    thread,
};

use nix::sched::{CloneFlags, setns};

/// Why entering a namespace failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetnsError {
    /// The locator could not name the namespace (virt-handler not running, ...).
    #[error("locating the network namespace: {0}")]
    Locate(String),
    /// The nsfs file could not be opened.
    #[error("opening {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `setns` failed (no CAP_SYS_ADMIN, not a network namespace file, ...).
    #[error("setns into {path}")]
    Enter {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    /// The worker thread could not start or panicked.
    #[error("namespace worker thread: {0}")]
    Thread(String),
}

/// Names the network namespace to capture in (virt-handler's), asked again at every
/// migration start because virt-handler may have restarted since.
pub trait NetnsLocator: Send + Sync + 'static {
    fn locate(&self) -> Result<PathBuf, NetnsError>;
}

/// A fixed path (`--capture-netns`).
#[derive(Debug, Clone)]
pub struct PathLocator(pub PathBuf);

impl NetnsLocator for PathLocator {
    fn locate(&self) -> Result<PathBuf, NetnsError> {
        if self.0.exists() {
            Ok(self.0.clone())
        } else {
            Err(NetnsError::Locate(format!(
                "{} does not exist",
                self.0.display()
            )))
        }
    }
}

/// No capture namespace configured: every source migration stays uncaptured (target role
/// only).
#[derive(Debug, Clone, Copy)]
pub struct NoNamespace;

impl NetnsLocator for NoNamespace {
    fn locate(&self) -> Result<PathBuf, NetnsError> {
        Err(NetnsError::Locate(
            "no capture namespace configured (--capture-netns)".into(),
        ))
    }
}

/// The network namespace of the process named `comm` (as in `/proc/<pid>/comm`, for
/// example `virt-handler`), found by scanning `proc_root` (the host's `/proc` with hostPID).
/// All matching processes must share one network namespace.
#[derive(Debug, Clone)]
pub struct ProcessLocator {
    pub comm: String,
    pub proc_root: PathBuf,
}

impl ProcessLocator {
    pub fn new(comm: impl Into<String>) -> ProcessLocator {
        ProcessLocator {
            comm: comm.into(),
            proc_root: PathBuf::from("/proc"),
        }
    }
}

impl NetnsLocator for ProcessLocator {
    fn locate(&self) -> Result<PathBuf, NetnsError> {
        let entries = std::fs::read_dir(&self.proc_root)
            .map_err(|e| NetnsError::Locate(format!("{}: {e}", self.proc_root.display())))?;
        let mut found: Option<(PathBuf, PathBuf)> = None;
        for entry in entries.flatten() {
            let name = entry.file_name();
            if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let dir = entry.path();
            let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
                continue;
            };
            if comm.trim_end() != self.comm {
                continue;
            }
            let ns = dir.join("ns/net");
            // Its identity (`net:[inode]`) tells processes of one namespace apart from two.
            let Ok(id) = std::fs::read_link(&ns) else {
                continue;
            };
            match &found {
                None => found = Some((ns, id)),
                Some((_, first)) if *first == id => {}
                Some((first, _)) => {
                    return Err(NetnsError::Locate(format!(
                        "processes named {:?} in different network namespaces ({} and {})",
                        self.comm,
                        first.display(),
                        ns.display()
                    )));
                }
            }
        }
        found
            .map(|(ns, _)| ns)
            .ok_or_else(|| NetnsError::Locate(format!("no process named {:?} found", self.comm)))
    }
}

/// Runs `f` on a new thread inside the network namespace at `path` and returns its result.
pub fn run_in<T, F>(path: &Path, f: F) -> Result<T, NetnsError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let file = File::open(path).map_err(|source| NetnsError::Open {
        path: path.to_owned(),
        source,
    })?;
    let owned = path.to_owned();
    let worker = thread::Builder::new()
        .name("gw-netns".into())
        .spawn(move || {
            setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
                path: owned,
                source,
            })?;
            Ok(f())
        })
        .map_err(|e| NetnsError::Thread(e.to_string()))?;
    worker
        .join()
        .map_err(|_| NetnsError::Thread("panicked".into()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_in_own_namespace() {
        let got = run_in(Path::new("/proc/self/ns/net"), || 7).unwrap();
        assert_eq!(got, 7);
    }

    #[test]
    fn finds_a_process_by_name() {
        let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
        let ns = ProcessLocator::new(comm.trim_end()).locate().unwrap();
        let id = std::fs::read_link(&ns).unwrap();
        assert_eq!(id, std::fs::read_link("/proc/self/ns/net").unwrap());
        assert!(ProcessLocator::new("no-such-process-xyz").locate().is_err());
    }

    #[test]
    fn missing_path_is_an_error() {
        assert!(matches!(
            run_in(Path::new("/nonexistent/ns"), || ()),
            Err(NetnsError::Open { .. })
        ));
        assert!(PathLocator("/nonexistent/ns".into()).locate().is_err());
    }
}
