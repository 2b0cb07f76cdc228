//! Which local address the kernel would send from to reach a peer: the source both ends of an
//! RDMA connection are bound to (the connection manager resolves the same route), so that the
//! address the peer sees is the one the connect names.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;

use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, SockaddrStorage, connect, getsockname, socket,
};

use crate::fd::to_io;

/// The source address of the route to `peer`, from an unsent UDP connect in `peer`'s family
/// (no packet leaves; the connect binds the socket, so it takes no bind of its own: four
/// system calls).
pub fn source_for(peer: SocketAddr) -> io::Result<IpAddr> {
    let family = match peer {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let probe = socket(family, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None).map_err(to_io)?;
    connect(probe.as_raw_fd(), &SockaddrStorage::from(peer)).map_err(to_io)?;
    let local: SockaddrStorage = getsockname(probe.as_raw_fd()).map_err(to_io)?;
    if let Some(v4) = local.as_sockaddr_in() {
        return Ok(IpAddr::V4(v4.ip()));
    }
    local
        .as_sockaddr_in6()
        .map(|v6| IpAddr::V6(v6.ip()))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no IP source address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn the_route_to_loopback_leaves_from_loopback() {
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(source_for(peer).unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        let peer: SocketAddr = "[::1]:9".parse().unwrap();
        // A host without IPv6 on loopback has no route: an error, never a wrong address.
        if let Ok(ip) = source_for(peer) {
            assert_eq!(ip, IpAddr::V6(Ipv6Addr::LOCALHOST));
        }
    }
}
