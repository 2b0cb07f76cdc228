//! A two-process check of the engine on a real RDMA stack (the Soft-RoCE suite runs it):
//!
//! ```text
//! stream-check server ADDR:PORT [COUNT]        accept COUNT streams (default 1), each: read to
//!                                              EOF, answer the sha256 of what arrived, close
//! stream-check client ADDR:PORT MIB [STREAMS]  send MIB MiB of pseudo-random bytes on each of
//!                                              STREAMS streams at once, check the answers
//! ```
//!
//! Prints one line per stream; exits non-zero on any mismatch or failure.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rdma_streams_transport::{
    Attach, ConnectRequest, Decision, Engine, EngineConfig, Event, Handshake, Request, probe,
    rdma::DEFAULT_PROVIDER,
};
use sha2::{Digest, Sha256};

fn fail(msg: String) -> ! {
    eprintln!("stream-check: {msg}");
    std::process::exit(1)
}

fn engine() -> Engine {
    let usable = probe(DEFAULT_PROVIDER).unwrap_or_else(|e| fail(format!("probe: {e}")));
    Engine::start(usable.lib, EngineConfig::default())
        .unwrap_or_else(|e| fail(format!("engine: {e}")))
}

fn attach(conn: &rdma_streams_transport::Conn) -> UnixStream {
    let (app, local) = UnixStream::pair().unwrap_or_else(|e| fail(format!("socketpair: {e}")));
    local
        .set_nonblocking(true)
        .unwrap_or_else(|e| fail(format!("nonblocking: {e}")));
    conn.attach(
        local.into(),
        Attach {
            kept: None,
            handshake: Handshake::Open,
            on_bytes: None,
            claim_by: None,
            give_back: None,
            on_event: Box::new(|e| {
                if let Event::Ended(end) = e
                    && end.error.is_some()
                {
                    eprintln!("stream-check: stream ended: {end:?}");
                }
            }),
        },
    );
    app
}

fn pattern(seed: u64, buf: &mut [u8]) -> u64 {
    let mut x = seed;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    x
}

fn server(addr: SocketAddr, count: usize) {
    let engine = engine();
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let _listener = engine
        .listen(
            addr,
            None,
            128,
            Arc::new(move |req: Request<'_>| {
                let _ = tx.lock().map(|t| t.send(req.conn.clone()));
                Decision::Accept(b"ok".to_vec())
            }),
        )
        .unwrap_or_else(|e| fail(format!("listen on {addr}: {e}")));
    println!("listening on {addr}");
    let mut workers = Vec::new();
    for i in 0..count {
        let conn = rx.recv().unwrap_or_else(|_| fail("no connection".into()));
        workers.push(std::thread::spawn(move || {
            let mut app = attach(&conn);
            let mut h = Sha256::new();
            let mut buf = vec![0u8; 1 << 16];
            let mut n = 0u64;
            loop {
                match app.read(&mut buf) {
                    Ok(0) => break,
                    Ok(k) => {
                        h.update(&buf[..k]);
                        n += k as u64;
                    }
                    Err(e) => fail(format!("stream {i}: read: {e}")),
                }
            }
            let digest = h.finalize();
            app.write_all(&digest)
                .unwrap_or_else(|e| fail(format!("stream {i}: write: {e}")));
            println!("server stream {i}: {n} bytes");
        }));
    }
    for w in workers {
        let _ = w.join();
    }
    std::thread::sleep(Duration::from_millis(200));
    println!(
        "server done: {} connections left, {} bytes pinned (kept regions included)",
        engine.connections(),
        engine.pinned()
    );
}

fn client(addr: SocketAddr, mib: usize, streams: usize) {
    let engine = engine();
    let started = Instant::now();
    let mut workers = Vec::new();
    for i in 0..streams {
        let engine = engine.clone();
        workers.push(std::thread::spawn(move || {
            let t0 = Instant::now();
            let conn = engine.connect(ConnectRequest {
                dst: addr,
                src: std::env::var("STREAM_CHECK_SRC")
                    .ok()
                    .and_then(|s| s.parse().ok()),
                payload: b"hi".to_vec(),
                resolve_timeout: Duration::from_secs(5),
                handshake: Handshake::Open,
                unattached_timeout: None,
                reuse_wait: None,
            });
            let answer = conn
                .wait_established(Instant::now() + Duration::from_secs(20))
                .unwrap_or_else(|e| fail(format!("stream {i}: connect: {e}")));
            assert_eq!(answer, b"ok");
            let connect_time = t0.elapsed();
            let mut app = attach(&conn);
            let mut reader = app
                .try_clone()
                .unwrap_or_else(|e| fail(format!("clone: {e}")));
            let total = mib << 20;
            let writer = std::thread::spawn(move || {
                let mut h = Sha256::new();
                let mut buf = vec![0u8; 1 << 16];
                let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (i as u64);
                let mut left = total;
                while left > 0 {
                    let k = left.min(buf.len());
                    seed = pattern(seed, &mut buf[..k]);
                    h.update(&buf[..k]);
                    app.write_all(&buf[..k])
                        .unwrap_or_else(|e| fail(format!("stream {i}: write: {e}")));
                    left -= k;
                }
                app.shutdown(std::net::Shutdown::Write)
                    .unwrap_or_else(|e| fail(format!("shutdown: {e}")));
                h.finalize()
            });
            let mut got = Vec::new();
            reader
                .read_to_end(&mut got)
                .unwrap_or_else(|e| fail(format!("stream {i}: read: {e}")));
            let want = writer
                .join()
                .unwrap_or_else(|_| fail("writer panicked".into()));
            if got != want.as_slice() {
                fail(format!(
                    "stream {i}: sha256 mismatch ({} answer bytes)",
                    got.len()
                ));
            }
            let secs = t0.elapsed().as_secs_f64();
            println!(
                "client stream {i}: {mib} MiB ok, connect {:.1} ms, {:.3} Gbit/s",
                connect_time.as_secs_f64() * 1e3,
                (total as f64 * 8.0) / secs / 1e9
            );
        }));
    }
    for w in workers {
        if w.join().is_err() {
            fail("a stream thread panicked".into());
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "client: {streams} x {mib} MiB in {secs:.2} s: {:.3} Gbit/s",
        (streams * (mib << 20)) as f64 * 8.0 / secs / 1e9
    );
    std::thread::sleep(Duration::from_millis(200));
    println!(
        "client done: {} connections left, {} bytes pinned (kept regions included)",
        engine.connections(),
        engine.pinned()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let addr = |s: Option<&String>| -> SocketAddr {
        s.and_then(|s| s.parse().ok())
            .unwrap_or_else(|| fail("need ADDR:PORT".into()))
    };
    let num = |s: Option<&String>, d: usize| s.and_then(|s| s.parse().ok()).unwrap_or(d);
    match args.get(1).map(String::as_str) {
        Some("server") => server(addr(args.get(2)), num(args.get(3), 1)),
        Some("client") => client(addr(args.get(2)), num(args.get(3), 16), num(args.get(4), 1)),
        _ => fail(
            "usage: stream-check server ADDR:PORT [COUNT] | client ADDR:PORT MIB [STREAMS]".into(),
        ),
    }
}
