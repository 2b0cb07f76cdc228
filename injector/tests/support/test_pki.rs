//! A private CA and a serving certificate for localhost / 127.0.0.1, written as `ca.crt`,
//! `tls.crt` and `tls.key` (what the API server's caBundle and the injector's flags use).
//! Shared by the `serve` process tests and the admission benchmark.

// Test support: a panic is how a helper fails the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

/// Writes the files into `dir` and returns the CA certificate (DER) for rustls clients.
pub fn write_certs(dir: &Path) -> Vec<u8> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // Distinct subject and issuer names: clients such as curl reject a leaf whose subject
    // equals its issuer as "self-signed".
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "rdma-streams test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let leaf = params
        .signed_by(&key, &Issuer::new(ca_params, ca_key))
        .unwrap();
    std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
    std::fs::write(dir.join("tls.crt"), leaf.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
    ca.der().to_vec()
}
