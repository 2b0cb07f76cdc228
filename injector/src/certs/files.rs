//! Writing the serving certificate and key where the HTTPS server reads them, atomically:
//! each file is written to a temporary file in the same directory, synced, then renamed over
//! the old one, so a reader sees either the old or the new file, never a partial one.

use std::{fs, path::Path};

use rdma_streams_common::atomic_file;

use super::{CertError, ServingCert};

/// File name of the serving certificate inside the certificate directory.
pub const TLS_CERT_FILE: &str = "tls.crt";
/// File name of the serving key inside the certificate directory.
pub const TLS_KEY_FILE: &str = "tls.key";

/// Writes `cert` as `<dir>/tls.key` (mode 0600) then `<dir>/tls.crt` (mode 0644), creating
/// `dir` if needed. The key goes first: between the two renames a handshake may read the new
/// key with the old certificate; a server that checks the pair (rustls `CertifiedKey`) keeps
/// its last good pair for that one handshake.
pub async fn write_serving_cert(dir: &Path, cert: &ServingCert) -> Result<(), CertError> {
    let (owned_dir, cert) = (dir.to_owned(), cert.clone());
    tokio::task::spawn_blocking(move || write_serving_cert_blocking(&owned_dir, &cert))
        .await
        .map_err(|e| CertError::Io {
            path: dir.to_owned(),
            source: std::io::Error::other(e),
        })?
}

/// Blocking form of [`write_serving_cert`].
pub fn write_serving_cert_blocking(dir: &Path, cert: &ServingCert) -> Result<(), CertError> {
    fs::create_dir_all(dir).map_err(|source| CertError::Io {
        path: dir.to_owned(),
        source,
    })?;
    write_atomic(&dir.join(TLS_KEY_FILE), cert.key_pem.as_bytes(), 0o600)?;
    write_atomic(&dir.join(TLS_CERT_FILE), cert.cert_pem.as_bytes(), 0o644)?;
    // Make the renames durable; failing to sync a directory is not worth failing for.
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// A file of its own for each write, created with `mode` (the key's temporary file is never
/// readable by others either), synced, renamed over `path`.
fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), CertError> {
    atomic_file::write_atomic(path, contents, mode, true).map_err(|source| CertError::Io {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use std::{os::unix::fs::PermissionsExt, time::SystemTime};

    use super::*;

    fn cert(tag: &str) -> ServingCert {
        ServingCert {
            cert_pem: format!("cert {tag}"),
            key_pem: format!("key {tag}"),
            not_before: SystemTime::UNIX_EPOCH,
            not_after: SystemTime::UNIX_EPOCH,
        }
    }

    #[tokio::test]
    async fn writes_both_files_with_modes_and_replaces_them() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("certs");
        write_serving_cert(&dir, &cert("one")).await.unwrap();
        assert_eq!(
            fs::read_to_string(dir.join(TLS_CERT_FILE)).unwrap(),
            "cert one"
        );
        assert_eq!(
            fs::read_to_string(dir.join(TLS_KEY_FILE)).unwrap(),
            "key one"
        );
        let mode = |f| fs::metadata(dir.join(f)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(TLS_KEY_FILE), 0o600);
        assert_eq!(mode(TLS_CERT_FILE) & 0o600, 0o600);

        write_serving_cert(&dir, &cert("two")).await.unwrap();
        assert_eq!(
            fs::read_to_string(dir.join(TLS_CERT_FILE)).unwrap(),
            "cert two"
        );
        assert_eq!(
            fs::read_to_string(dir.join(TLS_KEY_FILE)).unwrap(),
            "key two"
        );
        assert_eq!(mode(TLS_KEY_FILE), 0o600);
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "no temporary file left behind: {names:?}");
    }

    #[tokio::test]
    async fn unwritable_directory_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("plain-file");
        fs::write(&file, "x").unwrap();
        let err = write_serving_cert(&file.join("sub"), &cert("x"))
            .await
            .unwrap_err();
        assert!(matches!(err, CertError::Io { .. }), "{err}");
    }
}
