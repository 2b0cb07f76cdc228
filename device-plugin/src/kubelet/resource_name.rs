//! The socket file names derived from extended resource names.
//!
//! Whether a name is an extended resource name at all is kubelet's rule, which the injector
//! shares: [`validate_extended_resource_name`](rdma_streams_common::names::validate_extended_resource_name).

use std::hash::Hasher;

use fnv::FnvHasher;

/// Longest socket file name [`socket_file_name`] returns (with `.sock`). Unix socket paths are
/// limited to 107 bytes and the kubelet's `device-plugins/` directory already takes 32 of them.
const SOCKET_FILE_NAME_MAX: usize = 64;

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
        // FNV-1a 64: small, stable across releases and platforms (std's hasher is not).
        let mut hasher = FnvHasher::default();
        hasher.write(resource.as_bytes());
        let hash = format!("{:016x}", hasher.finish());
        // The stem is ASCII, so any byte index is a char boundary.
        stem.truncate(SOCKET_FILE_NAME_MAX - suffix.len() - hash.len() - 1);
        stem.push('-');
        stem.push_str(&hash);
    }
    stem.push_str(suffix);
    stem
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // The hash is part of socket paths kubelet already knows: it must never change.
        assert_eq!(
            a,
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-eff93954afe8191a.sock"
        );
    }
}
