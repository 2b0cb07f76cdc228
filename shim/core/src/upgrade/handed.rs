//! Upgraded connections handed to another process with `SCM_RIGHTS` answer as TCP sockets
//! there too.
//!
//! A server that accepts in one process and serves in another (Node.js's `cluster` and PM2,
//! whose primary accepts and sends each connection to a worker; any server that passes
//! connections over a unix socket) hands its workers the app's end of the socketpair: the
//! bytes flow (the stream still runs in the engine of the process that accepted), but the
//! worker would see an `AF_UNIX` socket: `getsockname` and `getpeername` answer `AF_UNIX`,
//! libuv then makes a pipe of it, and Node's `socket.remoteAddress` is `undefined`.
//!
//! So the engine's process remembers, for each of its streams, what the app's end is (device
//! and inode) and the kept TCP socket, and answers questions about them on an abstract unix
//! socket named by its pid ([`name`]); a process whose `recvmsg` receives an `AF_UNIX` stream
//! socket asks the process that made it (`SO_PEERCRED` of the received socket names it):
//! - the question carries the received socket itself, so only a process that holds a stream's
//!   end learns anything about it, and the answer is about the end it sent, never one it names;
//! - the answer is checked to come from that process (`SO_PEERCRED` of the connection: another
//!   socket squatting the name is not believed) and to be a TCP socket;
//! - the answer is a copy of the kept TCP socket, from which the receiving process's hooks
//!   answer as a fork child's do for a connection it inherited (names, TCP options, `TCP_INFO`
//!   of the kept socket; urgent data and `SO_RCVLOWAT` are not told to the engine), and one end
//!   of a notice pair on which the engine's process says how the stream ended
//!   ([`delegate::Notice`]: a reset reads as `ECONNRESET`, not as an orderly EOF).
//!
//! Each question is bounded ([`ANSWER_BOUND`]); a socket nobody answers for (not a stream's
//! end, a process without the shim, one gone) stays what it is.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use libc::c_int;

use super::{SWAPPED_FDS, SwappedFd, delegate};
use crate::fdtable::{self, COUNTED, INET_STREAM, SHIM_OWNED, SWAPPED, TCP};
use crate::forksafe::{ForkSafe, SLOTS};
use crate::log::{Level, log_at};
use crate::sys::{self, FileId, fdpass};

/// How long a receiving process waits for the engine's process to answer (it answers from a
/// table, on a thread that does nothing else that waits).
pub const ANSWER_BOUND: Duration = Duration::from_secs(1);
/// How long the engine's process waits for a question once connected.
const QUESTION_BOUND: Duration = Duration::from_millis(200);

/// A question: which stream is the end sent with it?
const ASK: u8 = 1;
/// Answers: the kept TCP socket comes with it, or the end is none of ours.
const KEPT: u8 = 1;
const UNKNOWN: u8 = 0;

/// A stream of this process's engine: the app's end of its socketpair and its kept TCP socket
/// (weak: the entry lives only as long as the app or the engine holds the stream), and how
/// the processes it was handed to learn how it ended.
struct End {
    app: FileId,
    kept: Weak<OwnedFd>,
    /// The stream's flag for a reset the hooks must report ([`SwappedFd::broken`]).
    broken: Weak<AtomicBool>,
    /// Our ends of the notice pairs handed out with it ([`delegate::Notice`]).
    notices: Vec<OwnedFd>,
    /// How it ended (a reset the app's own end could not report), once it did.
    ended: Option<bool>,
}

/// The most notice pairs one stream hands out (one per question about it).
const MAX_NOTICES: usize = 8;

static ENDS: ForkSafe<Vec<End>> = ForkSafe::new([const { Mutex::new(Vec::new()) }; SLOTS]);

/// The abstract socket name of the engine's process `pid`.
fn name(pid: libc::pid_t) -> Vec<u8> {
    format!("rdma-streams/handed/{pid}").into_bytes()
}

/// Remembers the stream whose app end is `app` and whose kept TCP socket is `kept` (entries
/// of streams that ended go at the same time: the table holds live streams only).
pub(super) fn remember(app: Option<FileId>, kept: &Arc<OwnedFd>, broken: &Arc<AtomicBool>) {
    let Some(app) = app else { return };
    let mut ends = ENDS.lock();
    ends.retain(|e| e.kept.strong_count() > 0);
    ends.push(End {
        app,
        kept: Arc::downgrade(kept),
        broken: Arc::downgrade(broken),
        notices: Vec::new(),
        ended: None,
    });
}

/// The stream whose flag is `broken` ended, in a reset its app's end could not report when
/// `reset`: every process it was handed to is told (before the engine ends the app's side).
pub(super) fn ended(broken: &Arc<AtomicBool>, reset: bool) {
    let mut ends = ENDS.lock();
    for e in ends
        .iter_mut()
        .filter(|e| std::ptr::eq(e.broken.as_ptr(), Arc::as_ptr(broken)))
    {
        e.ended = Some(reset);
        for n in e.notices.drain(..) {
            delegate::tell_end(&n, reset);
        }
    }
}

/// For another process that received the app end `app`: a copy of the stream's kept TCP
/// socket and one end of a notice pair that will say how the stream ended (told at once when
/// it already did). None: no live stream of ours has that end, or it was handed out
/// [`MAX_NOTICES`] times.
fn hand_out(app: FileId) -> Option<(Arc<OwnedFd>, OwnedFd)> {
    let mut ends = ENDS.lock();
    let e = ends.iter_mut().rev().find(|e| e.app == app)?;
    let kept = e.kept.upgrade()?;
    if e.notices.len() >= MAX_NOTICES {
        return None;
    }
    let (ours, theirs) = fdpass::seqpacket_pair().ok()?;
    let ours = sys::move_high(ours);
    match e.ended {
        Some(reset) => delegate::tell_end(&ours, reset),
        None => {
            // Closed in fork children, as the engine's socketpair ends are: only this process
            // tells (a copy left open would keep a notice from ever reading as closed).
            fdtable::set_pair_end(ours.as_raw_fd());
            e.notices.push(ours);
        }
    }
    Some((kept, theirs))
}

/// In a fork child: the parent's entries are forgotten, not dropped (their notice ends were
/// closed in the child with the other socketpair ends, and their numbers may be reused).
pub(super) fn after_fork_child() {
    if let Some(mut ends) = ENDS.after_fork() {
        std::mem::forget(std::mem::take(&mut *ends));
    }
}

/// In the engine's process: the socket it answers on (closed in fork children, whose
/// questions go to the process that made their sockets). None when the name is taken.
pub(super) fn listener() -> Option<OwnedFd> {
    let pid = libc::pid_t::try_from(std::process::id()).ok()?;
    match fdpass::listen_abstract(&name(pid)) {
        Ok(l) => {
            let l = sys::move_high(l);
            fdtable::set_pair_end(l.as_raw_fd());
            Some(l)
        }
        Err(e) => {
            log_at!(Level::Info, "no answers for handed connections: {e}");
            None
        }
    }
}

/// Answers every question waiting on `listener`, one at a time, each within
/// [`QUESTION_BOUND`].
pub(super) fn answer(listener: &OwnedFd) {
    while let Ok(Some(conv)) = fdpass::accept(listener.as_fd()) {
        if !fdpass::wait_readable(conv.as_fd(), QUESTION_BOUND) {
            continue;
        }
        let mut buf = [0u8; 4];
        let Ok(got) = fdpass::recv(conv.as_fd(), &mut buf, true) else {
            continue;
        };
        let end = match (got.len, buf[0], got.fds.as_slice()) {
            (1, ASK, [end]) if !got.truncated => sys::file_id(end.as_raw_fd()),
            _ => None,
        };
        drop(got.fds);
        let sent = match end.and_then(hand_out) {
            Some((kept, notice)) => fdpass::send(
                conv.as_raw_fd(),
                &[KEPT],
                &[kept.as_raw_fd(), notice.as_raw_fd()],
                true,
            ),
            None => fdpass::send(conv.as_raw_fd(), &[UNKNOWN], &[], true),
        };
        if let Err(e) = sent {
            log_at!(Level::Debug, "handed connections: an answer was lost ({e})");
        }
    }
}

/// `fd`, an `AF_UNIX` stream socket just received with `SCM_RIGHTS` that the fd table knows
/// nothing of ([`crate::ops::received`]): if it is the app's end of a stream (this process's,
/// or another's that answers for it), it answers as that stream's TCP socket from now on.
pub fn adopt(fd: c_int) {
    let (Some(pid), Some(app)) = (fdpass::peer_pid(fd), sys::file_id(fd)) else {
        return;
    };
    let own = libc::pid_t::try_from(std::process::id()).is_ok_and(|me| me == pid);
    let answer = if own {
        hand_out(app).and_then(|(k, n)| Some((sys::dup_cloexec(k.as_raw_fd()).ok()?, n)))
    } else {
        ask(pid, fd)
    };
    let Some((kept, notice)) = answer.filter(|(k, _)| sys::is_tcp(k.as_raw_fd())) else {
        return;
    };
    let kept = Arc::new(sys::move_high(kept));
    fdtable::set(kept.as_raw_fd(), SHIM_OWNED);
    let notice = Arc::new(delegate::Notice::new(sys::move_high(notice)));
    SWAPPED_FDS.lock().insert(
        fd,
        SwappedFd {
            kept,
            reader: None,
            writer: None,
            halves: None,
            broken: Arc::new(AtomicBool::new(false)),
            app_end: Some(app),
            notice: Some(notice),
            errq: Arc::new(crate::errqueue::ErrQueue::new()),
            late: None,
        },
    );
    fdtable::set(fd, INET_STREAM | TCP | COUNTED | SWAPPED);
    log_at!(Level::Debug, "fd {fd}: a connection handed over by {pid}");
}

/// Asks the process `pid` for the kept TCP socket of the stream whose app end is `end`, and
/// the notice of its end.
fn ask(pid: libc::pid_t, end: c_int) -> Option<(OwnedFd, OwnedFd)> {
    let conv = fdpass::connect_abstract(&name(pid)).ok()?;
    // Only the process that made the end answers for it.
    if fdpass::peer_pid(conv.as_raw_fd()) != Some(pid) {
        log_at!(
            Level::Info,
            "handed connections: {pid}'s name is held by another process"
        );
        return None;
    }
    fdpass::send(conv.as_raw_fd(), &[ASK], &[end], true).ok()?;
    if !fdpass::wait_readable(conv.as_fd(), ANSWER_BOUND) {
        log_at!(Level::Info, "handed connections: {pid} did not answer");
        return None;
    }
    let mut buf = [0u8; 4];
    let got = fdpass::recv(conv.as_fd(), &mut buf, true).ok()?;
    let mut fds = got.fds.into_iter();
    match (got.len, buf[0], got.truncated, fds.next(), fds.next()) {
        (1, KEPT, false, Some(kept), Some(notice)) => Some((kept, notice)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream this process remembers: its app end, the engine's end, its kept TCP socket
    /// and its reset flag.
    fn stream() -> (OwnedFd, OwnedFd, Arc<OwnedFd>, Arc<AtomicBool>) {
        let (app, engine_end) = sys::socketpair_stream().unwrap();
        let kept = Arc::new(sys::tcp_socket_for_test());
        let broken = Arc::new(AtomicBool::new(false));
        remember(sys::file_id(app.as_raw_fd()), &kept, &broken);
        (app, engine_end, kept, broken)
    }

    #[test]
    fn a_stream_is_remembered_while_someone_holds_it_and_only_by_its_own_end() {
        let (app, _other) = sys::socketpair_stream().unwrap();
        let id = sys::file_id(app.as_raw_fd());
        let kept = Arc::new(sys::tcp_socket_for_test());
        let broken = Arc::new(AtomicBool::new(false));
        remember(id, &kept, &broken);
        let (found, _notice) = hand_out(id.unwrap()).expect("held");
        assert!(Arc::ptr_eq(&found, &kept));
        drop(found);
        let (stranger, _x) = sys::socketpair_stream().unwrap();
        assert!(hand_out(sys::file_id(stranger.as_raw_fd()).unwrap()).is_none());
        drop(kept);
        assert!(hand_out(id.unwrap()).is_none(), "the stream ended");
    }

    #[test]
    fn another_process_asks_with_the_end_and_gets_the_kept_socket() {
        let me = libc::pid_t::try_from(std::process::id()).unwrap();
        // The thread that serves fork children answers (started once per process).
        delegate::start();
        let (app, _engine_end, kept, broken) = stream();
        let (got, notice) = ask(me, app.as_raw_fd()).expect("answered");
        assert_eq!(
            sys::file_id(got.as_raw_fd()),
            sys::file_id(kept.as_raw_fd())
        );
        // An end that is none of its streams: no socket, only the word.
        let (stranger, _x) = sys::socketpair_stream().unwrap();
        assert!(ask(me, stranger.as_raw_fd()).is_none());
        // Nobody answers for a process without the name: at once, not after the bound.
        let started = std::time::Instant::now();
        assert!(ask(i32::MAX, app.as_raw_fd()).is_none());
        assert!(started.elapsed() < ANSWER_BOUND);
        // An orderly end is told as one; then the stream is gone, its notices with it.
        let notice = delegate::Notice::new(notice);
        ended(&broken, false);
        drop(kept);
        assert!(!notice.take_reset(), "in order");
    }

    #[test]
    fn a_stream_that_ended_before_the_question_is_told_at_once() {
        let (app, _engine_end) = sys::socketpair_stream().unwrap();
        let kept = Arc::new(sys::tcp_socket_for_test());
        let broken = Arc::new(AtomicBool::new(false));
        let id = sys::file_id(app.as_raw_fd());
        remember(id, &kept, &broken);
        ended(&broken, true);
        let (_, notice) = hand_out(id.unwrap()).expect("still held by the app");
        assert!(delegate::Notice::new(notice).take_reset());
        // A stream handed out too often: no more notices, no more answers.
        let held: Vec<_> = (1..MAX_NOTICES)
            .filter_map(|_| hand_out(id.unwrap()))
            .collect();
        assert_eq!(held.len(), MAX_NOTICES - 1, "told ones are not kept");
        let (app2, _e2) = sys::socketpair_stream().unwrap();
        let broken2 = Arc::new(AtomicBool::new(false));
        let id2 = sys::file_id(app2.as_raw_fd());
        remember(id2, &kept, &broken2);
        let held: Vec<_> = (0..MAX_NOTICES)
            .filter_map(|_| hand_out(id2.unwrap()))
            .collect();
        assert_eq!(held.len(), MAX_NOTICES);
        assert!(hand_out(id2.unwrap()).is_none());
    }

    #[test]
    fn a_received_end_of_a_stream_answers_as_its_tcp_socket_and_anything_else_stays() {
        let (app, _engine_end, _kept, broken) = stream();
        let copy = sys::dup_cloexec(app.as_raw_fd()).unwrap();
        let fd = std::os::fd::IntoRawFd::into_raw_fd(copy);
        adopt(fd);
        assert_eq!(fdtable::get(fd) & SWAPPED, SWAPPED);
        let answered = super::super::kept(fd).expect("answers from the kept socket");
        assert!(sys::is_tcp(answered.as_raw_fd()));
        drop(answered);
        // The stream is reset where the app's end cannot say so: the hooks say it, once.
        assert!(!super::super::take_reset(fd), "running");
        ended(&broken, true);
        assert!(super::super::take_reset(fd));
        assert!(!super::super::take_reset(fd), "once");
        let _ = super::super::forget_swapped(fd);
        fdtable::clear(fd);
        sys::close_raw_for_test(fd);
        // A socketpair nobody's stream is: stays an AF_UNIX socket the shim does not know.
        let (plain, _p) = sys::socketpair_stream().unwrap();
        let fd = std::os::fd::IntoRawFd::into_raw_fd(plain);
        adopt(fd);
        assert_eq!(fdtable::get(fd), 0);
        sys::close_raw_for_test(fd);
    }

    #[test]
    fn a_number_closed_behind_the_hooks_back_and_received_again_answers_afresh() {
        let (app, _engine_end, _kept, _broken) = stream();
        let fd = std::os::fd::IntoRawFd::into_raw_fd(sys::dup_cloexec(app.as_raw_fd()).unwrap());
        crate::ops::received(&[fd], &|| {});
        assert_eq!(fdtable::get(fd) & SWAPPED, SWAPPED);
        // libuv's raw close: the hooks never hear of it, and the number comes back with
        // another connection's end, which is nobody's stream.
        let (plain, _p) = sys::socketpair_stream().unwrap();
        sys::close_raw_for_test(fd);
        sys::dup3(plain.as_fd(), fd, true).unwrap();
        crate::ops::received(&[fd], &|| {});
        assert_eq!(fdtable::get(fd), 0, "the old connection's notes are gone");
        assert!(super::super::kept(fd).is_none());
        sys::close_raw_for_test(fd);
    }

    #[test]
    fn a_name_squatted_by_another_process_is_not_believed() {
        // B made the end; C holds B's name before B could.
        let target = sys::fork_for_test(|| std::thread::sleep(Duration::from_secs(3)));
        let squatter = sys::fork_for_test(move || {
            let _held = fdpass::listen_abstract(&name(target)).unwrap();
            std::thread::sleep(Duration::from_secs(3));
        });
        let started = std::time::Instant::now();
        while fdpass::connect_abstract(&name(target)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "the squatter never listened"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let (app, _engine_end) = sys::socketpair_stream().unwrap();
        assert!(
            ask(target, app.as_raw_fd()).is_none(),
            "another process's answer"
        );
        assert!(started.elapsed() < ANSWER_BOUND, "refused before any wait");
        for pid in [target, squatter] {
            sys::kill_for_test(pid);
            sys::wait_for_test(pid);
        }
    }
}
