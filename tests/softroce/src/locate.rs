//! Finding what a guest needs on the host: the kernel image with `rdma_rxe`, `vng`, QEMU, the
//! static busybox vng puts in its initramfs, and the RDMA tools the guest runs (the guest's
//! root is the host's, shared over 9p, so they are host packages).

use std::cmp::Ordering;
use std::env;
use std::fs;
use std::path::{Path, PathBuf};

use crate::Error;

const MAKE_DEPS: &str = "`make deps` installs it";

/// A kernel the guests boot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// The image, e.g. `/boot/vmlinuz-6.1.0-57-amd64`.
    pub image: PathBuf,
    /// Its release, e.g. `6.1.0-57-amd64` (its modules are in `/lib/modules/<version>`).
    pub version: String,
}

/// Everything [`crate::run`] needs on the host, found once by [`tools`].
#[derive(Clone, Debug)]
pub struct Tools {
    /// The kernel the guests boot.
    pub kernel: Kernel,
    /// The `vng` executable (virtme-ng).
    pub vng: PathBuf,
}

/// The workspace root (this crate lives in `<root>/tests/softroce`).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .and_then(Path::parent)
        .map_or_else(|| manifest.to_path_buf(), Path::to_path_buf)
}

/// The cargo target directory: `CARGO_TARGET_DIR` when set, else `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                workspace_root().join(dir)
            }
        }
        _ => workspace_root().join("target"),
    }
}

/// Where the harness keeps its state: the accelerator probe's result and the per-run work
/// directories (`<target>/softroce`).
pub fn state_dir() -> PathBuf {
    target_dir().join("softroce")
}

/// Finds the kernel, vng, QEMU, busybox-static and the guest's RDMA tools; the error names the
/// first missing piece and the package that has it.
pub fn tools() -> Result<Tools, Error> {
    let kernel = kernel()?;
    let vng = vng()?;
    for (exe, package) in [
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("modprobe", "kmod"),
        ("ip", "iproute2"),
        ("rdma", "iproute2"),
        ("ibv_devices", "ibverbs-utils"),
        ("ibv_devinfo", "ibverbs-utils"),
        ("rping", "rdmacm-utils"),
        ("rstream", "rdmacm-utils"),
        ("unshare", "util-linux"),
        ("bash", "bash"),
    ] {
        if which(exe).is_none() {
            return Err(Error::missing(
                format!("`{exe}`"),
                format!("install the Debian package {package} ({MAKE_DEPS})"),
            ));
        }
    }
    // vng builds an initramfs (Debian's kernel has 9p as a module) around a static busybox.
    if ["busybox-static", "busybox.static", "busybox"]
        .iter()
        .all(|b| which(b).is_none())
    {
        return Err(Error::missing(
            "a static busybox (vng builds the guest's initramfs around it)",
            format!("install busybox-static ({MAKE_DEPS})"),
        ));
    }
    if rxe_provider().is_none() {
        return Err(Error::missing(
            "libibverbs' rxe provider (libibverbs/librxe-rdmav*.so)",
            format!("install ibverbs-providers ({MAKE_DEPS})"),
        ));
    }
    Ok(Tools { kernel, vng })
}

/// The kernel image: `SOFTROCE_KERNEL` when set, else the newest `/boot/vmlinuz-*` whose
/// modules include `rdma_rxe`.
pub fn kernel() -> Result<Kernel, Error> {
    if let Some(image) = env::var_os("SOFTROCE_KERNEL").filter(|v| !v.is_empty()) {
        let image = PathBuf::from(image);
        if !image.is_file() {
            return Err(Error::Invalid(format!(
                "SOFTROCE_KERNEL={}: no such file",
                image.display()
            )));
        }
        let name = image
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let version = name.strip_prefix("vmlinuz-").unwrap_or(&name).to_string();
        if !has_rxe(Path::new("/lib/modules"), &version) {
            return Err(Error::missing(
                format!("rdma_rxe for SOFTROCE_KERNEL={}", image.display()),
                format!(
                    "the guest loads modules from /lib/modules/{version}/ (the image's name \
                     must be vmlinuz-<release>), which has no \
                     kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko"
                ),
            ));
        }
        return Ok(Kernel { image, version });
    }
    find_kernel(Path::new("/boot"), Path::new("/lib/modules")).ok_or_else(|| {
        Error::missing(
            "a kernel image with rdma_rxe (/boot/vmlinuz-<v> with \
             /lib/modules/<v>/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko)",
            format!("install linux-image-amd64 ({MAKE_DEPS}), or set SOFTROCE_KERNEL"),
        )
    })
}

/// The newest `vmlinuz-<v>` in `boot` whose `modules/<v>` has `rdma_rxe`.
pub fn find_kernel(boot: &Path, modules: &Path) -> Option<Kernel> {
    let mut found: Vec<Kernel> = fs::read_dir(boot)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let version = name.strip_prefix("vmlinuz-")?.to_string();
            has_rxe(modules, &version).then(|| Kernel {
                image: e.path(),
                version,
            })
        })
        .collect();
    found.sort_by(|a, b| version_cmp(&a.version, &b.version));
    found.pop()
}

fn has_rxe(modules: &Path, version: &str) -> bool {
    let dir = modules
        .join(version)
        .join("kernel/drivers/infiniband/sw/rxe");
    fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("rdma_rxe.ko"))
    })
}

/// Compares kernel releases by their runs of digits as numbers (`6.10.0` after `6.9.12`).
pub fn version_cmp(a: &str, b: &str) -> Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (ca, cb) = (chunks(a), chunks(b));
    for (x, y) in ca.iter().zip(cb.iter()) {
        let ord = match (x, y) {
            ((true, x), (true, y)) => {
                let (x, y) = (x.trim_start_matches('0'), y.trim_start_matches('0'));
                x.len().cmp(&y.len()).then_with(|| x.cmp(y))
            }
            ((_, x), (_, y)) => x.cmp(y),
        };
        if ord != Ordering::Equal {
            return ord;
        }
    }
    ca.len().cmp(&cb.len())
}

/// vng: `SOFTROCE_VNG` when set, else `<workspace>/.tools/vng/bin/vng` (what `make deps`
/// installs), else `vng` on `PATH`.
pub fn vng() -> Result<PathBuf, Error> {
    if let Some(vng) = env::var_os("SOFTROCE_VNG").filter(|v| !v.is_empty()) {
        let vng = PathBuf::from(vng);
        return if vng.is_file() {
            Ok(vng)
        } else {
            Err(Error::Invalid(format!(
                "SOFTROCE_VNG={}: no such file",
                vng.display()
            )))
        };
    }
    let local = workspace_root().join(".tools/vng/bin/vng");
    if local.is_file() {
        return Ok(local);
    }
    which("vng").ok_or_else(|| {
        Error::missing(
            "vng (virtme-ng)",
            format!(
                "`make deps` installs virtme-ng 1.42 into {}, or set SOFTROCE_VNG",
                local.display()
            ),
        )
    })
}

/// A command running `vng`, with vng's directory first on `PATH`: vng runs `virtme-run`
/// through the shell, from its own virtualenv.
pub fn vng_command(vng: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(vng);
    if let Some(dir) = vng.parent() {
        let path = env::var_os("PATH").unwrap_or_default();
        let dirs = std::iter::once(dir.to_path_buf()).chain(env::split_paths(&path));
        if let Ok(path) = env::join_paths(dirs) {
            cmd.env("PATH", path);
        }
    }
    cmd
}

/// The first executable `name` on `PATH`, then in the sbin directories (root's tools).
pub fn which(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn rxe_provider() -> Option<PathBuf> {
    ["/usr/lib", "/usr/lib64", "/lib"]
        .iter()
        .filter_map(|root| fs::read_dir(root).ok())
        .flat_map(|entries| entries.flatten())
        .map(|e| e.path().join("libibverbs"))
        .chain([PathBuf::from("/usr/lib/libibverbs")])
        .filter_map(|dir| fs::read_dir(dir).ok())
        .flat_map(|entries| entries.flatten())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("librxe-rdmav"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_numerically() {
        assert_eq!(
            version_cmp("6.10.0-1-amd64", "6.9.12-1-amd64"),
            Ordering::Greater
        );
        assert_eq!(
            version_cmp("6.1.0-57-amd64", "6.1.0-9-amd64"),
            Ordering::Greater
        );
        assert_eq!(
            version_cmp("6.1.0-57-amd64", "6.1.0-57-amd64"),
            Ordering::Equal
        );
        assert_eq!(version_cmp("5.10.0", "6.1.0"), Ordering::Less);
    }

    #[test]
    fn the_newest_kernel_with_rxe_wins() {
        let root = tempfile::tempdir().unwrap();
        let (boot, modules) = (root.path().join("boot"), root.path().join("modules"));
        fs::create_dir_all(&boot).unwrap();
        for v in ["6.1.0-9-amd64", "6.1.0-57-amd64", "6.12.0-1-amd64"] {
            fs::write(boot.join(format!("vmlinuz-{v}")), b"").unwrap();
        }
        for (v, module) in [
            ("6.1.0-9-amd64", "rdma_rxe.ko"),
            ("6.1.0-57-amd64", "rdma_rxe.ko.xz"),
            ("6.12.0-1-amd64", "other.ko"),
        ] {
            let dir = modules.join(v).join("kernel/drivers/infiniband/sw/rxe");
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join(module), b"").unwrap();
        }
        let k = find_kernel(&boot, &modules).unwrap();
        assert_eq!(k.version, "6.1.0-57-amd64");
        assert_eq!(k.image, boot.join("vmlinuz-6.1.0-57-amd64"));
        assert!(find_kernel(&modules, &boot).is_none());
    }
}
