//! `rpoll`/`rselect`: r-fds translated to their kernel sockets, mixed with ordinary fds.

use std::sync::Arc;

use libc::{c_int, c_short, pollfd};
use socket2::Socket;
use std::os::fd::AsRawFd;

use crate::config::config;
use crate::errno::Res;
use crate::table::{Phase, is_rfd, table};

/// What kernel `poll(2)` is, injected by the FFI layer (the only place allowed to call it).
pub(crate) type KernelPoll = fn(&mut [pollfd], c_int) -> Res<usize>;

/// An entry the kernel must ignore (negative fds are skipped by `poll(2)`).
fn ignored() -> pollfd {
    pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }
}

/// `rpoll`: translates every r-fd to its kernel socket, polls, and copies the results back.
///
/// - an unknown r-fd reports `POLLNVAL`, like a closed fd in `poll(2)`;
/// - a reset connection reports `POLLERR|POLLHUP` plus the requested `POLLIN`/`POLLOUT`, so
///   a reader or writer goes on to see `ECONNRESET`;
/// - a `hang_connect` socket, and every r-fd under `poll_never_wakes`, is never ready;
/// - ordinary fds (below [`crate::FIRST_RFD`]) are polled as they are.
pub(crate) fn rpoll(fds: &mut [pollfd], timeout: c_int, kernel_poll: KernelPoll) -> Res<usize> {
    let never_wakes = config().faults.poll_never_wakes;
    let mut kernel_fds = Vec::with_capacity(fds.len());
    let mut forced: Vec<c_short> = vec![0; fds.len()];
    // Keeps every kernel socket open (so its fd number cannot be reused) during the poll.
    let mut keep_alive: Vec<Arc<Socket>> = Vec::new();
    for (i, fd) in fds.iter().enumerate() {
        if !is_rfd(fd.fd) {
            kernel_fds.push(pollfd {
                fd: fd.fd,
                events: fd.events,
                revents: 0,
            });
            continue;
        }
        kernel_fds.push(ignored());
        let Ok(entry) = table().get(fd.fd) else {
            forced[i] = libc::POLLNVAL;
            continue;
        };
        if never_wakes || entry.phase() == Phase::Hanging {
            continue;
        }
        match entry.socket() {
            Ok(socket) => {
                kernel_fds[i] = pollfd {
                    fd: socket.as_raw_fd(),
                    events: fd.events,
                    revents: 0,
                };
                keep_alive.push(socket);
            }
            Err(_) => {
                forced[i] =
                    libc::POLLERR | libc::POLLHUP | (fd.events & (libc::POLLIN | libc::POLLOUT));
            }
        }
    }
    let timeout = if forced.iter().any(|&r| r != 0) {
        0
    } else {
        timeout
    };
    kernel_poll(&mut kernel_fds, timeout)?;
    drop(keep_alive);
    let mut ready = 0;
    for ((fd, kernel), extra) in fds.iter_mut().zip(&kernel_fds).zip(&forced) {
        fd.revents = kernel.revents | extra;
        if fd.revents != 0 {
            ready += 1;
        }
    }
    Ok(ready)
}

/// Which `select` sets an fd lands in, from its `poll` result: (read, write, except).
pub(crate) fn select_ready(events: c_short, revents: c_short) -> (bool, bool, bool) {
    let read =
        events & libc::POLLIN != 0 && revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
    let write = events & libc::POLLOUT != 0 && revents & (libc::POLLOUT | libc::POLLERR) != 0;
    let except = events & libc::POLLPRI != 0 && revents & libc::POLLPRI != 0;
    (read, write, except)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_mapping() {
        assert_eq!(
            select_ready(libc::POLLIN, libc::POLLHUP),
            (true, false, false)
        );
        assert_eq!(
            select_ready(libc::POLLOUT, libc::POLLOUT),
            (false, true, false)
        );
        assert_eq!(
            select_ready(libc::POLLIN | libc::POLLOUT, libc::POLLERR),
            (true, true, false)
        );
        assert_eq!(
            select_ready(libc::POLLPRI, libc::POLLPRI | libc::POLLIN),
            (false, false, true)
        );
    }

    #[test]
    fn unknown_rfd_is_pollnval() {
        fn no_kernel(fds: &mut [pollfd], _: c_int) -> Res<usize> {
            assert!(fds.iter().all(|f| f.fd == -1));
            Ok(0)
        }
        let mut fds = [pollfd {
            fd: i32::MAX,
            events: libc::POLLIN,
            revents: 0,
        }];
        assert_eq!(rpoll(&mut fds, 1000, no_kernel), Ok(1));
        assert_eq!(fds[0].revents, libc::POLLNVAL);
    }
}
