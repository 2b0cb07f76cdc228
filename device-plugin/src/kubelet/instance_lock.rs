//! One serving instance per pool and node: an exclusive `flock` next to the pool's socket.
//!
//! Binding a pool's socket removes whatever socket had that name, so two plugin instances with
//! the same pool on one node (a DaemonSet rolling update with `maxSurge`, two DaemonSets with
//! the same resource names, a plugin started by hand for debugging) would take the socket
//! from each other and re-register in a loop. So a pool's runner first takes
//! `<socket dir>/.rdma-device-plugin/<socket name>.lock` with `flock(LOCK_EX | LOCK_NB)`. The
//! instance that holds it serves; another one stands by (logged once, `/ready` says
//! `standby`, metric `rdma_dp_standby`), tries the lock every
//! the runner's `STANDBY_POLL`, and so takes over within about that long of
//! the holder's exit: the kernel drops the lock when the holder's process ends, however it
//! ends.
//!
//! The lock lives in a subfolder because kubelet, when it starts, deletes the files in
//! `device-plugins/` (but not folders). If the lock file is deleted or replaced anyway, the
//! holder notices ([`InstanceLock::still_held`]) and re-takes the lock on the new file, or, if
//! another instance got that first, stops serving and stands by.

use std::{
    fs::{File, OpenOptions},
    io,
    path::{Path, PathBuf},
};

use nix::{
    errno::Errno,
    fcntl::{Flock, FlockArg},
};
use rdma_streams_common::file_id::{FileId, file_id, file_id_of};

/// The folder below the socket folder that holds the locks.
pub const LOCK_DIR: &str = ".rdma-device-plugin";

/// The lock file of the pool served on `socket_name` in `socket_dir`.
pub fn lock_path(socket_dir: &Path, socket_name: &str) -> PathBuf {
    socket_dir
        .join(LOCK_DIR)
        .join(format!("{socket_name}.lock"))
}

/// A held lock; dropping it releases it.
#[derive(Debug)]
pub struct InstanceLock {
    path: PathBuf,
    id: Option<FileId>,
    _lock: Flock<File>,
}

/// Takes the lock at `path` (creating the file and its folder) if no other instance holds it:
/// `Ok(None)` if one does.
pub fn try_lock(path: &Path) -> io::Result<Option<InstanceLock>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // A file deleted between our open and our flock would be locked in vain: check that the
    // path still names the file we locked, and try again if not.
    for _ in 0..3 {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        let opened = file_id_of(&file)?;
        let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((_, Errno::EWOULDBLOCK)) => return Ok(None),
            Err((_, errno)) => return Err(io::Error::from(errno)),
        };
        if file_id(path) == Some(opened) {
            return Ok(Some(InstanceLock {
                path: path.to_owned(),
                id: Some(opened),
                _lock: lock,
            }));
        }
    }
    Err(io::Error::other(format!(
        "{} keeps being replaced while it is locked",
        path.display()
    )))
}

/// True if a lock file in `lock_dir` is held by someone, this process included (another open of
/// a file this process has locked conflicts too). Unreadable folder: false.
pub fn any_held(lock_dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(lock_dir) else {
        return false;
    };
    entries.flatten().any(|entry| {
        entry.file_name().to_string_lossy().ends_with(".lock")
            && matches!(try_lock(&entry.path()), Ok(None))
    })
}

impl InstanceLock {
    /// True while the lock file at its path is still the one this lock holds.
    pub fn still_held(&self) -> bool {
        file_id(&self.path) == self.id
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_the_next_one_gets_it_when_it_goes() {
        let dir = tempfile::tempdir().unwrap();
        let path = lock_path(dir.path(), "rdma-streams.io_hca.sock");
        let first = try_lock(&path).unwrap().expect("free lock taken");
        assert!(first.still_held());
        assert!(try_lock(&path).unwrap().is_none(), "a second holder");
        drop(first);
        let second = try_lock(&path)
            .unwrap()
            .expect("taken after the holder went");
        assert!(second.still_held());
    }

    #[test]
    fn any_held_sees_a_held_lock_among_free_ones() {
        let dir = tempfile::tempdir().unwrap();
        let lock_dir = dir.path().join(LOCK_DIR);
        assert!(!any_held(&lock_dir), "no folder");
        let free = try_lock(&lock_path(dir.path(), "a.sock")).unwrap().unwrap();
        drop(free);
        assert!(!any_held(&lock_dir));
        let held = try_lock(&lock_path(dir.path(), "b.sock")).unwrap().unwrap();
        assert!(any_held(&lock_dir));
        drop(held);
        assert!(!any_held(&lock_dir));
    }

    #[test]
    fn a_deleted_lock_file_is_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let path = lock_path(dir.path(), "x.sock");
        let held = try_lock(&path).unwrap().unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(!held.still_held());
        // Someone else can now lock a new file at the path: the old holder must not serve on.
        let other = try_lock(&path).unwrap().expect("new file, new lock");
        assert!(other.still_held());
        assert!(!held.still_held());
    }

    #[test]
    fn a_lock_held_by_another_process_is_respected() {
        let dir = tempfile::tempdir().unwrap();
        let path = lock_path(dir.path(), "x.sock");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"").unwrap();
        // flock(1) holds the lock in another process until its stdin closes.
        let mut child = std::process::Command::new("flock")
            .arg("-x")
            .arg(&path)
            .arg("cat")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("flock(1) from util-linux");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while try_lock(&path).unwrap().is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "flock(1) never took it"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        drop(child.stdin.take());
        child.wait().unwrap();
        assert!(
            try_lock(&path).unwrap().is_some(),
            "free once the other process ended"
        );
    }
}
