//! The serving certificate: loaded at start, re-read when the files change, checked at every
//! TLS handshake.
//!
//! Kubelet mounts a Secret as
//!
//! ```text
//! tls.crt -> ..data/tls.crt      ..data -> ..2026_11_30_10_00_00.123456789/
//! tls.key -> ..data/tls.key
//! ```
//!
//! and updates it by writing a new timestamped directory and renaming a `..data_tmp` symlink over
//! `..data`. A watch on the file itself misses that (cilium#13636, kubewarden/policy-server#1061),
//! so [`CertReloader`] instead compares, at each handshake, the identity of both files after
//! resolving symlinks (canonical path, device, inode, length, mtime) with the identity of the
//! pair it loaded. Two `canonicalize` and two `stat` calls per handshake are cheap at webhook
//! rates (kubert re-reads the files every time; this reads them only when they changed).
//!
//! A new pair that does not load (bad PEM, key not matching the certificate, half-written) is
//! logged and counted once; the last good pair keeps serving until the files change again.

use std::{
    fmt,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::SystemTime,
};

use rdma_streams_common::report::Report;
use rustls::{
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};

use super::{
    metrics::TlsMetrics,
    x509::{self, CertSummary},
};

/// ALPN protocols offered, in order of preference.
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// A certificate/key pair could not be loaded or the TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file as given.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The certificate file holds no `CERTIFICATE` PEM block.
    #[error("{}: no PEM CERTIFICATE block", path.display())]
    NoCertificate {
        /// The certificate file.
        path: PathBuf,
    },
    /// A PEM file is malformed, or holds no private key.
    #[error("{}: bad PEM", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The private key is of an unsupported type or does not match the certificate.
    #[error("{} with {}: unusable certificate/key pair", cert.display(), key.display())]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        #[source]
        source: rustls::Error,
    },
    /// rustls refused the server configuration.
    #[error("TLS server configuration")]
    Config(#[source] rustls::Error),
}

/// What `/ready` and the logs say about the serving certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsState {
    /// A pair is loaded (always true once a [`CertReloader`] exists).
    pub loaded: bool,
    /// Pairs loaded after the first.
    pub reloads: u64,
    /// New pairs that failed to load.
    pub failures: u64,
    /// Serial number of the certificate served now (lowercase hex).
    pub serial: Option<String>,
    /// Its `notAfter`, Unix seconds.
    pub not_after: Option<i64>,
}

/// A rustls certificate resolver that follows the certificate and key files on disk.
pub struct CertReloader {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    current: Mutex<Current>,
    metrics: TlsMetrics,
}

/// The pair being served and what is known about the files.
struct Current {
    key: Arc<CertifiedKey>,
    /// Identity of the files the served pair came from.
    loaded: PairId,
    /// Identity of files that failed to load; not retried until they change again.
    rejected: Option<PairId>,
    summary: CertSummary,
}

/// Identity of the certificate and key files.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PairId {
    cert: FileId,
    key: FileId,
}

/// Identity of one file, after following symlinks.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FileId {
    path: PathBuf,
    dev: u64,
    ino: u64,
    len: u64,
    mtime: Option<SystemTime>,
}

// === impl CertReloader ===

impl CertReloader {
    /// Loads and checks the pair, failing with an error that names the bad file.
    pub fn load(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Result<Self, TlsError> {
        let cert_path = cert.into();
        let key_path = key.into();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let id = PairId::probe(&cert_path, &key_path)?;
        let (key, summary) = read_pair(&cert_path, &key_path, &provider)?;
        let metrics = TlsMetrics::default();
        record_summary(&metrics, &summary);
        tracing::info!(
            cert = %cert_path.display(),
            serial = summary.serial.as_deref().unwrap_or("?"),
            not_after = summary.not_after,
            "loaded serving certificate"
        );
        Ok(Self {
            cert_path,
            key_path,
            provider,
            current: Mutex::new(Current {
                key,
                loaded: id,
                rejected: None,
                summary,
            }),
            metrics,
        })
    }

    /// The rustls server configuration: TLS 1.2 and 1.3, no client auth, ALPN `h2` and
    /// `http/1.1`, certificates from this resolver.
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Config)?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }

    /// The metrics this resolver updates; register them once.
    pub fn metrics(&self) -> &TlsMetrics {
        &self.metrics
    }

    /// Checks the files now (as a handshake would) and returns what is served.
    pub fn state(&self) -> TlsState {
        self.refresh();
        let current = self.lock();
        TlsState {
            loaded: true,
            reloads: self.metrics.reloads.get(),
            failures: self.metrics.failures.get(),
            serial: current.summary.serial.clone(),
            not_after: current.summary.not_after,
        }
    }

    /// Returns the pair to serve, reloading it first if the files changed.
    fn refresh(&self) -> Arc<CertifiedKey> {
        let probed = PairId::probe(&self.cert_path, &self.key_path);
        let mut current = self.lock();
        let id = match probed {
            Ok(id) => id,
            Err(error) => {
                // A file is missing for a moment, or permissions changed: keep serving.
                tracing::debug!(error = %Report(&error), "certificate files not readable; keeping the loaded pair");
                return current.key.clone();
            }
        };
        if id == current.loaded || current.rejected.as_ref() == Some(&id) {
            return current.key.clone();
        }
        let loaded = read_pair(&self.cert_path, &self.key_path, &self.provider);
        if PairId::probe(&self.cert_path, &self.key_path).ok().as_ref() != Some(&id) {
            // The files changed again while being read: try again at the next handshake.
            return current.key.clone();
        }
        match loaded {
            Ok((key, summary)) => {
                self.metrics.reloads.inc();
                record_summary(&self.metrics, &summary);
                tracing::info!(
                    cert = %self.cert_path.display(),
                    serial = summary.serial.as_deref().unwrap_or("?"),
                    previous = current.summary.serial.as_deref().unwrap_or("?"),
                    not_after = summary.not_after,
                    "reloaded serving certificate"
                );
                *current = Current {
                    key,
                    loaded: id,
                    rejected: None,
                    summary,
                };
            }
            Err(error) => {
                self.metrics.failures.inc();
                tracing::error!(
                    error = %Report(&error),
                    serial = current.summary.serial.as_deref().unwrap_or("?"),
                    "new certificate/key pair on disk does not load; still serving the last good one"
                );
                current.rejected = Some(id);
            }
        }
        current.key.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        // A poisoned lock only means a panic elsewhere mid-update; the data is still a valid pair.
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl ResolvesServerCert for CertReloader {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.refresh())
    }
}

impl fmt::Debug for CertReloader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertReloader")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

fn record_summary(metrics: &TlsMetrics, summary: &CertSummary) {
    metrics.not_after.set(summary.not_after.unwrap_or_default());
    if let Some(not_after) = summary.not_after {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
            .unwrap_or_default();
        if not_after < now {
            tracing::warn!(
                serial = summary.serial.as_deref().unwrap_or("?"),
                not_after,
                "serving certificate has expired; the API server will refuse it"
            );
        }
    }
}

/// Reads both files and builds the pair, checking that the key matches the certificate.
fn read_pair(
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<(Arc<CertifiedKey>, CertSummary), TlsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.to_owned(),
            source,
        })
    };
    let cert_pem = read(cert_path)?;
    let key_pem = read(key_path)?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            path: cert_path.to_owned(),
            source,
        })?;
    let Some(leaf) = chain.first() else {
        return Err(TlsError::NoCertificate {
            path: cert_path.to_owned(),
        });
    };
    let summary = x509::summarize(leaf);
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|source| TlsError::Pem {
        path: key_path.to_owned(),
        source,
    })?;
    let pair = |source| TlsError::Pair {
        cert: cert_path.to_owned(),
        key: key_path.to_owned(),
        source,
    };
    let certified = CertifiedKey::from_der(chain, key, provider).map_err(pair)?;
    // from_der lets an unknown consistency pass; also make sure the leaf parses as X.509.
    rustls::server::ParsedCertificate::try_from(certified.end_entity_cert().map_err(pair)?)
        .map_err(pair)?;
    Ok((Arc::new(certified), summary))
}

// === impl PairId ===

impl PairId {
    fn probe(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        Ok(Self {
            cert: FileId::probe(cert)?,
            key: FileId::probe(key)?,
        })
    }
}

impl FileId {
    fn probe(path: &Path) -> Result<Self, TlsError> {
        let err = |source| TlsError::Read {
            path: path.to_owned(),
            source,
        };
        let real = std::fs::canonicalize(path).map_err(err)?;
        let meta = std::fs::metadata(&real).map_err(err)?;
        Ok(Self {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: meta.modified().ok(),
            path: real,
        })
    }
}
