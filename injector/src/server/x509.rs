//! Just enough DER reading to name a certificate: its serial number, `notBefore` and `notAfter`.
//!
//! These feed `/ready`, the rotation test and the `tls_cert_not_after_seconds` gauge (expiry is
//! the most common webhook outage), and the CA's age to the caBundle rotation overlap
//! ([`crate::certs::rotation`]). rustls has already checked that the certificate parses as
//! X.509 by the time this runs; anything unexpected here yields `None`, never an error.
//!
//! ```text
//! Certificate ::= SEQUENCE { tbsCertificate SEQUENCE {
//!     [0] EXPLICIT version OPTIONAL, serialNumber INTEGER, signature SEQUENCE,
//!     issuer SEQUENCE, validity SEQUENCE { notBefore Time, notAfter Time }, ... }, ... }
//! ```

use rustls::pki_types::{CertificateDer, pem::PemObject};

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const VERSION: u8 = 0xa0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// What the server reports about its current certificate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertSummary {
    /// Serial number as lowercase hex, leading zero bytes removed (`"03e9"` for 1001).
    pub serial: Option<String>,
    /// `notBefore` as seconds since the Unix epoch.
    pub not_before: Option<i64>,
    /// `notAfter` as seconds since the Unix epoch.
    pub not_after: Option<i64>,
}

/// Reads the serial, `notBefore` and `notAfter` of a DER certificate.
pub fn summarize(der: &[u8]) -> CertSummary {
    let mut out = CertSummary::default();
    let Some((cert, _)) = element(der, SEQUENCE) else {
        return out;
    };
    let Some((mut tbs, _)) = element(cert, SEQUENCE) else {
        return out;
    };
    if tbs.first() == Some(&VERSION) {
        let Some((_, rest)) = element(tbs, VERSION) else {
            return out;
        };
        tbs = rest;
    }
    let Some((serial, rest)) = element(tbs, INTEGER) else {
        return out;
    };
    out.serial = Some(hex(serial));
    let Some((_signature, rest)) = element(rest, SEQUENCE) else {
        return out;
    };
    let Some((_issuer, rest)) = element(rest, SEQUENCE) else {
        return out;
    };
    let Some((validity, _)) = element(rest, SEQUENCE) else {
        return out;
    };
    let Some((tag, not_before, rest)) = any_element(validity) else {
        return out;
    };
    if tag != UTC_TIME && tag != GENERALIZED_TIME {
        return out;
    }
    out.not_before = parse_time(tag, not_before);
    if let Some((tag, not_after, _)) = any_element(rest) {
        out.not_after = parse_time(tag, not_after);
    }
    out
}

/// [`summarize`] of the first certificate of a PEM text (all `None` when there is none).
pub fn summarize_pem(pem: &str) -> CertSummary {
    match CertificateDer::pem_slice_iter(pem.as_bytes()).next() {
        Some(Ok(der)) => summarize(der.as_ref()),
        _ => CertSummary::default(),
    }
}

/// Splits one element with the expected tag off the front: (contents, rest).
fn element(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    match any_element(input)? {
        (t, contents, rest) if t == tag => Some((contents, rest)),
        _ => None,
    }
}

/// Splits any one element off the front: (tag, contents, rest).
fn any_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, input) = input.split_first()?;
    let (&first, mut input) = input.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || input.len() < n {
            return None;
        }
        let (bytes, rest) = input.split_at(n);
        input = rest;
        bytes
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b))
    };
    if input.len() < len {
        return None;
    }
    let (contents, rest) = input.split_at(len);
    Some((tag, contents, rest))
}

fn hex(bytes: &[u8]) -> String {
    let start = bytes
        .iter()
        .position(|&b| b != 0)
        .unwrap_or(bytes.len().saturating_sub(1));
    bytes
        .get(start..)
        .unwrap_or_default()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `YYMMDDHHMMSSZ` (UTCTime) or `YYYYMMDDHHMMSSZ` (GeneralizedTime), as RFC 5280 requires.
fn parse_time(tag: u8, text: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(text).ok()?.strip_suffix('Z')?;
    let (year, rest) = match tag {
        UTC_TIME if text.len() == 12 => {
            let yy: i64 = text.get(..2)?.parse().ok()?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, text.get(2..)?)
        }
        GENERALIZED_TIME if text.len() == 14 => (text.get(..4)?.parse().ok()?, text.get(4..)?),
        _ => return None,
    };
    let field = |i: usize| -> Option<i64> { rest.get(i..i + 2)?.parse().ok() };
    let (month, day) = (field(0)?, field(2)?);
    let (hour, minute, second) = (field(4)?, field(6)?, field(8)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some(days * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(parse_time(UTC_TIME, b"491231235959Z"), Some(2_524_607_999));
        assert_eq!(
            parse_time(GENERALIZED_TIME, b"20500101000000Z"),
            Some(2_524_608_000)
        );
        assert_eq!(parse_time(UTC_TIME, b"garbage"), None);
    }

    #[test]
    fn garbage_is_none() {
        assert_eq!(summarize(b""), CertSummary::default());
        assert_eq!(summarize(&[0x30, 0x84, 0xff]), CertSummary::default());
        assert_eq!(hex(&[0, 0, 0x03, 0xe9]), "03e9");
        assert_eq!(hex(&[0]), "00");
    }
}
