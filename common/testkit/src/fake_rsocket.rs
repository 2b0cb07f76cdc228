//! The fake rsocket provider `libfakersocket.so`, from the workspace crate `shim/fake-rsocket`.
//!
//! Cargo does not build another package's cdylib for a package's tests, so [`library`]:
//! 1. uses `FAKE_RSOCKET_LIB=/path/libfakersocket.so` as is when set ([`ENV_LIB`]);
//! 2. otherwise expects the library in the calling test binary's profile directory
//!    (`<target>/<profile>/libfakersocket.so`, found from the test executable's path, which
//!    works for any `CARGO_TARGET_DIR`), and runs `cargo build -p fake-rsocket` (with the same
//!    target dir and profile) when it is missing or older than the fake's sources.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::SystemTime;

/// Env var naming the fake provider library to use instead of locating or building it.
pub const ENV_LIB: &str = "FAKE_RSOCKET_LIB";

/// The fake provider's file name.
pub const LIB_NAME: &str = "libfakersocket.so";

/// The fake provider's path ([`ENV_LIB`] if set, else built first if missing or stale; see
/// the module docs). Computed once per process. Panics with instructions if it cannot be
/// found or built.
pub fn library() -> PathBuf {
    static LIB: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match LIB.get_or_init(locate_or_build) {
        Ok(path) => path.clone(),
        Err(msg) => panic!("{msg}"),
    }
}

/// The workspace root (this crate lives in `<root>/common/testkit`).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn locate_or_build() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(ENV_LIB) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{ENV_LIB}={} does not exist", path.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // <target>/<profile>/deps/<test binary>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("test binary is not in <target>/<profile>/deps")?;
    let target_dir = profile_dir
        .parent()
        .ok_or("test binary is not in <target>/<profile>/deps")?;
    let lib = profile_dir.join(LIB_NAME);
    let fake_dir = workspace_root().join("shim/fake-rsocket");
    if lib.is_file() && !stale(&lib, &fake_dir) {
        return Ok(lib);
    }
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev",
        Some(other) => other,
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_owned());
    let output = Command::new(&cargo)
        .args(["build", "-p", "fake-rsocket", "--profile", profile])
        .arg("--manifest-path")
        .arg(fake_dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {cargo} build -p fake-rsocket: {e}"))?;
    if !output.status.success() || !lib.is_file() {
        return Err(format!(
            "{} is missing and `cargo build -p fake-rsocket` failed ({}); build it first with \
             `cargo build -p fake-rsocket` or point {ENV_LIB} at it.\n{}",
            lib.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(lib)
}

/// True if a file under the fake's `src/` or its `Cargo.toml` is newer than `lib`.
fn stale(lib: &Path, fake_dir: &Path) -> bool {
    let Some(built) = mtime(lib) else { return true };
    let mut newest = mtime(&fake_dir.join("Cargo.toml"));
    let mut dirs = vec![fake_dir.join("src")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                newest = newest.max(mtime(&path));
            }
        }
    }
    newest.is_some_and(|n| n > built)
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_root_holds_the_fake() {
        assert!(
            workspace_root()
                .join("shim/fake-rsocket/Cargo.toml")
                .is_file()
        );
    }
}
