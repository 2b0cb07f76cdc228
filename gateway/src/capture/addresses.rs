//! The addresses of a network namespace that another node could reach: what the local
//! virt-handler publishes as its migration address is one of them. Read inside the namespace
//! (on a thread that enters it, `super::netns::run_in`). The kube side publishes them for
//! peers (`crate::kube::virt_handler`); a target gateway dials only them
//! (`crate::migration`).

use std::{net::IpAddr, path::Path};

use nix::ifaddrs::getifaddrs;

use super::netns::{self, NetnsError};

/// Why the addresses could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AddressError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("listing interface addresses")]
    List(#[source] nix::Error),
}

/// Whether another node could reach virt-handler at `ip`: not loopback, unspecified,
/// multicast or link-local (IPv4 169.254/16, IPv6 fe80::/10).
pub fn reachable(ip: IpAddr) -> bool {
    if ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() {
        return false;
    }
    match ip {
        IpAddr::V4(v4) => !v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) != 0xfe80,
    }
}

/// The reachable addresses of every interface in the network namespace at `path`, sorted,
/// without duplicates.
pub fn addresses_in(path: &Path) -> Result<Vec<IpAddr>, AddressError> {
    let listed = netns::run_in(path, || -> Result<Vec<IpAddr>, nix::Error> {
        Ok(getifaddrs()?
            .filter_map(|ifa| {
                let addr = ifa.address?;
                addr.as_sockaddr_in()
                    .map(|v4| IpAddr::V4(v4.ip()))
                    .or_else(|| addr.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
            })
            .collect())
    })?
    .map_err(AddressError::List)?;
    let mut addrs: Vec<IpAddr> = listed.into_iter().filter(|ip| reachable(*ip)).collect();
    addrs.sort();
    addrs.dedup();
    Ok(addrs)
}
