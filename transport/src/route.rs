//! Which local address the kernel would send from to reach a peer: the source both ends of an
//! RDMA connection are bound to (the connection manager resolves the same route), so that the
//! address the peer sees is the one the connect names.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

/// The source address of the route to `peer`, from an unsent UDP connect in `peer`'s family
/// (no packet leaves).
pub fn source_for(peer: SocketAddr) -> io::Result<IpAddr> {
    let any: SocketAddr = match peer {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let probe = UdpSocket::bind(any)?;
    probe.connect(peer)?;
    Ok(probe.local_addr()?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_to_loopback_leaves_from_loopback() {
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(source_for(peer).unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
}
