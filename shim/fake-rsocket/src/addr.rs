//! `struct sockaddr` bytes <-> `SocketAddr`, and the rsocket <-> kernel port translation.
//!
//! Conversions work on byte slices so they stay safe; the FFI layer only turns the caller's
//! pointer and length into a slice (and copies results back).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::errno::{Res, err};

/// Size of `struct sockaddr_in`.
pub(crate) const SOCKADDR_IN_LEN: usize = 16;
/// Size of `struct sockaddr_in6`; also the largest address this provider produces.
pub(crate) const SOCKADDR_IN6_LEN: usize = 28;

/// Reads a `sockaddr_in` or `sockaddr_in6` from its C bytes.
pub(crate) fn decode(bytes: &[u8]) -> Res<SocketAddr> {
    let Some(family) = bytes.get(..2) else {
        return err(libc::EINVAL);
    };
    let family = i32::from(u16::from_ne_bytes([family[0], family[1]]));
    match family {
        libc::AF_INET => {
            let Some(b) = bytes.get(..SOCKADDR_IN_LEN) else {
                return err(libc::EINVAL);
            };
            let port = u16::from_be_bytes([b[2], b[3]]);
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Ok(SocketAddr::V4(SocketAddrV4::new(ip, port)))
        }
        libc::AF_INET6 => {
            let Some(b) = bytes.get(..SOCKADDR_IN6_LEN) else {
                return err(libc::EINVAL);
            };
            let port = u16::from_be_bytes([b[2], b[3]]);
            let flowinfo = u32::from_ne_bytes([b[4], b[5], b[6], b[7]]);
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&b[8..24]);
            let scope_id = u32::from_ne_bytes([b[24], b[25], b[26], b[27]]);
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(octets),
                port,
                flowinfo,
                scope_id,
            )))
        }
        _ => err(libc::EAFNOSUPPORT),
    }
}

/// Writes `addr` as C `sockaddr_in`/`sockaddr_in6` bytes; returns the buffer and its length.
pub(crate) fn encode(addr: SocketAddr) -> ([u8; SOCKADDR_IN6_LEN], usize) {
    let mut b = [0u8; SOCKADDR_IN6_LEN];
    match addr {
        SocketAddr::V4(a) => {
            b[..2].copy_from_slice(&family_bytes(libc::AF_INET));
            b[2..4].copy_from_slice(&a.port().to_be_bytes());
            b[4..8].copy_from_slice(&a.ip().octets());
            (b, SOCKADDR_IN_LEN)
        }
        SocketAddr::V6(a) => {
            b[..2].copy_from_slice(&family_bytes(libc::AF_INET6));
            b[2..4].copy_from_slice(&a.port().to_be_bytes());
            b[4..8].copy_from_slice(&a.flowinfo().to_ne_bytes());
            b[8..24].copy_from_slice(&a.ip().octets());
            b[24..28].copy_from_slice(&a.scope_id().to_ne_bytes());
            (b, SOCKADDR_IN6_LEN)
        }
    }
}

fn family_bytes(family: i32) -> [u8; 2] {
    // AF_INET (2) and AF_INET6 (10) always fit sa_family_t (u16).
    u16::try_from(family).unwrap_or_default().to_ne_bytes()
}

/// The kernel TCP address behind rsocket address `addr`. Port 0 stays 0 (pick one); a port
/// that would translate to kernel port 0 cannot be represented.
pub(crate) fn to_kernel(addr: SocketAddr, offset: u16) -> Res<SocketAddr> {
    let mut k = addr;
    if addr.port() != 0 {
        let port = addr.port().wrapping_add(offset);
        if port == 0 {
            return err(libc::EADDRNOTAVAIL);
        }
        k.set_port(port);
    }
    Ok(k)
}

/// The rsocket address a kernel TCP address stands for (the inverse of [`to_kernel`]).
pub(crate) fn to_rsocket(addr: SocketAddr, offset: u16) -> SocketAddr {
    let mut r = addr;
    if addr.port() != 0 {
        r.set_port(addr.port().wrapping_sub(offset));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_round_trip() {
        let a: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let (b, len) = encode(a);
        assert_eq!(len, SOCKADDR_IN_LEN);
        assert_eq!(decode(&b[..len]), Ok(a));
    }

    #[test]
    fn v6_round_trip() {
        let a = SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::LOCALHOST, 443, 7, 3));
        let (b, len) = encode(a);
        assert_eq!(len, SOCKADDR_IN6_LEN);
        assert_eq!(decode(&b[..len]), Ok(a));
    }

    #[test]
    fn bad_inputs() {
        assert_eq!(decode(&[]), err(libc::EINVAL));
        let (b, _) = encode("10.0.0.1:1".parse().unwrap());
        assert_eq!(decode(&b[..8]), err(libc::EINVAL));
        let mut unix = [0u8; 16];
        unix[..2].copy_from_slice(&(libc::AF_UNIX as u16).to_ne_bytes());
        assert_eq!(decode(&unix), err(libc::EAFNOSUPPORT));
    }

    #[test]
    fn port_translation_is_a_bijection() {
        let a: SocketAddr = "127.0.0.1:50000".parse().unwrap();
        let k = to_kernel(a, 20_000).unwrap();
        assert_eq!(k.port(), 4464);
        assert_eq!(to_rsocket(k, 20_000), a);
        let zero: SocketAddr = "127.0.0.1:0".parse().unwrap();
        assert_eq!(to_kernel(zero, 20_000), Ok(zero));
        assert_eq!(to_rsocket(zero, 20_000), zero);
        let wraps_to_zero: SocketAddr = "127.0.0.1:45536".parse().unwrap();
        assert_eq!(to_kernel(wraps_to_zero, 20_000), err(libc::EADDRNOTAVAIL));
    }
}
