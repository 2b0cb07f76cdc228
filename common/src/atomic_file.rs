//! Replacing a file so that a reader sees either the old one or the whole new one, never a
//! part of it: the bytes go to a temporary file of their own in the same folder, then a rename
//! puts it in place (the device plugin's CDI specs, the injector's certificate files, the
//! device-plugin testkit's sysfs trees).

use std::{
    fs::Permissions,
    io::{self, Write},
    os::unix::fs::PermissionsExt,
    path::Path,
};

/// Writes `contents` to `path` atomically.
///
/// The temporary file is `.<name>.<random>.tmp` beside `path` (a name of its own for every
/// write, so writers running at once never share one), created with `mode` less the umask, so
/// it never exists with looser permissions than the file it becomes. With `sync` its data is
/// flushed to disk (`fsync`) before the rename. On any error the temporary file is removed and
/// `path` is left as it was.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32, sync: bool) -> io::Result<()> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        )
    })?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(name);
    prefix.push(".");
    let mut tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .permissions(Permissions::from_mode(mode))
        .tempfile_in(dir)?;
    tmp.write_all(contents)?;
    if sync {
        tmp.as_file().sync_all()?;
    }
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn replaces_the_file_with_its_mode_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        for (contents, sync) in [(&b"one"[..], true), (b"two", false)] {
            write_atomic(&path, contents, 0o600, sync).unwrap();
            assert_eq!(fs::read(&path).unwrap(), contents);
            let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
            assert_eq!(names(dir.path()), ["key"]);
        }
    }

    #[test]
    fn writers_at_once_each_use_a_file_of_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spec.json");
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let path = &path;
                s.spawn(move || {
                    for _ in 0..50 {
                        write_atomic(path, &[t; 64], 0o644, false).unwrap();
                    }
                });
            }
        });
        let last = fs::read(&path).unwrap();
        assert_eq!(last.len(), 64);
        assert!(last.iter().all(|b| *b == last[0]), "one writer's bytes");
        assert_eq!(names(dir.path()), ["spec.json"]);
    }

    #[test]
    fn a_failed_write_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file");
        fs::write(&path, "old").unwrap();
        // A directory in the way of the rename.
        let blocked = dir.path().join("sub");
        fs::create_dir(&blocked).unwrap();
        fs::write(blocked.join("x"), "").unwrap();
        write_atomic(&blocked, b"new", 0o644, true).unwrap_err();
        assert_eq!(fs::read_to_string(&path).unwrap(), "old");
        assert_eq!(names(dir.path()), ["file", "sub"]);
        write_atomic(&dir.path().join("missing/file"), b"new", 0o644, true).unwrap_err();
        write_atomic(Path::new("/"), b"new", 0o644, true).unwrap_err();
    }
}
