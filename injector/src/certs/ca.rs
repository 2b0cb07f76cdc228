//! The self-managed root CA: created with rcgen, kept as PEM (in a Secret), and reloaded from
//! PEM to sign serving certificates. Pure: no I/O, no API calls.

use std::{
    fmt,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PublicKeyData,
};
use rustls::pki_types::{CertificateDer, pem::PemObject};

use super::CertError;

/// Subject common name of every CA this crate creates. A CA is reloaded from PEM by rebuilding
/// its issuer name from this constant, so a CA with another subject cannot sign for us
/// (issuing then fails verification, see [`CertError::Verify`]).
pub const CA_COMMON_NAME: &str = "rdma-stream-injector-ca";

/// Lifetime of a new CA: 10 years (365-day years).
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);

/// How far `notBefore` is set in the past, so that nodes with a slightly slow clock accept a
/// certificate issued a moment ago.
pub const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(5 * 60);

/// A CA that can sign serving certificates: its certificate and key as PEM, plus the rcgen
/// issuer built from them.
pub struct CertAuthority {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl CertAuthority {
    /// Creates a new root CA: ECDSA P-256, CN [`CA_COMMON_NAME`], valid for [`CA_VALIDITY`],
    /// path length 0 (it signs leaves only).
    pub fn generate() -> Result<Self, CertError> {
        Self::generate_at(SystemTime::now())
    }

    fn generate_at(now: SystemTime) -> Result<Self, CertError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(CertError::Generate)?;
        let mut params = ca_params();
        params.not_before = whole_seconds(now - CLOCK_SKEW_ALLOWANCE).into();
        params.not_after = whole_seconds(now + CA_VALIDITY).into();
        let cert = params.self_signed(&key).map_err(CertError::Generate)?;
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads a CA created earlier by [`CertAuthority::generate`] (for instance read back from
    /// the CA Secret). The first certificate of `cert_pem` is the CA; `key_pem` is its PKCS#8
    /// (or SEC1) private key. Fails if either does not parse or the key is not the
    /// certificate's.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CertError> {
        let cert_der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| {
            CertError::InvalidCaPem {
                what: "certificate",
                reason: e.to_string(),
            }
        })?;
        let key = KeyPair::from_pem(key_pem).map_err(|e| CertError::InvalidCaPem {
            what: "key",
            reason: e.to_string(),
        })?;
        // DER is canonical: the key's SubjectPublicKeyInfo appears byte for byte in the
        // certificate that certifies it.
        let spki = key.subject_public_key_info();
        if !contains(cert_der.as_ref(), &spki) {
            return Err(CertError::CaKeyMismatch);
        }
        Ok(Self {
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
            issuer: Issuer::new(ca_params(), key),
        })
    }

    /// The CA certificate as PEM: what goes into `ca.crt` and the webhook's caBundle.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key as PEM: what goes into `ca.key`.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    pub(crate) fn issuer(&self) -> &Issuer<'static, KeyPair> {
        &self.issuer
    }
}

impl fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertAuthority")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// Everything of the CA's parameters that shapes what it signs (subject, key usages, key
/// identifier method); validity is set by the caller.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_COMMON_NAME);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// Truncates to whole seconds, the resolution of X.509 times, so that what we report equals
/// what the certificate says.
pub(crate) fn whole_seconds(t: SystemTime) -> SystemTime {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => UNIX_EPOCH + Duration::from_secs(d.as_secs()),
        Err(_) => UNIX_EPOCH,
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ca_round_trips_through_pem() {
        let ca = CertAuthority::generate().unwrap();
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(ca.key_pem().starts_with("-----BEGIN PRIVATE KEY-----"));
        let again = CertAuthority::from_pem(ca.cert_pem(), ca.key_pem()).unwrap();
        assert_eq!(again.cert_pem(), ca.cert_pem());
        assert!(!format!("{again:?}").contains(ca.key_pem()));
    }

    #[test]
    fn mismatched_key_is_rejected() {
        let a = CertAuthority::generate().unwrap();
        let b = CertAuthority::generate().unwrap();
        assert!(matches!(
            CertAuthority::from_pem(a.cert_pem(), b.key_pem()),
            Err(CertError::CaKeyMismatch)
        ));
    }

    #[test]
    fn garbage_pem_is_an_error_not_a_panic() {
        let ca = CertAuthority::generate().unwrap();
        assert!(matches!(
            CertAuthority::from_pem("not a pem", ca.key_pem()),
            Err(CertError::InvalidCaPem {
                what: "certificate",
                ..
            })
        ));
        assert!(matches!(
            CertAuthority::from_pem(
                ca.cert_pem(),
                "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
            ),
            Err(CertError::InvalidCaPem { what: "key", .. })
        ));
    }

    #[test]
    fn whole_seconds_truncates() {
        let t = UNIX_EPOCH + Duration::from_millis(1_500);
        assert_eq!(whole_seconds(t), UNIX_EPOCH + Duration::from_secs(1));
    }
}
