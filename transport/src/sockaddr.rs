//! `SocketAddr` <-> C `struct sockaddr` bytes, in safe Rust: the one conversion of the
//! transport and the shim (whose hooks read the app's addresses with [`from_bytes`]).
//!
//! [`RawSockAddr`] is an aligned buffer big enough for any socket address
//! (`sizeof(struct sockaddr_storage)`); the provider wrappers and the shim's
//! `getsockname`/`getpeername` pass pointers into it, and the conversions here only read and
//! write its bytes.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use libc::{sockaddr, socklen_t};

/// `sizeof(struct sockaddr_storage)`.
const STORAGE_LEN: usize = 128;
const SOCKADDR_IN_LEN: usize = 16;
const SOCKADDR_IN6_LEN: usize = 28;

/// A socket address in C layout, aligned like `struct sockaddr_storage`.
#[derive(Clone)]
#[repr(C, align(8))]
pub struct RawSockAddr {
    bytes: [u8; STORAGE_LEN],
    len: socklen_t,
}

impl RawSockAddr {
    /// An empty buffer for the provider to fill (`raccept`, `rgetsockname`, ...).
    pub fn empty() -> RawSockAddr {
        RawSockAddr {
            bytes: [0; STORAGE_LEN],
            len: 0,
        }
    }

    /// `addr` as a `sockaddr_in` / `sockaddr_in6`.
    pub fn from_addr(addr: SocketAddr) -> RawSockAddr {
        let mut raw = RawSockAddr::empty();
        let b = &mut raw.bytes;
        let len = match addr {
            SocketAddr::V4(a) => {
                b[..2].copy_from_slice(&family(libc::AF_INET));
                b[2..4].copy_from_slice(&a.port().to_be_bytes());
                b[4..8].copy_from_slice(&a.ip().octets());
                SOCKADDR_IN_LEN
            }
            SocketAddr::V6(a) => {
                b[..2].copy_from_slice(&family(libc::AF_INET6));
                b[2..4].copy_from_slice(&a.port().to_be_bytes());
                b[4..8].copy_from_slice(&a.flowinfo().to_ne_bytes());
                b[8..24].copy_from_slice(&a.ip().octets());
                b[24..28].copy_from_slice(&a.scope_id().to_ne_bytes());
                SOCKADDR_IN6_LEN
            }
        };
        raw.set_len(socklen_t::try_from(len).unwrap_or(0));
        raw
    }

    /// The address the bytes hold (`AF_INET`/`AF_INET6` only): [`from_bytes`] of the bytes
    /// written.
    pub fn to_addr(&self) -> io::Result<SocketAddr> {
        from_bytes(self.bytes.get(..self.len as usize).unwrap_or_default())
    }

    /// The address for a call that reads it (`bind`), [`socklen`](Self::socklen) bytes.
    pub fn as_ptr(&self) -> *const sockaddr {
        self.bytes.as_ptr().cast()
    }

    /// How many bytes the address takes.
    pub fn socklen(&self) -> socklen_t {
        self.len
    }

    pub fn as_mut_ptr(&mut self) -> *mut sockaddr {
        self.bytes.as_mut_ptr().cast()
    }

    /// Room for an address, in bytes.
    pub fn capacity(&self) -> socklen_t {
        socklen_t::try_from(STORAGE_LEN).unwrap_or(0)
    }

    /// Records how many bytes the provider wrote (clamped to the buffer: a provider reporting
    /// a longer, truncated address must not make us read past it).
    pub fn set_len(&mut self, len: socklen_t) {
        self.len = len.min(self.capacity());
    }
}

/// The address a C `struct sockaddr` of `bytes.len()` bytes holds (`sockaddr_in` or
/// `sockaddr_in6`; fields in the kernel's layout, no alignment needed). `EINVAL` when the bytes
/// are too few for their family, `EAFNOSUPPORT` for any other family (`AF_UNIX`, ...).
pub fn from_bytes(b: &[u8]) -> io::Result<SocketAddr> {
    let invalid = || io::Error::from_raw_os_error(libc::EINVAL);
    let fam = b.get(..2).ok_or_else(invalid)?;
    match i32::from(u16::from_ne_bytes([fam[0], fam[1]])) {
        libc::AF_INET => {
            let b = b.get(..SOCKADDR_IN_LEN).ok_or_else(invalid)?;
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Ok(SocketAddrV4::new(ip, u16::from_be_bytes([b[2], b[3]])).into())
        }
        libc::AF_INET6 => {
            let b = b.get(..SOCKADDR_IN6_LEN).ok_or_else(invalid)?;
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&b[8..24]);
            Ok(SocketAddrV6::new(
                Ipv6Addr::from(octets),
                u16::from_be_bytes([b[2], b[3]]),
                u32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
                u32::from_ne_bytes([b[24], b[25], b[26], b[27]]),
            )
            .into())
        }
        _ => Err(io::Error::from_raw_os_error(libc::EAFNOSUPPORT)),
    }
}

fn family(af: i32) -> [u8; 2] {
    u16::try_from(af).unwrap_or_default().to_ne_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for a in [
            "127.0.0.1:8080".parse::<SocketAddr>().unwrap(),
            SocketAddrV6::new(Ipv6Addr::LOCALHOST, 9, 1, 2).into(),
        ] {
            let raw = RawSockAddr::from_addr(a);
            assert_eq!(raw.to_addr().unwrap(), a);
        }
    }

    #[test]
    fn reads_unaligned_bytes_of_each_family() {
        for a in [
            "198.18.0.2:5201".parse::<SocketAddr>().unwrap(),
            SocketAddrV6::new("fe80::1".parse().unwrap(), 443, 7, 2).into(),
            // v4-mapped: stays an IPv6 address, as the kernel reports it.
            SocketAddrV6::new(Ipv4Addr::new(10, 1, 2, 3).to_ipv6_mapped(), 80, 0, 0).into(),
        ] {
            let raw = RawSockAddr::from_addr(a);
            let bytes = &raw.bytes[..raw.len as usize];
            // At an odd address, as a caller's buffer may be.
            let mut unaligned = vec![0u8];
            unaligned.extend_from_slice(bytes);
            assert_eq!(from_bytes(&unaligned[1..]).unwrap(), a);
            let short = from_bytes(&bytes[..bytes.len() - 1]).unwrap_err();
            assert_eq!(short.raw_os_error(), Some(libc::EINVAL), "short length");
        }
        for short in [&[][..], &[2][..]] {
            let err = from_bytes(short).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
        }
        let mut unix = vec![0u8; 110];
        unix[..2].copy_from_slice(&family(libc::AF_UNIX));
        let err = from_bytes(&unix).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EAFNOSUPPORT), "not INET");
    }

    #[test]
    fn aligned_for_sockaddr_in6() {
        let raw = RawSockAddr::empty();
        assert_eq!(std::ptr::addr_of!(raw.bytes) as usize % 8, 0);
    }

    #[test]
    fn short_or_foreign_addresses_fail() {
        let mut raw = RawSockAddr::from_addr("10.1.2.3:4".parse().unwrap());
        raw.set_len(4);
        assert_eq!(
            raw.to_addr().unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        let mut unix = RawSockAddr::empty();
        unix.bytes[..2].copy_from_slice(&family(libc::AF_UNIX));
        unix.set_len(110);
        assert_eq!(
            unix.to_addr().unwrap_err().raw_os_error(),
            Some(libc::EAFNOSUPPORT)
        );
        unix.set_len(1000);
        assert_eq!(unix.len, 128);
    }
}
