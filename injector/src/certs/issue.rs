//! Serving certificates for the webhook Service, signed by a [`CertAuthority`], and the check
//! that a serving certificate chains to a CA. Pure: no I/O, no API calls.

use std::{
    fmt,
    sync::Arc,
    time::{Duration, SystemTime},
};

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};
use rustls::{
    RootCertStore,
    client::{WebPkiServerVerifier, danger::ServerCertVerifier},
    pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject},
};

use super::{
    CertError,
    ca::{CLOCK_SKEW_ALLOWANCE, CertAuthority, whole_seconds},
};

/// Lifetime of a serving certificate: 90 days.
pub const SERVING_CERT_VALIDITY: Duration = Duration::from_secs(90 * 24 * 60 * 60);

/// The Service the API server calls: the serving certificate is valid for its DNS names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceIdentity {
    /// Service name.
    pub service: String,
    /// Service namespace (the injector's own namespace).
    pub namespace: String,
}

impl ServiceIdentity {
    /// A Service `service` in namespace `namespace`.
    pub fn new(service: impl Into<String>, namespace: impl Into<String>) -> Self {
        Self {
            service: service.into(),
            namespace: namespace.into(),
        }
    }

    /// `<svc>`, `<svc>.<ns>`, `<svc>.<ns>.svc`, `<svc>.<ns>.svc.cluster.local`.
    pub fn dns_names(&self) -> Vec<String> {
        let (svc, ns) = (&self.service, &self.namespace);
        vec![
            svc.clone(),
            format!("{svc}.{ns}"),
            format!("{svc}.{ns}.svc"),
            format!("{svc}.{ns}.svc.cluster.local"),
        ]
    }

    /// The name the API server dials (`<svc>.<ns>.svc`), used as the certificate's CN.
    pub fn primary_dns_name(&self) -> String {
        format!("{}.{}.svc", self.service, self.namespace)
    }
}

/// A serving certificate (leaf only, no chain) and its key, as PEM, with its validity.
#[derive(Clone, PartialEq, Eq)]
pub struct ServingCert {
    /// The leaf certificate as PEM (`tls.crt`).
    pub cert_pem: String,
    /// Its PKCS#8 private key as PEM (`tls.key`).
    pub key_pem: String,
    /// `notBefore` of the certificate (already backdated by the clock-skew allowance).
    pub not_before: SystemTime,
    /// `notAfter` of the certificate.
    pub not_after: SystemTime,
}

impl ServingCert {
    /// When to replace this certificate: two thirds into its life.
    pub fn renew_at(&self) -> SystemTime {
        let life = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or(Duration::ZERO);
        self.not_before + life / 3 * 2
    }
}

impl fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServingCert")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish()
    }
}

/// Issues a serving certificate for `identity`'s DNS names, valid for
/// [`SERVING_CERT_VALIDITY`], with a fresh ECDSA P-256 key, and checks that it verifies
/// against `ca` for every one of those names before returning it.
pub fn issue_serving_cert(
    ca: &CertAuthority,
    identity: &ServiceIdentity,
) -> Result<ServingCert, CertError> {
    issue_serving_cert_for(ca, identity, SERVING_CERT_VALIDITY)
}

/// [`issue_serving_cert`] with another lifetime (short-lived certificates in tests).
pub fn issue_serving_cert_for(
    ca: &CertAuthority,
    identity: &ServiceIdentity,
    validity: Duration,
) -> Result<ServingCert, CertError> {
    let now = SystemTime::now();
    let not_before = whole_seconds(now - CLOCK_SKEW_ALLOWANCE);
    let not_after = whole_seconds(now + validity);

    let dns_names = identity.dns_names();
    let mut params = CertificateParams::new(dns_names.clone()).map_err(CertError::Generate)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, identity.primary_dns_name());
    params.distinguished_name = dn;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = not_before.into();
    params.not_after = not_after.into();

    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(CertError::Generate)?;
    let cert = params
        .signed_by(&key, ca.issuer())
        .map_err(CertError::Generate)?;
    let serving = ServingCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_before,
        not_after,
    };
    for name in &dns_names {
        verify_serving_cert(ca.cert_pem(), &serving.cert_pem, name, now)?;
    }
    Ok(serving)
}

/// Checks, as a TLS client trusting only `ca_pem` would at time `at`, that the first
/// certificate of `cert_pem` is a valid server certificate for `dns_name`: signature chain,
/// validity window, DNS name, key usage.
pub fn verify_serving_cert(
    ca_pem: &str,
    cert_pem: &str,
    dns_name: &str,
    at: SystemTime,
) -> Result<(), CertError> {
    let fail = |reason: String| CertError::Verify {
        dns_name: dns_name.to_owned(),
        reason,
    };
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let ca = ca.map_err(|e| fail(format!("CA PEM: {e}")))?;
        roots
            .add(ca)
            .map_err(|e| fail(format!("CA certificate: {e}")))?;
    }
    let leaf = CertificateDer::from_pem_slice(cert_pem.as_bytes())
        .map_err(|e| fail(format!("certificate PEM: {e}")))?;
    let server_name =
        ServerName::try_from(dns_name.to_owned()).map_err(|e| fail(format!("name: {e}")))?;
    let at = UnixTime::since_unix_epoch(
        at.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO),
    );
    let verifier = WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .map_err(|e| fail(format!("verifier: {e}")))?;
    verifier
        .verify_server_cert(&leaf, &[], &server_name, &[], at)
        .map(|_| ())
        .map_err(|e| fail(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> ServiceIdentity {
        ServiceIdentity::new("rdma-stream-injector", "rdma-streams")
    }

    #[test]
    fn dns_names_cover_every_form_the_api_server_may_dial() {
        assert_eq!(
            identity().dns_names(),
            [
                "rdma-stream-injector",
                "rdma-stream-injector.rdma-streams",
                "rdma-stream-injector.rdma-streams.svc",
                "rdma-stream-injector.rdma-streams.svc.cluster.local",
            ]
        );
    }

    #[test]
    fn leaf_verifies_against_its_ca_for_every_name_and_not_others() {
        let ca = CertAuthority::generate().unwrap();
        let leaf = issue_serving_cert(&ca, &identity()).unwrap();
        let now = SystemTime::now();
        for name in identity().dns_names() {
            verify_serving_cert(ca.cert_pem(), &leaf.cert_pem, &name, now).unwrap();
        }
        assert!(verify_serving_cert(ca.cert_pem(), &leaf.cert_pem, "other.example", now).is_err());
        let other = CertAuthority::generate().unwrap();
        assert!(
            verify_serving_cert(
                other.cert_pem(),
                &leaf.cert_pem,
                "rdma-stream-injector",
                now
            )
            .is_err()
        );
    }

    #[test]
    fn leaf_lives_ninety_days_and_renews_at_two_thirds() {
        let ca = CertAuthority::generate().unwrap();
        let before = SystemTime::now();
        let leaf = issue_serving_cert(&ca, &identity()).unwrap();
        let day = Duration::from_secs(24 * 60 * 60);
        let life = leaf.not_after.duration_since(leaf.not_before).unwrap();
        assert!(
            life >= 90 * day && life <= 90 * day + CLOCK_SKEW_ALLOWANCE + Duration::from_secs(2)
        );
        let renew = leaf.renew_at();
        assert!(
            renew > before + 59 * day && renew < before + 61 * day,
            "{renew:?}"
        );
        // The certificate itself says so, not just our bookkeeping.
        let name = "rdma-stream-injector.rdma-streams.svc";
        verify_serving_cert(ca.cert_pem(), &leaf.cert_pem, name, before + 89 * day).unwrap();
        let late = verify_serving_cert(ca.cert_pem(), &leaf.cert_pem, name, before + 91 * day);
        assert!(matches!(late, Err(CertError::Verify { .. })), "{late:?}");
    }

    #[test]
    fn reloaded_ca_signs_leaves_that_verify_against_the_original_pem() {
        let ca = CertAuthority::generate().unwrap();
        let reloaded = CertAuthority::from_pem(ca.cert_pem(), ca.key_pem()).unwrap();
        let leaf = issue_serving_cert(&reloaded, &identity()).unwrap();
        verify_serving_cert(
            ca.cert_pem(),
            &leaf.cert_pem,
            "rdma-stream-injector",
            SystemTime::now(),
        )
        .unwrap();
    }

    #[test]
    fn ca_with_a_foreign_subject_is_refused_when_issuing() {
        // A CA we did not make: right shape, other subject.
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "someone-else");
        let foreign = params.self_signed(&key).unwrap();
        let ca = CertAuthority::from_pem(&foreign.pem(), &key.serialize_pem()).unwrap();
        let err = issue_serving_cert(&ca, &identity()).unwrap_err();
        assert!(matches!(err, CertError::Verify { .. }), "{err}");
    }
}
