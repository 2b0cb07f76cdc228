//! A file's identity, to tell a socket we bound from a new one with the same name (another
//! instance of the process, started during a rolling update, binds the same path).

use std::path::Path;

/// `(device, inode, ctime, ctime_ns)`.
pub type FileId = (u64, u64, i64, i64);

/// The identity of `path` (not following a symlink). Inode numbers are reused at once on tmpfs
/// and ext4, so a re-created socket is told apart by its creation time as well.
pub fn file_id(path: &Path) -> Option<FileId> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| of_metadata(&m))
}

/// The identity of an open file (what [`file_id`] of its path gives while the path names it).
pub fn file_id_of(file: &std::fs::File) -> std::io::Result<FileId> {
    file.metadata().map(|m| of_metadata(&m))
}

fn of_metadata(m: &std::fs::Metadata) -> FileId {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino(), m.ctime(), m.ctime_nsec())
}

/// Removes `path` only if it is still the file whose identity is `id` (never a successor's).
pub fn remove_if_ours(path: &Path, id: Option<FileId>) {
    if id.is_some() && file_id(path) == id {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recreated_file_is_not_ours() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        std::fs::write(&path, b"a").unwrap();
        let ours = file_id(&path);
        assert!(ours.is_some());
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"b").unwrap();
        remove_if_ours(&path, ours);
        assert!(path.exists(), "a successor's file was removed");
        remove_if_ours(&path, file_id(&path));
        assert!(!path.exists());
        remove_if_ours(&path, None);
    }
}
