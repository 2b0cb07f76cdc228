//! Extended resource names, judged as kubelet judges them.
//!
//! kubelet refuses a device plugin's `Register` whose resource name fails
//! `v1helper.IsExtendedResourceName`, and the API server refuses a pod whose container asks for
//! a `domain/name` resource that fails the same function. [`validate_extended_resource_name`]
//! applies those rules up front, so that a bad name is a config error with a reason instead of
//! a silent registration loop (the plugin) or a pod that stays Pending (the injector).

use thiserror::Error;

use super::syntax::{DNS1123_SUBDOMAIN_MAX, check_dns1123_subdomain, check_qualified_name_part};

/// The prefix of quota names; kubelet checks that `requests.<name>` is a qualified name, and a
/// name may not start with it (`DefaultResourceRequestsPrefix`).
const REQUESTS_PREFIX: &str = "requests.";
/// Kubernetes' own resources (`ResourceDefaultNamespacePrefix`), matched anywhere in the name.
const NATIVE_NAMESPACE: &str = "kubernetes.io/";

/// Why a name is not an extended resource name.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ResourceNameError {
    #[error(
        "resource name `{name}` has no domain: an extended resource name is `domain/name`, \
         like `rdma-streams.io/hca`"
    )]
    NoDomain { name: String },
    #[error("resource name `{name}` has more than one `/`: expected `domain/name`")]
    TooManySlashes { name: String },
    #[error(
        "resource name `{name}` is reserved: a name containing `kubernetes.io/` is one of \
         Kubernetes' own resources"
    )]
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

/// Checks `name` the way kubelet's `IsExtendedResourceName` does (the API server uses the same
/// function for a container's `domain/name` resources).
///
/// - It must be `domain/name` with exactly one `/`.
/// - It must not contain `kubernetes.io/` (kubelet tests for the substring, so
///   `kubernetes.io/x`, `foo.kubernetes.io/x` and `xkubernetes.io/x` are all native names;
///   other domains are free, `k8s.io` included).
/// - It must not start with `requests.` (the name part may: `example.com/requests.x` is fine).
/// - `requests.<name>` must be a qualified name: the domain a lower-case DNS-1123 subdomain of
///   at most 244 characters (253 with the `requests.` kubelet puts in front), the name part at
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The edges of the `kubernetes.io/` and `requests.` rules, where a plausible reading of
    /// either (a domain suffix match, a prefix check on the name part) gives the wrong answer;
    /// kubelet's answer for each.
    #[test]
    fn reserved_and_requests_rules_at_their_edges() {
        use ResourceNameError as E;
        assert!(matches!(
            validate_extended_resource_name("xkubernetes.io/hca"),
            Err(E::Reserved { .. })
        ));
        assert!(matches!(
            validate_extended_resource_name("requests.example.com/hca"),
            Err(E::RequestsPrefix { .. })
        ));
        assert_eq!(
            validate_extended_resource_name("example.com/requests.x"),
            Ok(())
        );
        assert_eq!(validate_extended_resource_name("foo.k8s.io/hca"), Ok(()));
    }

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
            "k8s.io/hca",
            "example.com/requests",
            "example.com/kubernetes.io",
            "requests/hca",
        ] {
            assert_eq!(validate_extended_resource_name(name), Ok(()), "{name}");
        }
        // Domain at its limit: 253 - len("requests.") = 244 characters; labels may be longer
        // than 63, as Kubernetes limits only the whole subdomain.
        let domain = format!("{}.{}", "a".repeat(100), "b".repeat(143));
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
            ("requests.x/y", |e| matches!(e, E::RequestsPrefix { .. })),
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
        // 245 characters: a valid subdomain, but not once kubelet puts `requests.` in front.
        let long_domain = format!("{}.io/x", "a".repeat(242));
        assert!(matches!(
            validate_extended_resource_name(&long_domain),
            Err(E::BadDomain { .. })
        ));
    }
}
