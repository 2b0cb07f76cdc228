//! Test harness: a throwaway PKI, the kubelet Secret-volume layout, an in-process server and a
//! TLS client that trusts only the test CA.

use std::{
    future::Future,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::registry::Registry;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SerialNumber,
};
use rdma_streams_common::runtime::Runtime;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::{TlsConnector, client::TlsStream};
use tokio_util::sync::CancellationToken;

use crate::server::{
    AdmissionMetrics, CertReloader, Handler, Readiness, Server, ServerConfig, x509,
};

/// Every async test runs under this bound.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Awaits `future`, failing the test if it takes longer than [`TEST_TIMEOUT`].
pub async fn within<F: Future>(future: F) -> F::Output {
    rdma_streams_testkit::within_async(TEST_TIMEOUT, future).await
}

// === PKI ===

/// A root CA, as the caBundle of the webhook configuration would hold it.
pub struct Pki {
    issuer: Issuer<'static, KeyPair>,
    /// The root certificate, DER.
    pub ca_der: CertificateDer<'static>,
}

/// A serving certificate and its key, PEM.
#[derive(Clone)]
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Pki {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        Self {
            ca_der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf for `localhost` and `127.0.0.1` with the given serial number.
    pub fn leaf(&self, serial: u64) -> Leaf {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("leaf params");
        params.serial_number = Some(SerialNumber::from(serial));
        params
            .distinguished_name
            .push(DnType::CommonName, "rdma-stream-injector.test.svc");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().expect("leaf key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("leaf certificate");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// The serial as [`crate::server::x509`] reports it: big-endian hex, leading zeros dropped.
pub fn serial_hex(serial: u64) -> String {
    let bytes = serial.to_be_bytes();
    let start = bytes.iter().position(|&b| b != 0).unwrap_or(7);
    bytes[start..].iter().map(|b| format!("{b:02x}")).collect()
}

// === kubelet Secret volume ===

/// A directory laid out like a kubelet Secret volume:
///
/// ```text
/// tls.crt -> ..data/tls.crt   tls.key -> ..data/tls.key   ..data -> ..<timestamp>/
/// ```
pub struct SecretDir {
    dir: tempfile::TempDir,
    generation: u32,
}

impl SecretDir {
    pub fn new(leaf: &Leaf) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut this = Self { dir, generation: 0 };
        let first = this.write_generation(&leaf.cert_pem, &leaf.key_pem);
        std::os::unix::fs::symlink(&first, this.path().join("..data")).expect("..data");
        for name in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(Path::new("..data").join(name), this.path().join(name))
                .expect("top-level symlink");
        }
        this
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn cert(&self) -> PathBuf {
        self.path().join("tls.crt")
    }

    pub fn key(&self) -> PathBuf {
        self.path().join("tls.key")
    }

    /// Updates the volume the way kubelet's AtomicWriter does: a new timestamped directory, a
    /// `..data_tmp` symlink to it renamed over `..data`, then the old directory removed.
    pub fn swap(&mut self, cert_pem: &str, key_pem: &str) {
        let old = std::fs::read_link(self.path().join("..data")).expect("read ..data");
        let new = self.write_generation(cert_pem, key_pem);
        let tmp = self.path().join("..data_tmp");
        std::os::unix::fs::symlink(&new, &tmp).expect("..data_tmp");
        std::fs::rename(&tmp, self.path().join("..data")).expect("rename ..data_tmp");
        std::fs::remove_dir_all(self.path().join(old)).expect("remove old generation");
    }

    /// Writes `..2026_11_30_10_00_00.<generation>/{tls.crt,tls.key}`; returns its name.
    fn write_generation(&mut self, cert_pem: &str, key_pem: &str) -> PathBuf {
        self.generation += 1;
        let name = PathBuf::from(format!("..2026_11_30_10_00_00.{:09}", self.generation));
        let dir = self.path().join(&name);
        std::fs::create_dir(&dir).expect("generation dir");
        std::fs::write(dir.join("tls.crt"), cert_pem).expect("write tls.crt");
        std::fs::write(dir.join("tls.key"), key_pem).expect("write tls.key");
        name
    }
}

// === server ===

/// A server running in-process on 127.0.0.1 with a fresh PKI.
pub struct TestServer {
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub pki: Pki,
    pub secret: SecretDir,
    pub metrics: AdmissionMetrics,
    pub tls: Arc<CertReloader>,
    pub readiness: Readiness,
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<()>,
}

/// Starts a server with `handler`, leaf serial 1001, and `configure` applied to the config,
/// in a process runtime with an admin listener (as `serve` runs it; `shutdown` drains it).
pub async fn start(
    handler: Arc<dyn Handler>,
    configure: impl FnOnce(&mut ServerConfig),
) -> TestServer {
    let pki = Pki::new("rdma-streams test root");
    let secret = SecretDir::new(&pki.leaf(1001));
    let mut config = ServerConfig::new(([127, 0, 0, 1], 0).into(), secret.cert(), secret.key());
    configure(&mut config);
    let shutdown = CancellationToken::new();
    let rt = Runtime::builder()
        .admin(Some(([127, 0, 0, 1], 0).into()))
        .with_shutdown(shutdown.clone())
        .build()
        .await
        .expect("admin binds");
    let readiness: Readiness = rt.readiness().clone();
    let mut registry = Registry::default();
    let server = Server::bind(config, handler, readiness.clone(), &mut registry)
        .await
        .expect("server binds");
    rt.metrics().publish(registry).expect("first registry");
    let (addr, admin) = (server.local_addr(), rt.admin_addr());
    let (metrics, tls) = (server.metrics().clone(), server.tls().clone());
    let stop = rt.tasks().shutdown().clone();
    let task = tokio::spawn(async move {
        rt.run(async move {
            server.run(stop).await;
            Ok::<_, rdma_streams_common::runtime::Error>(())
        })
        .await
        .expect("the runtime drains in time");
    });
    TestServer {
        addr,
        admin,
        metrics,
        tls,
        pki,
        secret,
        readiness,
        task,
        shutdown,
    }
}

impl TestServer {
    pub fn client(&self) -> Client {
        Client::new(self.addr, &self.pki.ca_der)
    }
}

// === client ===

/// HTTP version spoken over TLS, chosen by ALPN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Http1,
    Http2,
}

impl Proto {
    pub const BOTH: [Proto; 2] = [Proto::Http1, Proto::Http2];

    fn alpn(self) -> &'static [u8] {
        match self {
            Self::Http1 => b"http/1.1",
            Self::Http2 => b"h2",
        }
    }
}

/// An HTTPS client that trusts only one CA.
#[derive(Clone)]
pub struct Client {
    addr: SocketAddr,
    roots: Arc<rustls::RootCertStore>,
    server_name: ServerName<'static>,
    versions: &'static [&'static rustls::SupportedProtocolVersion],
}

/// A response, fully read.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub alpn: Option<Vec<u8>>,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }
}

impl Client {
    pub fn new(addr: SocketAddr, ca: &CertificateDer<'static>) -> Self {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.clone()).expect("CA accepted");
        Self {
            addr,
            roots: Arc::new(roots),
            server_name: ServerName::try_from("localhost").expect("server name"),
            versions: rustls::DEFAULT_VERSIONS,
        }
    }

    /// Verify the server by this name (a DNS name or an IP literal).
    pub fn server_name(mut self, name: &'static str) -> Self {
        self.server_name = ServerName::try_from(name).expect("server name");
        self
    }

    /// Offer only these TLS versions.
    pub fn versions(
        mut self,
        versions: &'static [&'static rustls::SupportedProtocolVersion],
    ) -> Self {
        self.versions = versions;
        self
    }

    /// Connects and completes the TLS handshake offering `alpn`.
    pub async fn connect(&self, alpn: &[&[u8]]) -> std::io::Result<TlsStream<TcpStream>> {
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(self.versions)
        .expect("client versions")
        .with_root_certificates(self.roots.clone())
        .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let tcp = TcpStream::connect(self.addr).await?;
        TlsConnector::from(Arc::new(config))
            .connect(self.server_name.clone(), tcp)
            .await
    }

    /// The serial number of the certificate the server presents now.
    pub async fn served_serial(&self) -> String {
        let tls = self.connect(&[b"h2"]).await.expect("handshake");
        let leaf = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .expect("server certificate")
            .clone();
        x509::summarize(&leaf).serial.expect("serial")
    }

    /// POSTs `body` to `path` on a new connection.
    pub async fn post(&self, proto: Proto, path: &str, body: impl Into<Bytes>) -> Reply {
        self.send(
            proto,
            Method::POST,
            path,
            body.into(),
            &[("content-type", "application/json")],
        )
        .await
    }

    /// Sends one request on a new connection and reads the whole response.
    pub async fn send(
        &self,
        proto: Proto,
        method: Method,
        path: &str,
        body: Bytes,
        headers: &[(&str, &str)],
    ) -> Reply {
        let tls = self.connect(&[proto.alpn()]).await.expect("TLS handshake");
        let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        let mut request = Request::builder().method(method);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let uri = match proto {
            Proto::Http1 => path.to_owned(),
            Proto::Http2 => format!("https://localhost:{}{path}", self.addr.port()),
        };
        let request = request
            .uri(uri)
            .header(header::HOST, format!("localhost:{}", self.addr.port()))
            .body(Full::new(body))
            .expect("request");
        let io = TokioIo::new(tls);
        let response = match proto {
            Proto::Http1 => {
                let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
                    .await
                    .expect("HTTP/1.1 handshake");
                tokio::spawn(conn);
                sender
                    .send_request(request)
                    .await
                    .expect("HTTP/1.1 response")
            }
            Proto::Http2 => {
                let (mut sender, conn) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                        .await
                        .expect("HTTP/2 handshake");
                tokio::spawn(conn);
                sender.send_request(request).await.expect("HTTP/2 response")
            }
        };
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("response body").to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body,
            alpn,
        }
    }
}

/// Plain HTTP/1.1 GET (the admin server).
pub async fn get_plain(addr: SocketAddr, path: &str) -> Reply {
    let tcp = TcpStream::connect(addr).await.expect("connect admin");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .expect("HTTP/1.1 handshake");
    tokio::spawn(conn);
    let request = Request::get(path)
        .header(header::HOST, "localhost")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let (parts, body) = response.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.expect("body").to_bytes(),
        alpn: None,
    }
}

/// Decodes standard base64 (the `patch` field).
pub fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .expect("standard base64")
}
