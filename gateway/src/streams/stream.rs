//! One RDMA stream carrying one TCP connection, seen from the gateway's tokio side.
//!
//! The transport's [`Engine`](rdma_streams_transport::Engine) moves the bytes on its own thread:
//! the gateway hands it the TCP socket ([`carry`]) and waits for the stream's end, which the
//! engine reports on its thread and a oneshot channel brings back. A stream belongs to a
//! migration: when the migration's token is cancelled (aborted, or the drain grace of a completed
//! one ran out) the stream is aborted, which resets it at both ends.
//!
//! [`StreamConn`] is the part of the transport's `Conn` the gateway uses, so that the logic
//! around it (the target's decision, the abort) is tested without RDMA.

use std::{
    io,
    os::fd::OwnedFd,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use rdma_streams_common::report::Report;
use rdma_streams_transport::{Attach, Conn, End, Event, Handshake, StreamPath};
use tokio::{net::TcpStream, sync::oneshot};
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// How long an aborted stream's end report may take before the gateway stops waiting.
pub const ABORT_WAIT: Duration = Duration::from_secs(5);

/// How the engine finished with a handed-over socket.
pub enum Finish {
    /// The stream ended (the engine closed the socket).
    Ended(End),
    /// The connection was gone before the socket was attached: the socket comes back as it
    /// was handed over, nothing read from it.
    Returned(OwnedFd),
}

/// Called once with how the engine finished, on the engine thread (must not block).
pub type OnEnd = Box<dyn FnOnce(Finish) + Send>;

/// Called once when the stream takes the handed-over socket (not at all when the socket comes
/// back), on the engine thread (must not block).
pub type OnTaken = Box<dyn FnOnce() + Send>;

/// What [`carry`] ends with.
#[derive(Debug)]
pub enum Carried {
    /// The stream carried the connection until it ended (`sent`: bytes from the socket to
    /// the peer).
    Ended(End),
    /// The stream was gone before it took the connection, which is untouched: the caller may
    /// carry it another way.
    Returned(TcpStream),
}

/// What the gateway does with a connection of the engine.
pub trait StreamConn: Send + Sync + 'static {
    /// Accepts a deferred connect request with `payload`.
    fn accept(&self, payload: Vec<u8>);
    /// Rejects a deferred connect request with `payload`.
    fn reject(&self, payload: Vec<u8>);
    /// Hands `local` (non-blocking) over: pumped both ways until the stream ends, then closed
    /// (`on_taken` is called when the stream takes it); or, when the connection is already
    /// gone, given back untouched.
    fn attach(&self, local: OwnedFd, on_taken: OnTaken, on_end: OnEnd);
    /// Resets the stream (and shuts the attached socket down).
    fn abort(&self);
    /// False once the connection failed or closed (for a deferred request: the peer gave up).
    fn is_alive(&self) -> bool;
}

impl StreamConn for Conn {
    fn accept(&self, payload: Vec<u8>) {
        Conn::accept(self, payload);
    }

    fn reject(&self, payload: Vec<u8>) {
        Conn::reject(self, payload);
    }

    fn attach(&self, local: OwnedFd, on_taken: OnTaken, on_end: OnEnd) {
        let mut on_taken = Some(on_taken);
        // One report, from whichever of the two the engine calls.
        let report = Arc::new(Mutex::new(Some(on_end)));
        let take =
            |r: &Mutex<Option<OnEnd>>| r.lock().unwrap_or_else(PoisonError::into_inner).take();
        let on_return = Arc::clone(&report);
        Conn::attach(
            self,
            local,
            Attach {
                kept: None,
                handshake: Handshake::Open,
                on_bytes: None,
                claim_by: None,
                give_back: Some(Box::new(move |fd| {
                    if let Some(report) = take(&on_return) {
                        report(Finish::Returned(fd));
                    }
                })),
                on_event: Box::new(move |event| match event {
                    Event::Decided(StreamPath::Rdma) => {
                        if let Some(taken) = on_taken.take() {
                            taken();
                        }
                    }
                    Event::Ended(end) => {
                        if let Some(report) = take(&report) {
                            report(Finish::Ended(end));
                        }
                    }
                    Event::Decided(_) => {}
                }),
            },
        );
    }

    fn abort(&self) {
        Conn::abort(self);
    }

    fn is_alive(&self) -> bool {
        Conn::is_alive(self)
    }
}

/// The end of a stream whose report never came (the engine stopped, or the socket could not
/// be handed over).
fn lost(why: &str) -> End {
    End {
        path: StreamPath::Broken,
        sent: 0,
        received: 0,
        error: Some(why.to_owned()),
        reset: true,
    }
}

/// The socket as the engine takes it: an owned, non-blocking fd out of tokio's reactor.
fn handover(socket: TcpStream) -> io::Result<OwnedFd> {
    let std = socket.into_std()?;
    std.set_nonblocking(true)?;
    Ok(OwnedFd::from(std))
}

/// The socket the engine gave back, in tokio's reactor again.
fn taken_back(fd: OwnedFd) -> Carried {
    match TcpStream::from_std(std::net::TcpStream::from(fd)) {
        Ok(socket) => Carried::Returned(socket),
        Err(error) => {
            warn!(error = %Report(&error), "taking the connection back from the stream");
            Carried::Ended(lost("the socket could not be taken back"))
        }
    }
}

fn finished(finish: Result<Finish, oneshot::error::RecvError>) -> Carried {
    match finish {
        Ok(Finish::Ended(end)) => Carried::Ended(end),
        Ok(Finish::Returned(fd)) => taken_back(fd),
        Err(_) => Carried::Ended(lost("the engine stopped")),
    }
}

/// Carries `socket` over the established `conn` until the stream ends, or aborts it when
/// `cancel` fires first; returns the end (`sent`: bytes from `socket` to the peer), or the
/// socket itself when the stream was gone before it took it. `taken` runs (on the engine
/// thread) when the stream takes the socket: what counts a connection as carried.
pub async fn carry<C: StreamConn + ?Sized>(
    conn: &C,
    socket: TcpStream,
    cancel: &CancellationToken,
    taken: impl FnOnce() + Send + 'static,
) -> Carried {
    let fd = match handover(socket) {
        Ok(fd) => fd,
        Err(error) => {
            warn!(error = %Report(&error), "handing the connection to the stream");
            conn.abort();
            return Carried::Ended(lost("the socket could not be handed over"));
        }
    };
    let (tx, mut rx) = oneshot::channel();
    conn.attach(
        fd,
        Box::new(taken),
        Box::new(move |finish| {
            let _ = tx.send(finish);
        }),
    );
    tokio::select! {
        finish = &mut rx => finished(finish),
        () = cancel.cancelled() => {
            conn.abort();
            match tokio::time::timeout(ABORT_WAIT, rx).await {
                Ok(finish) => finished(finish),
                Err(_) => Carried::Ended(lost("aborted; no end report in time")),
            }
        }
    }
}

#[cfg(test)]
pub mod double {
    //! A [`StreamConn`] that records what the gateway asked for and plays the engine's part
    //! with a thread per attached socket: it echoes what arrives until EOF, or ends at an
    //! abort.

    use std::{
        io::{Read, Write},
        os::fd::OwnedFd,
        sync::{Arc, Mutex},
    };

    use super::*;

    /// One recorded call.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Call {
        Accept(Vec<u8>),
        Reject(Vec<u8>),
        Attach,
        Abort,
    }

    #[derive(Default)]
    struct State {
        /// The peer gave up.
        dead: bool,
        calls: Vec<Call>,
        attached: Option<std::net::TcpStream>,
        /// Called when the stream is seen to have taken the socket (it moved a byte, ended
        /// or was aborted); dropped uncalled when the socket is given back.
        on_taken: Option<OnTaken>,
        on_end: Option<OnEnd>,
    }

    impl State {
        fn taken(&mut self) {
            if let Some(taken) = self.on_taken.take() {
                taken();
            }
        }
    }

    /// See the module docs.
    #[derive(Clone, Default)]
    pub struct FakeConn(Arc<Mutex<State>>);

    impl FakeConn {
        pub fn calls(&self) -> Vec<Call> {
            self.lock().calls.clone()
        }

        fn lock(&self) -> std::sync::MutexGuard<'_, State> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }

        /// The peer gives up (its connect timed out and was aborted).
        pub fn kill(&self) {
            self.lock().dead = true;
        }

        fn record(&self, call: Call) {
            self.lock().calls.push(call);
        }

        /// Ends the stream as the engine would after its peer finished: reports `end`.
        pub fn end(&self, end: End) {
            let report = {
                let mut s = self.lock();
                s.taken();
                s.on_end.take()
            };
            if let Some(report) = report {
                report(Finish::Ended(end));
            }
        }

        /// The engine found the connection gone at the attach: gives the socket back.
        pub fn give_back(&self) {
            let (socket, report) = {
                let mut s = self.lock();
                s.on_taken = None;
                (s.attached.take(), s.on_end.take())
            };
            if let (Some(socket), Some(report)) = (socket, report) {
                report(Finish::Returned(OwnedFd::from(socket)));
            }
        }

        /// Echoes one message on the attached socket: reads `n` bytes, writes them back.
        pub fn echo(&self, n: usize) -> std::io::Result<Vec<u8>> {
            let mut socket = {
                let mut s = self.lock();
                let socket = s
                    .attached
                    .as_ref()
                    .ok_or_else(|| std::io::Error::other("nothing attached"))?
                    .try_clone()?;
                s.taken();
                socket
            };
            socket.set_nonblocking(false)?;
            let mut buf = vec![0u8; n];
            socket.read_exact(&mut buf)?;
            socket.write_all(&buf)?;
            Ok(buf)
        }
    }

    impl StreamConn for FakeConn {
        fn accept(&self, payload: Vec<u8>) {
            self.record(Call::Accept(payload));
        }

        fn reject(&self, payload: Vec<u8>) {
            self.record(Call::Reject(payload));
        }

        fn attach(&self, local: OwnedFd, on_taken: OnTaken, on_end: OnEnd) {
            let mut s = self.lock();
            s.calls.push(Call::Attach);
            s.attached = Some(std::net::TcpStream::from(local));
            s.on_taken = Some(on_taken);
            s.on_end = Some(on_end);
        }

        fn abort(&self) {
            self.record(Call::Abort);
            let (socket, report) = {
                let mut s = self.lock();
                s.taken();
                (s.attached.take(), s.on_end.take())
            };
            if let Some(socket) = socket {
                let _ = socket.shutdown(std::net::Shutdown::Both);
            }
            if let Some(report) = report {
                report(Finish::Ended(End {
                    path: StreamPath::Rdma,
                    sent: 0,
                    received: 0,
                    error: Some("aborted".into()),
                    reset: true,
                }));
            }
        }

        fn is_alive(&self) -> bool {
            !self.lock().dead
        }
    }
}

#[cfg(test)]
mod tests {
    use super::double::{Call, FakeConn};
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn ended(c: Carried) -> End {
        match c {
            Carried::Ended(end) => end,
            Carried::Returned(_) => panic!("the socket came back"),
        }
    }

    #[test]
    fn a_socket_the_engine_gives_back_is_the_same_connection_untouched() {
        crate::testing::within(Duration::from_secs(10), || async {
            let conn = FakeConn::default();
            let (mut app, handed) = pair().await;
            let carrying = {
                let conn = conn.clone();
                tokio::spawn(
                    async move { carry(&conn, handed, &CancellationToken::new(), || {}).await },
                )
            };
            while conn.calls().is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            app.write_all(b"first bytes").await.unwrap();
            conn.give_back();
            let Carried::Returned(mut socket) = carrying.await.unwrap() else {
                panic!("the stream did not give the socket back");
            };
            // Nothing was read from it: the app's bytes are all there, and it still works
            // both ways (the gateway relays it over TCP from here).
            let mut got = [0u8; 11];
            socket.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"first bytes");
            socket.write_all(b"reply").await.unwrap();
            let mut back = [0u8; 5];
            app.read_exact(&mut back).await.unwrap();
            assert_eq!(&back, b"reply");
            assert_eq!(conn.calls(), [Call::Attach]);
        });
    }

    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    #[test]
    fn the_end_report_comes_back_and_a_cancel_aborts() {
        crate::testing::within(Duration::from_secs(10), || async {
            // Normal end: the engine moves bytes, then reports.
            let conn = FakeConn::default();
            let (mut app, handed) = pair().await;
            let cancel = CancellationToken::new();
            let carrying = {
                let conn = conn.clone();
                let cancel = cancel.clone();
                tokio::spawn(async move { carry(&conn, handed, &cancel, || {}).await })
            };
            app.write_all(b"hello").await.unwrap();
            let echoed = {
                let conn = conn.clone();
                tokio::task::spawn_blocking(move || {
                    // The attach happens on the carrying task: wait for it.
                    loop {
                        match conn.echo(5) {
                            Ok(b) => break b,
                            Err(_) => std::thread::sleep(Duration::from_millis(5)),
                        }
                    }
                })
                .await
                .unwrap()
            };
            assert_eq!(echoed, b"hello");
            let mut back = [0u8; 5];
            app.read_exact(&mut back).await.unwrap();
            assert_eq!(&back, b"hello");
            let end = End {
                path: StreamPath::Rdma,
                sent: 5,
                received: 5,
                error: None,
                reset: false,
            };
            conn.end(end.clone());
            assert_eq!(ended(carrying.await.unwrap()), end);
            assert_eq!(conn.calls(), [Call::Attach]);

            // The migration is aborted: the stream is reset, the socket shut down.
            let conn = FakeConn::default();
            let (mut app, handed) = pair().await;
            let cancel = CancellationToken::new();
            let carrying = {
                let conn = conn.clone();
                let cancel = cancel.clone();
                tokio::spawn(async move { carry(&conn, handed, &cancel, || {}).await })
            };
            while conn.calls().is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            cancel.cancel();
            let end = ended(carrying.await.unwrap());
            assert_eq!(end.error.as_deref(), Some("aborted"));
            assert_eq!(conn.calls(), [Call::Attach, Call::Abort]);
            let mut rest = Vec::new();
            assert_eq!(app.read_to_end(&mut rest).await.unwrap_or(0), 0);
        });
    }

    #[test]
    fn an_engine_that_drops_the_report_ends_the_wait() {
        struct Dropping;
        impl StreamConn for Dropping {
            fn accept(&self, _: Vec<u8>) {}
            fn reject(&self, _: Vec<u8>) {}
            fn attach(&self, _local: OwnedFd, _on_taken: OnTaken, on_end: OnEnd) {
                drop(on_end);
            }
            fn abort(&self) {}
            fn is_alive(&self) -> bool {
                true
            }
        }
        crate::testing::within(Duration::from_secs(10), || async {
            let (_app, handed) = pair().await;
            let end = ended(carry(&Dropping, handed, &CancellationToken::new(), || {}).await);
            assert_eq!(end.path, StreamPath::Broken);
            assert_eq!(end.error.as_deref(), Some("the engine stopped"));
        });
    }
}
