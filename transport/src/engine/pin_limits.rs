//! How much memory a process's engine may pin ([`super::Budget`]'s limit), always bounded:
//!
//! - `RLIMIT_MEMLOCK` (soft), less what the process pinned already, when it binds the process
//!   (a finite limit and no `CAP_IPC_LOCK`): past it the kernel would refuse the registration;
//! - and, whatever the memlock limit and the capabilities say, a share ([`MEMORY_SHARE`]) of
//!   the memory the process may use: its cgroup's memory limit (the smallest on its path; v2
//!   `memory.max`, v1 `memory.limit_in_bytes`), or the machine's memory when there is none.
//!   Pinned pages count against the cgroup and cannot be reclaimed, so without this share a
//!   process with `CAP_IPC_LOCK` (which the injector adds) or an unlimited memlock limit could
//!   be made to pin memory until its pod is OOM-killed, by connect requests alone.

use std::path::Path;

/// The engine pins at most 1 / `MEMORY_SHARE` of the memory the process may use.
pub const MEMORY_SHARE: u64 = 4;
/// The budget when nothing about the process's memory can be read.
pub const UNKNOWN_MEMORY_BUDGET: u64 = 1 << 30;
/// A cgroup limit at or above this means none (v1 writes "unlimited" as about 2^63).
const NO_LIMIT: u64 = 1 << 62;
/// `CAP_IPC_LOCK`'s bit in the capability sets.
const CAP_IPC_LOCK: u32 = 14;

/// What bounds a process's pinned memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinLimits {
    /// `RLIMIT_MEMLOCK`'s soft limit (None: unlimited).
    pub memlock: Option<u64>,
    /// `CAP_IPC_LOCK` is in the effective set: the kernel does not apply `memlock`.
    pub can_lock_any: bool,
    /// Bytes the process pinned already (`VmPin`).
    pub pinned: u64,
    /// The memory the process may use (its cgroup's limit, else the machine's; None: unknown).
    pub memory: Option<u64>,
}

impl PinLimits {
    /// This process's, read from `/proc` and `/sys/fs/cgroup`.
    pub fn of_this_process() -> PinLimits {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        PinLimits {
            memlock: memlock_soft_limit(),
            can_lock_any: has_cap_ipc_lock(&status),
            pinned: status_kib(&status, "VmPin:").unwrap_or(0),
            memory: memory_limit(&cgroup, Path::new("/sys/fs/cgroup"), &meminfo),
        }
    }

    /// Whether the memlock limit binds (finite, no `CAP_IPC_LOCK`).
    pub fn memlock_binds(&self) -> bool {
        self.memlock.is_some() && !self.can_lock_any
    }

    /// The engine's pinned-memory budget (see the module docs): never unlimited.
    pub fn budget(&self) -> u64 {
        let share = self
            .memory
            .map_or(UNKNOWN_MEMORY_BUDGET, |m| m / MEMORY_SHARE)
            .saturating_sub(self.pinned);
        match self.memlock {
            Some(limit) if !self.can_lock_any => share.min(limit.saturating_sub(self.pinned)),
            _ => share,
        }
    }
}

fn memlock_soft_limit() -> Option<u64> {
    let (soft, _) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK).ok()?;
    (soft != nix::sys::resource::RLIM_INFINITY).then_some(soft)
}

/// `CAP_IPC_LOCK` in `CapEff` of a `/proc/<pid>/status` text.
pub fn has_cap_ipc_lock(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// A `<key> <n> kB` line of `/proc/<pid>/status` or `/proc/meminfo`, in bytes.
fn status_kib(text: &str, key: &str) -> Option<u64> {
    let kb = text
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    kb.checked_mul(1024)
}

/// The memory a process may use: the smallest cgroup memory limit on its path (`cgroup`: its
/// `/proc/self/cgroup`; `root`: where the cgroup file systems are mounted), else the machine's
/// `MemTotal` (`meminfo`); None when neither says.
pub fn memory_limit(cgroup: &str, root: &Path, meminfo: &str) -> Option<u64> {
    let limited = cgroup
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let path = path.trim_start_matches('/');
            if controllers.is_empty() {
                smallest_on_path(&root.join(path), root, "memory.max")
            } else if controllers.split(',').any(|c| c == "memory") {
                let base = root.join("memory");
                smallest_on_path(&base.join(path), &base, "memory.limit_in_bytes")
            } else {
                None
            }
        })
        .min();
    limited.or_else(|| status_kib(meminfo, "MemTotal:"))
}

/// The smallest limit in `file` from `dir` up to `top` (inclusive); None when none is set.
fn smallest_on_path(dir: &Path, top: &Path, file: &str) -> Option<u64> {
    let mut smallest: Option<u64> = None;
    let mut at = Some(dir);
    while let Some(d) = at {
        if let Ok(text) = std::fs::read_to_string(d.join(file))
            && let Ok(n) = text.trim().parse::<u64>()
            && n < NO_LIMIT
        {
            smallest = Some(smallest.map_or(n, |s| s.min(n)));
        }
        if d == top {
            break;
        }
        at = d.parent().filter(|p| p.starts_with(top));
    }
    smallest
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn limits(memlock: Option<u64>, can_lock_any: bool, memory: Option<u64>) -> PinLimits {
        PinLimits {
            memlock,
            can_lock_any,
            pinned: 0,
            memory,
        }
    }

    #[test]
    fn a_budget_always_applies() {
        // CAP_IPC_LOCK or an unlimited memlock: a quarter of the memory.
        assert_eq!(limits(None, false, Some(8 * GIB)).budget(), 2 * GIB);
        assert_eq!(
            limits(Some(64 << 20), true, Some(8 * GIB)).budget(),
            2 * GIB
        );
        // A binding memlock limit below the share wins.
        assert_eq!(
            limits(Some(64 << 20), false, Some(8 * GIB)).budget(),
            64 << 20
        );
        // Above it, the share.
        assert_eq!(
            limits(Some(4 * GIB), false, Some(8 * GIB)).budget(),
            2 * GIB
        );
        // Nothing known: a fixed budget, never unlimited.
        assert_eq!(limits(None, true, None).budget(), UNKNOWN_MEMORY_BUDGET);
        // What is pinned already counts.
        let mut l = limits(Some(64 << 20), false, Some(8 * GIB));
        l.pinned = 60 << 20;
        assert_eq!(l.budget(), 4 << 20);
        assert!(l.memlock_binds());
        assert!(!limits(Some(1), true, None).memlock_binds());
    }

    #[test]
    fn the_capability_is_read_from_cap_eff() {
        assert!(has_cap_ipc_lock("Name:\tx\nCapEff:\t000001ffffffffff\n"));
        assert!(!has_cap_ipc_lock("CapEff:\t00000000a80425fb\n"));
        assert!(!has_cap_ipc_lock("garbage"));
    }

    fn write(p: &Path, text: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn the_smallest_cgroup_limit_on_the_path_or_the_machine() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let meminfo = "MemTotal:       16384 kB\nMemFree: 1 kB\n";
        // cgroup v2: the pod's limit above the container's "max".
        write(&r.join("memory.max"), "max\n");
        write(&r.join("kubepods/pod1/memory.max"), "1073741824\n");
        write(&r.join("kubepods/pod1/c1/memory.max"), "max\n");
        assert_eq!(
            memory_limit("0::/kubepods/pod1/c1\n", r, meminfo),
            Some(GIB)
        );
        // No limit anywhere: the machine's.
        assert_eq!(memory_limit("0::/other\n", r, meminfo), Some(16384 * 1024));
        // cgroup v1, "unlimited" written as a huge number, then a real limit.
        write(
            &r.join("memory/memory.limit_in_bytes"),
            "9223372036854771712\n",
        );
        write(&r.join("memory/pod2/memory.limit_in_bytes"), "536870912\n");
        assert_eq!(
            memory_limit("5:cpu,cpuacct:/pod2\n4:memory:/pod2\n", r, meminfo),
            Some(512 << 20)
        );
        assert_eq!(memory_limit("", r, ""), None);
        assert_eq!(memory_limit("garbage\n::\n", r, "MemTotal: x kB"), None);
    }
}
