//! Extended resource names and the socket file names derived from them.
//!
//! kubelet rejects a `Register` whose resource name is not an extended resource name
//! (`v1helper.IsExtendedResourceName`), and it does so only at registration time, long after
//! the config was read. [`validate_extended_resource_name`] applies the same rules up front so
//! that a bad name is a config error with a reason, not a silent registration loop.

use thiserror::Error;

/// Longest DNS-1123 subdomain (the domain part, once kubelet has prefixed it).
const DNS1123_SUBDOMAIN_MAX: usize = 253;
/// Longest name part of a qualified name.
const QUALIFIED_NAME_MAX: usize = 63;
/// The prefix kubelet reserves for quota names; kubelet validates `requests.<name>`.
const REQUESTS_PREFIX: &str = "requests.";
/// Kubernetes' own namespace (`*kubernetes.io/`), reserved for native resources.
const NATIVE_NAMESPACE: &str = "kubernetes.io/";
/// Longest socket file name [`socket_file_name`] returns (with `.sock`). Unix socket paths are
/// limited to 107 bytes and the kubelet's `device-plugins/` directory already takes 32 of them.
const SOCKET_FILE_NAME_MAX: usize = 64;

/// Why a name is not an extended resource name.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ResourceNameError {
    #[error("resource name `{name}` has no domain: an extended resource name is `domain/name`")]
    NoDomain { name: String },
    #[error("resource name `{name}` has more than one `/`: expected `domain/name`")]
    TooManySlashes { name: String },
    #[error("resource name `{name}` is in the reserved `kubernetes.io` domain")]
    Reserved { name: String },
    #[error("resource name `{name}` must not start with `requests.`")]
    RequestsPrefix { name: String },
    #[error("domain `{domain}` of resource name `{name}` is not a DNS-1123 subdomain: {reason}")]
    BadDomain {
        name: String,
        domain: String,
        reason: String,
    },
    #[error("name part `{part}` of resource name `{name}` is not a qualified name: {reason}")]
    BadName {
        name: String,
        part: String,
        reason: String,
    },
}

/// Checks `name` the way kubelet's `IsExtendedResourceName` does.
///
/// - It must be `domain/name` with exactly one `/`.
/// - It must not contain `kubernetes.io/` anywhere (kubelet checks with a substring test, so
///   `kubernetes.io/x`, `foo.kubernetes.io/x` and `xkubernetes.io/x` are all native names).
/// - It must not start with `requests.`.
/// - `requests.<name>` must be a qualified name: the domain a lower-case DNS-1123 subdomain
///   (at most 253 characters including the `requests.` kubelet puts in front), the name part at
///   most 63 characters of `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`.
pub fn validate_extended_resource_name(name: &str) -> Result<(), ResourceNameError> {
    let owned = || name.to_string();
    let Some((domain, part)) = name.split_once('/') else {
        return Err(ResourceNameError::NoDomain { name: owned() });
    };
    if part.contains('/') {
        return Err(ResourceNameError::TooManySlashes { name: owned() });
    }
    if name.contains(NATIVE_NAMESPACE) {
        return Err(ResourceNameError::Reserved { name: owned() });
    }
    if name.starts_with(REQUESTS_PREFIX) {
        return Err(ResourceNameError::RequestsPrefix { name: owned() });
    }
    if let Err(reason) =
        check_dns1123_subdomain(domain, DNS1123_SUBDOMAIN_MAX - REQUESTS_PREFIX.len())
    {
        return Err(ResourceNameError::BadDomain {
            name: owned(),
            domain: domain.to_string(),
            reason,
        });
    }
    if let Err(reason) = check_qualified_name_part(part) {
        return Err(ResourceNameError::BadName {
            name: owned(),
            part: part.to_string(),
            reason,
        });
    }
    Ok(())
}

/// A DNS-1123 subdomain: dot-separated labels of `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most
/// `max` characters in all.
fn check_dns1123_subdomain(s: &str, max: usize) -> Result<(), String> {
    if s.is_empty() {
        return Err("it is empty".to_string());
    }
    if s.len() > max {
        return Err(format!(
            "it is {} characters long, at most {max} allowed",
            s.len()
        ));
    }
    for label in s.split('.') {
        if label.is_empty() {
            return Err("it has an empty label (a leading, trailing or double `.`)".to_string());
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
        {
            return Err(format!(
                "`{c}` is not allowed (only lower-case letters, digits, `-` and `.`)"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("label `{label}` starts or ends with `-`"));
        }
    }
    Ok(())
}

/// The name part of a qualified name: `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63
/// characters.
fn check_qualified_name_part(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("it is empty".to_string());
    }
    if s.len() > QUALIFIED_NAME_MAX {
        return Err(format!(
            "it is {} characters long, at most {QUALIFIED_NAME_MAX} allowed",
            s.len()
        ));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "`{c}` is not allowed (only letters, digits, `-`, `_` and `.`)"
        ));
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !alnum(s.chars().next()) || !alnum(s.chars().next_back()) {
        return Err("it must start and end with a letter or digit".to_string());
    }
    Ok(())
}

/// The bare socket file name (kubelet's `RegisterRequest.endpoint`) for a resource, for
/// example `rdma-streams.io_hca.sock` for `rdma-streams.io/hca`.
///
/// `/` becomes `_`, and so does any character outside `[A-Za-z0-9._-]`, so the result is
/// always a single path component. For a valid extended resource name the mapping is
/// one-to-one: a domain cannot contain `_`, so the first `_` marks where the `/` was. The
/// result never is `kubelet.sock` (kubelet's own socket) and never starts with `.` (the plugin
/// watcher ignores dot files). A name that would make the file name longer than 64 characters
/// is cut and given a stable hash of the whole name, so that socket paths stay below the Unix
/// limit.
pub fn socket_file_name(resource: &str) -> String {
    let mut stem: String = resource
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if stem.is_empty() || stem.starts_with('.') || stem == "kubelet" {
        stem.insert_str(0, "dp_");
    }
    let suffix = ".sock";
    if stem.len() + suffix.len() > SOCKET_FILE_NAME_MAX {
        let hash = format!("{:016x}", fnv1a64(resource.as_bytes()));
        // The stem is ASCII, so any byte index is a char boundary.
        stem.truncate(SOCKET_FILE_NAME_MAX - suffix.len() - hash.len() - 1);
        stem.push('-');
        stem.push_str(&hash);
    }
    stem.push_str(suffix);
    stem
}

/// FNV-1a, 64 bit: small, stable across releases and platforms (std's hasher is not).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_names() {
        for name in [
            "rdma-streams.io/hca",
            "rdma/hca_shared_devices_a",
            "example.com/A.b-c_d9",
            "nvidia.com/gpu",
            "a/b",
            "x1.y2-z/0",
            "kubernetes.iox/foo",
        ] {
            assert_eq!(validate_extended_resource_name(name), Ok(()), "{name}");
        }
        // Domain at its limit: 253 - len("requests.") = 244 characters.
        let label = "a".repeat(60);
        let domain = format!("{label}.{label}.{label}.{}", "b".repeat(61));
        assert_eq!(domain.len(), 244);
        assert_eq!(
            validate_extended_resource_name(&format!("{domain}/x")),
            Ok(())
        );
        assert_eq!(
            validate_extended_resource_name(&format!("a.io/{}", "n".repeat(63))),
            Ok(())
        );
    }

    #[test]
    fn bad_names() {
        use ResourceNameError as E;
        type Check = fn(&E) -> bool;
        let cases: &[(&str, Check)] = &[
            ("hca", |e| matches!(e, E::NoDomain { .. })),
            ("", |e| matches!(e, E::NoDomain { .. })),
            ("a.io/b/c", |e| matches!(e, E::TooManySlashes { .. })),
            ("kubernetes.io/x", |e| matches!(e, E::Reserved { .. })),
            ("foo.kubernetes.io/x", |e| matches!(e, E::Reserved { .. })),
            ("xkubernetes.io/x", |e| matches!(e, E::Reserved { .. })),
            ("requests.example.com/x", |e| {
                matches!(e, E::RequestsPrefix { .. })
            }),
            ("/x", |e| matches!(e, E::BadDomain { .. })),
            ("Example.com/x", |e| matches!(e, E::BadDomain { .. })),
            ("exa_mple.com/x", |e| matches!(e, E::BadDomain { .. })),
            ("-a.com/x", |e| matches!(e, E::BadDomain { .. })),
            ("a-.com/x", |e| matches!(e, E::BadDomain { .. })),
            ("a..com/x", |e| matches!(e, E::BadDomain { .. })),
            ("a.com./x", |e| matches!(e, E::BadDomain { .. })),
            ("a.com/", |e| matches!(e, E::BadName { .. })),
            ("a.com/-x", |e| matches!(e, E::BadName { .. })),
            ("a.com/x_", |e| matches!(e, E::BadName { .. })),
            ("a.com/x y", |e| matches!(e, E::BadName { .. })),
            ("a.com/hcä", |e| matches!(e, E::BadName { .. })),
        ];
        for (name, check) in cases {
            let err = validate_extended_resource_name(name).expect_err(name);
            assert!(check(&err), "{name}: unexpected {err:?}");
            assert!(err.to_string().contains(name), "{err}");
        }
        let long_part = format!("a.io/{}", "n".repeat(64));
        assert!(matches!(
            validate_extended_resource_name(&long_part),
            Err(E::BadName { .. })
        ));
        let long_domain = format!("{}.io/x", "a".repeat(242));
        assert!(matches!(
            validate_extended_resource_name(&long_domain),
            Err(E::BadDomain { .. })
        ));
    }

    #[test]
    fn socket_names() {
        assert_eq!(
            socket_file_name("rdma-streams.io/hca"),
            "rdma-streams.io_hca.sock"
        );
        assert_eq!(
            socket_file_name("rdma/hca_shared_devices_a"),
            "rdma_hca_shared_devices_a.sock"
        );
        assert_eq!(socket_file_name("kubelet"), "dp_kubelet.sock");
        assert_eq!(socket_file_name(".x/y"), "dp_.x_y.sock");
        assert_eq!(socket_file_name(""), "dp_.sock");
        assert_eq!(socket_file_name("a b/../c"), "a_b_.._c.sock");

        let long_a = format!("{}.io/hca", "a".repeat(100));
        let long_b = format!("{}.io/hcb", "a".repeat(100));
        let (a, b) = (socket_file_name(&long_a), socket_file_name(&long_b));
        assert_eq!(a.len(), SOCKET_FILE_NAME_MAX);
        assert_ne!(a, b);
        assert_eq!(a, socket_file_name(&long_a), "stable");
        assert!(a.ends_with(".sock") && !a.contains('/'));
    }
}
