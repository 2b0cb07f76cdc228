//! The proof that binds a stream to its TCP connection (docs/shim-protocol.md, "Binding"): the
//! accepting side's CLAIM carries a fresh [`Secret`]; the connecting side, and only after it
//! received CLAIM, writes the secret as the first bytes of its kernel TCP connection. Only the
//! real TCP endpoint can put bytes into that connection (the kernel's sequence checks keep
//! off-path senders out), so a stream whose RDMA peer merely claimed the client's address never
//! binds.
//!
//! The connecting side's engine writes the secret ([`give`]) once CLAIM came, on a kept socket
//! nothing else writes to (the app's number names the socketpair).
//!
//! The accepting side looks at the kept TCP socket without taking anything
//! ([`look`], `MSG_PEEK`): the secret whole is taken off the socket ([`take`]) and the stream
//! binds; anything else is the client speaking TCP (a plain client, or one that gave up), and
//! stays on the socket for the relay, untouched.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

use nix::sys::socket::{MsgFlags, recv, send};

use crate::wire::{SECRET_LEN, Secret};

/// What the first bytes of a TCP connection say about `secret`.
#[derive(Debug)]
pub(super) enum Look {
    /// Fewer bytes than the secret so far, all of them its start (none yet, too): wait.
    Partial,
    /// The secret, whole.
    Whole,
    /// Something else: the client speaks TCP.
    Other,
    /// The client closed its side without a byte.
    Eof,
    /// The connection failed (reset).
    Failed(io::Error),
}

/// Looks at the first bytes of `fd` (a TCP socket) without taking them.
pub(super) fn look(fd: impl AsFd, secret: &Secret) -> Look {
    let mut buf = [0u8; SECRET_LEN];
    match recv(
        fd.as_fd().as_raw_fd(),
        &mut buf,
        MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
    ) {
        Ok(0) => Look::Eof,
        Ok(n) => {
            let got = buf.get(..n).unwrap_or(&[]);
            if got != secret.bytes().get(..n).unwrap_or(&[]) {
                Look::Other
            } else if n == SECRET_LEN {
                Look::Whole
            } else {
                Look::Partial
            }
        }
        Err(nix::Error::EAGAIN | nix::Error::EINTR) => Look::Partial,
        Err(e) => Look::Failed(io::Error::from_raw_os_error(e as i32)),
    }
}

/// Takes the secret off `fd`, once [`look`] saw it whole (it is there: a peek showed it, and
/// only this thread reads the socket).
pub(super) fn take(fd: impl AsFd) -> io::Result<()> {
    let mut buf = [0u8; SECRET_LEN];
    match recv(fd.as_fd().as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
        Ok(SECRET_LEN) => Ok(()),
        Ok(n) => Err(io::Error::other(format!(
            "took {n} bytes of the proof, not {SECRET_LEN}"
        ))),
        Err(e) => Err(io::Error::from_raw_os_error(e as i32)),
    }
}

/// Writes `secret` on `fd` (the connecting side's kept TCP socket) at once and whole. Nothing
/// else writes to that socket, so its send buffer has room for the 16 bytes unless the
/// connection failed. An error or a part written leaves a TCP connection that cannot be
/// trusted: the caller resets it.
pub(super) fn give(fd: impl AsFd, secret: &Secret) -> io::Result<()> {
    match send(
        fd.as_fd().as_raw_fd(),
        secret.bytes(),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
    ) {
        Ok(SECRET_LEN) => Ok(()),
        Ok(n) => Err(io::Error::other(format!(
            "sent {n} bytes of the proof, not {SECRET_LEN}"
        ))),
        Err(e) => Err(io::Error::from_raw_os_error(e as i32)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    fn wait_readable(s: &TcpStream) {
        let mut b = [0u8; 1];
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let _ = s.peek(&mut b);
    }

    const SECRET: Secret = Secret(*b"0123456789abcdef");

    #[test]
    fn the_secret_whole_binds_and_is_taken_off_the_connection() {
        let (mut client, server) = pair();
        assert!(
            matches!(look(&server, &SECRET), Look::Partial),
            "nothing yet"
        );
        client.write_all(&SECRET.0[..5]).unwrap();
        wait_readable(&server);
        assert!(matches!(look(&server, &SECRET), Look::Partial));
        client.write_all(&SECRET.0[5..]).unwrap();
        client.write_all(b"after").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(matches!(look(&server, &SECRET), Look::Whole));
        take(&server).unwrap();
        let mut rest = [0u8; 5];
        (&server).read_exact(&mut rest).unwrap();
        assert_eq!(&rest, b"after", "only the secret was taken");
    }

    #[test]
    fn the_proof_given_is_the_secret_whole_and_a_failed_socket_says_so() {
        let (client, server) = pair();
        give(&client, &SECRET).unwrap();
        wait_readable(&server);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(matches!(look(&server, &SECRET), Look::Whole));
        let (client, server) = pair();
        socket_reset(server);
        std::thread::sleep(std::time::Duration::from_millis(50));
        // The peer's RST: the first send after it fails.
        let _ = give(&client, &SECRET);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(give(&client, &SECRET).is_err());
    }

    #[test]
    fn anything_else_stays_for_the_relay() {
        let (mut client, server) = pair();
        client.write_all(b"0123X").unwrap();
        wait_readable(&server);
        assert!(matches!(look(&server, &SECRET), Look::Other));
        let mut got = [0u8; 5];
        (&server).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"0123X", "nothing was taken");
    }

    #[test]
    fn eof_and_reset_are_told_apart() {
        let (client, server) = pair();
        client.shutdown(Shutdown::Write).unwrap();
        wait_readable(&server);
        assert!(matches!(look(&server, &SECRET), Look::Eof));
        let (client, server) = pair();
        socket_reset(client);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(matches!(look(&server, &SECRET), Look::Failed(_)));
    }

    fn socket_reset(s: TcpStream) {
        crate::fd::reset(s.as_fd());
        drop(s);
    }
}
