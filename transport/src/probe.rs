//! Whether this process can carry RDMA streams at all: the libraries, a device that is not
//! iWARP, and fork safety. Decided once per process (librspreload's per-socket re-probe is the
//! anti-pattern).

use std::os::fd::RawFd;

use crate::rdma::{self, Lib};

/// Why streams cannot be used here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unusable {
    /// librdmacm or libibverbs could not be loaded.
    #[error("{0}")]
    NoLibrary(String),
    /// librdmacm sees no RDMA device.
    #[error("no RDMA device")]
    NoDevice,
    /// Every device is iWARP, whose rdma_cm port space is the kernel's TCP ports: a side
    /// channel on the app's port would collide with the app's own listener.
    #[error("only iWARP devices ({0})")]
    IwarpOnly(String),
    /// Registered memory would not survive this process's `fork()` (no copy-on-fork in the
    /// kernel and `ibv_fork_init` failed).
    #[error("registered memory is not fork-safe here (ibv_fork_init failed)")]
    NotForkSafe,
}

/// What the probe found.
#[derive(Debug, Clone)]
pub struct Usable {
    /// The libraries.
    pub lib: &'static Lib,
    /// The devices' names.
    pub devices: Vec<String>,
    /// Fds the libraries opened for them (each device's command and event fds), which the
    /// process must not close behind their back.
    pub fds: Vec<RawFd>,
}

/// Loads the libraries (`provider`: librdmacm's soname or path, the caller's choice;
/// [`rdma::DEFAULT_PROVIDER`] for the system's), lists the devices, makes registered memory
/// fork-safe. Meant once per process: each call loads and binds the libraries anew.
pub fn probe(provider: &str) -> Result<Usable, Unusable> {
    let lib = Lib::load_static(provider).map_err(|e| Unusable::NoLibrary(e.to_string()))?;
    probe_with(lib)
}

/// [`probe`] with given libraries.
pub fn probe_with(lib: &'static Lib) -> Result<Usable, Unusable> {
    let contexts = rdma::devices(lib);
    if contexts.is_empty() {
        return Err(Unusable::NoDevice);
    }
    let names: Vec<String> = contexts.iter().map(|c| c.name()).collect();
    if contexts.iter().all(|c| c.is_iwarp()) {
        return Err(Unusable::IwarpOnly(names.join(",")));
    }
    if !rdma::ensure_fork_safe(lib) {
        return Err(Unusable::NotForkSafe);
    }
    let fds = contexts
        .iter()
        .flat_map(|c| c.fds())
        .filter(|fd| *fd >= 0)
        .collect();
    Ok(Usable {
        lib,
        devices: names,
        fds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The development machines have no RDMA: the real libraries load and report no device
    /// (the Soft-RoCE suite checks the other answer).
    #[test]
    fn no_device_without_rdma() {
        if std::path::Path::new("/sys/class/infiniband")
            .read_dir()
            .is_ok_and(|mut d| d.next().is_some())
        {
            return;
        }
        let lib = Lib::load_static(rdma::DEFAULT_PROVIDER).expect("librdmacm");
        assert_eq!(probe_with(lib).unwrap_err(), Unusable::NoDevice);
    }
}
