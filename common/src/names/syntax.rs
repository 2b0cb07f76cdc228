//! The name syntaxes of Kubernetes' `k8s.io/apimachinery` validation, as the API server and
//! kubelet apply them: DNS-1123 labels and subdomains, and the name part of a qualified name.
//! Lengths are in bytes, as Go's `len` counts them; every allowed character is ASCII.

/// Longest DNS-1123 label (`DNS1123LabelMaxLength`).
pub(super) const DNS1123_LABEL_MAX: usize = 63;
/// Longest DNS-1123 subdomain (`DNS1123SubdomainMaxLength`).
pub(super) const DNS1123_SUBDOMAIN_MAX: usize = 253;
/// Longest name part of a qualified name.
pub(super) const QUALIFIED_NAME_MAX: usize = 63;

/// Whether `name` is a DNS-1123 label (`IsDNS1123Label`): 1 to 63 characters of
/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`. Namespace names are labels.
pub fn is_dns1123_label(name: &str) -> bool {
    name.len() <= DNS1123_LABEL_MAX && check_label(name).is_ok()
}

/// Whether `name` is a DNS-1123 subdomain (`IsDNS1123Subdomain`): dot-separated labels, at most
/// 253 characters in all. Kubernetes limits the whole, not each label. Most object names are
/// subdomains.
pub fn is_dns1123_subdomain(name: &str) -> bool {
    check_dns1123_subdomain(name, DNS1123_SUBDOMAIN_MAX).is_ok()
}

/// A DNS-1123 subdomain of at most `max` characters, or why not.
pub(super) fn check_dns1123_subdomain(s: &str, max: usize) -> Result<(), String> {
    if s.is_empty() {
        return Err("it is empty".to_string());
    }
    if s.len() > max {
        return Err(format!(
            "it is {} characters long, at most {max} allowed",
            s.len()
        ));
    }
    s.split('.').try_for_each(check_label)
}

/// One label of a subdomain, without its length limit.
fn check_label(label: &str) -> Result<(), String> {
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
    Ok(())
}

/// The name part of a qualified name (`IsQualifiedName` after the `/`): 1 to 63 characters of
/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, or why not.
pub(super) fn check_qualified_name_part(s: &str) -> Result<(), String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        for good in ["a", "rdma", "a-b", "0", "9x", &"a".repeat(63)] {
            assert!(is_dns1123_label(good), "{good}");
        }
        for bad in ["", "a.b", "A", "-a", "a-", "a_b", "ä", &"a".repeat(64)] {
            assert!(!is_dns1123_label(bad), "{bad}");
        }
    }

    #[test]
    fn subdomains() {
        for good in ["rdma-streams.io", "a", "a.b.c", "1.2.3"] {
            assert!(is_dns1123_subdomain(good), "{good}");
        }
        // Kubernetes limits the whole subdomain, not its labels.
        assert!(is_dns1123_subdomain(&format!("{}.io", "a".repeat(100))));
        let longest = format!("{}.{}", "a".repeat(126), "b".repeat(126));
        assert_eq!(longest.len(), 253);
        assert!(is_dns1123_subdomain(&longest));
        assert!(!is_dns1123_subdomain(&format!("{longest}c")));
        for bad in [
            "", "Rdma.io", ".a", "a.", "a..b", "-a.b", "a-.b", "a_b.io", "a/b",
        ] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn qualified_name_parts() {
        for good in ["a", "A", "hca", "A.b-c_d9", "0", &"n".repeat(63)] {
            assert_eq!(check_qualified_name_part(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "_a",
            "a_",
            ".a",
            "a.",
            "a b",
            "a/b",
            "hcä",
            &"n".repeat(64),
        ] {
            assert!(check_qualified_name_part(bad).is_err(), "{bad}");
        }
    }
}
