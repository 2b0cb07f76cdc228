//! The two gateways against each other, in-process: the source's two rounds
//! (`streams::outbound::open`) over a [`Loop`] that hands every connect request to the target's
//! acceptor decision ([`decide`]) and its deferred [`serve`], with the engine's connection played
//! by [`FakeConn`]. What is judged: the reason each side ends with, what the target dials, and
//! what it counts.

use std::{
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use rdma_streams_transport::{ConnectError, Decision, RejectedBy};
use tokio::{io::AsyncReadExt, net::TcpListener, runtime::Handle};

use super::*;
use crate::{
    capture::netns::PathLocator,
    events::{Migration, MigrationEvent, Role},
    migration::{GatewayCore, Settings},
    streams::{
        Fallback,
        keys::{KeyRing, PeerKey, PeerKeys},
        outbound::{self, Dial, Opening},
        payload::{Hello, Open, UidDigest},
        stream::double::{Call, FakeConn},
        transcript::{Label, Transcript},
    },
    testing::{TestNetns, within},
};

const SOURCE_GW: &str = "198.18.0.1:40000";
const TARGET_GW: &str = "198.18.0.2:7471";

fn key(b: u8) -> PeerKey {
    PeerKey::new(vec![b; 32]).unwrap()
}

fn keys(bytes: &[u8]) -> PeerKeys {
    PeerKeys::new(bytes.iter().map(|b| key(*b)).collect())
}

/// A target gateway whose advertised address is the loopback destinations' (so they count as
/// this node's), with `keys`.
fn target(keys: PeerKeys) -> GatewayCore {
    GatewayCore::new(Arc::new(
        Shared::new(
            Err(Fallback::NoProvider),
            Arc::new(crate::streams::StaticPeers::default()),
            Arc::new(PathLocator("/nonexistent/ns".into())),
            crate::metrics::Metrics::default(),
            Settings {
                dial_timeout: Duration::from_secs(2),
                mark: 0,
                advertised: Some("127.0.0.1".parse().unwrap()),
                ..Settings::default()
            },
        )
        .with_keys(KeyRing::fixed(keys)),
    ))
}

fn started(target: SocketAddr) -> MigrationEvent {
    MigrationEvent::Started(Migration {
        uid: "u1".into(),
        id: "m1".into(),
        vmi: "default/vm1".into(),
        role: Role::Target,
        target: target.ip(),
        ports: vec![target.port()],
        started: None,
    })
}

/// Connect requests from the source gateway, decided by the target's acceptor.
struct Loop {
    target: Arc<Shared>,
    runtime: Handle,
    source: SocketAddr,
    /// Every payload sent, in order.
    sent: Mutex<Vec<Vec<u8>>>,
    /// Replaces the accept's payload (a forged accept).
    forged_accept: Option<Vec<u8>>,
}

impl Loop {
    fn new(target: &GatewayCore) -> Loop {
        Loop {
            target: target.shared().clone(),
            runtime: Handle::current(),
            source: SOURCE_GW.parse().unwrap(),
            sent: Mutex::new(Vec::new()),
            forged_accept: None,
        }
    }

    fn sent(&self) -> Vec<Vec<u8>> {
        self.sent.lock().unwrap().clone()
    }
}

impl Dial for Loop {
    type Conn = FakeConn;

    fn dial(
        &self,
        payload: Vec<u8>,
        deadline: Instant,
    ) -> Result<(FakeConn, Vec<u8>), ConnectError> {
        self.sent.lock().unwrap().push(payload.clone());
        let conn = FakeConn::default();
        let decision = decide(
            &self.target,
            &self.runtime,
            &payload,
            Some(self.source),
            Some(TARGET_GW.parse().unwrap()),
            conn.clone(),
        );
        match decision {
            Decision::Reject(p) => return Err(ConnectError::Rejected(RejectedBy::App(p))),
            Decision::Accept(p) => return Ok((conn, p)),
            Decision::Defer => {}
        }
        loop {
            match conn.calls().first() {
                Some(Call::Accept(p)) => {
                    let p = self.forged_accept.clone().unwrap_or_else(|| p.clone());
                    return Ok((conn, p));
                }
                Some(Call::Reject(p)) => {
                    return Err(ConnectError::Rejected(RejectedBy::App(p.clone())));
                }
                _ if Instant::now() > deadline => {
                    conn.kill();
                    return Err(ConnectError::Timeout);
                }
                _ => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }

    fn abort(&self, conn: &FakeConn) {
        conn.abort();
        conn.kill();
    }
}

fn opening(dst: SocketAddr) -> Opening {
    let s: SocketAddr = SOURCE_GW.parse().unwrap();
    let t: SocketAddr = TARGET_GW.parse().unwrap();
    Opening {
        destination: dst,
        migration: UidDigest::of("u1"),
        source_gateway: s.ip(),
        target_gateway: t.ip(),
    }
}

/// The source's two rounds with `source_keys` over `link`, bounded by `bound`.
async fn open(
    link: Arc<Loop>,
    source_keys: PeerKeys,
    dst: SocketAddr,
    bound: Duration,
) -> Result<FakeConn, Fallback> {
    tokio::task::spawn_blocking(move || {
        outbound::open(
            &*link,
            &source_keys,
            &opening(dst),
            Instant::now() + bound,
            crate::streams::transcript::random_nonce,
        )
    })
    .await
    .unwrap()
}

async fn destination() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

/// Whether the destination sees a connection within `wait`.
async fn dialed(l: &TcpListener, wait: Duration) -> bool {
    tokio::time::timeout(wait, l.accept()).await.is_ok()
}

fn outcome(core: &GatewayCore, o: Outcome) -> u64 {
    core.shared().metrics.peer_requests_of(o)
}

#[test]
fn gateways_with_a_key_in_common_open_the_stream_and_the_target_dials() {
    within(Duration::from_secs(20), || async {
        let core = target(keys(&[1]));
        let (l, dst) = destination().await;
        core.handle(started(dst)).await;
        let link = Arc::new(Loop::new(&core));
        let conn = open(link.clone(), keys(&[1]), dst, Duration::from_secs(5))
            .await
            .expect("opened");
        let (mut server, _) = tokio::time::timeout(Duration::from_secs(5), l.accept())
            .await
            .unwrap()
            .unwrap();
        // Accepted, then the dialed socket attached to the stream.
        while conn.calls().len() < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(matches!(conn.calls()[..], [Call::Accept(_), Call::Attach]));
        let sent = link.sent();
        assert_eq!(sent.len(), 2, "HELLO and PROOF");
        assert_eq!(&sent[0][..3], &[b'G', 2, 1]);
        assert_eq!(&sent[1][..3], &[b'G', 2, 2]);
        assert_eq!(outcome(&core, Outcome::Challenged), 1);
        assert_eq!(outcome(&core, Outcome::Admitted), 1);
        // The migration ends: the stream is reset, the destination sees the end.
        core.handle(MigrationEvent::Ended {
            uid: "u1".into(),
            aborted: true,
            migration: None,
        })
        .await;
        let mut rest = Vec::new();
        assert_eq!(server.read_to_end(&mut rest).await.unwrap_or(0), 0);
        assert_eq!(
            core.shared()
                .metrics
                .connections_of("target", crate::metrics::PathKind::Rdma),
            1
        );
    });
}

#[test]
fn rotation_keys_listed_second_verify_both_ways() {
    within(Duration::from_secs(20), || async {
        // Mid-rotation: the source signs with the new key 2, the target still signs with 1
        // and lists 2 second; the target answers with the key the proof verified under.
        let core = target(keys(&[1, 2]));
        let (_l, dst) = destination().await;
        core.handle(started(dst)).await;
        let link = Arc::new(Loop::new(&core));
        assert!(
            open(link.clone(), keys(&[2, 1]), dst, Duration::from_secs(5))
                .await
                .is_ok()
        );
        // And once the old key is gone from the source.
        assert!(
            open(link, keys(&[2]), dst, Duration::from_secs(5))
                .await
                .is_ok()
        );
        assert_eq!(outcome(&core, Outcome::Admitted), 2);
    });
}

#[test]
fn different_keys_fall_back_with_peer_auth_failed_and_nothing_is_dialed() {
    within(Duration::from_secs(20), || async {
        let core = target(keys(&[1]));
        let (l, dst) = destination().await;
        core.handle(started(dst)).await;
        let link = Arc::new(Loop::new(&core));
        let r = open(link, keys(&[9]), dst, Duration::from_secs(5)).await;
        assert_eq!(r.err(), Some(Fallback::PeerAuthFailed));
        assert!(!dialed(&l, Duration::from_millis(300)).await);
        assert_eq!(outcome(&core, Outcome::BadProof), 1);
        assert_eq!(outcome(&core, Outcome::Admitted), 0);
    });
}

#[test]
fn without_keys_neither_side_opens_a_stream() {
    within(Duration::from_secs(20), || async {
        let (l, dst) = destination().await;
        // The target has none: it says so, and the source counts NO_PEER_KEY.
        let core = target(PeerKeys::default());
        core.handle(started(dst)).await;
        let link = Arc::new(Loop::new(&core));
        let r = open(link.clone(), keys(&[1]), dst, Duration::from_secs(5)).await;
        assert_eq!(r.err(), Some(Fallback::NoPeerKey));
        assert_eq!(outcome(&core, Outcome::NoKey), 1);
        // The source has none: nothing is sent.
        let core = target(keys(&[1]));
        core.handle(started(dst)).await;
        let link = Arc::new(Loop::new(&core));
        let r = open(
            link.clone(),
            PeerKeys::default(),
            dst,
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(r.err(), Some(Fallback::NoPeerKey));
        assert!(link.sent().is_empty());
        assert!(!dialed(&l, Duration::from_millis(200)).await);
    });
}

#[test]
fn a_forged_accept_is_refused_by_the_source() {
    within(Duration::from_secs(20), || async {
        let core = target(keys(&[1]));
        let (_l, dst) = destination().await;
        core.handle(started(dst)).await;
        // Something between the gateways (or playing the target without the key) accepts
        // with a tag of its own.
        let link = Arc::new(Loop {
            forged_accept: Some(Answer::Ok([0x5a; 16]).encode()),
            ..Loop::new(&core)
        });
        let r = open(link, keys(&[1]), dst, Duration::from_secs(5)).await;
        assert_eq!(r.err(), Some(Fallback::PeerAuthFailed));
    });
}

#[test]
fn a_replayed_or_relayed_proof_is_refused() {
    within(Duration::from_secs(20), || async {
        let core = target(keys(&[1]));
        let (l, dst) = destination().await;
        core.handle(started(dst)).await;
        let link = Arc::new(Loop::new(&core));
        open(link.clone(), keys(&[1]), dst, Duration::from_secs(5))
            .await
            .expect("opened");
        let (_first, _) = l.accept().await.unwrap();
        let shared = core.shared().clone();
        let source: SocketAddr = SOURCE_GW.parse().unwrap();
        let ours: SocketAddr = TARGET_GW.parse().unwrap();
        // The same PROOF again (an attacker recorded it): its challenge is used up.
        let proof = link.sent()[1].clone();
        let judge = |payload: &[u8], from: SocketAddr| match admission::judge(
            &shared,
            payload,
            Some(from),
            Some(ours),
            Instant::now(),
        ) {
            Verdict::Refuse(a, o) => (a, o),
            Verdict::Admit(_) => panic!("admitted"),
        };
        assert_eq!(
            judge(&proof, source),
            (Answer::AuthFailed, Outcome::NoChallenge)
        );
        // An attacker at another address asks for a challenge and relays it to the real source
        // (which signs the transcript with its own address): the target sees the attacker's.
        let attacker: SocketAddr = "198.18.0.66:40000".parse().unwrap();
        let hello = Open::Hello(Hello {
            port: dst.port(),
            migration: UidDigest::of("u1"),
            nonce: [3; 16],
        });
        let (Answer::Challenge(nonce), Outcome::Challenged) = judge(&hello.encode(), attacker)
        else {
            panic!("no challenge");
        };
        let signed_by_source = Transcript {
            source_nonce: [3; 16],
            target_nonce: nonce,
            port: dst.port(),
            migration: UidDigest::of("u1"),
            destination: dst.ip(),
            source_gateway: source.ip(),
            target_gateway: ours.ip(),
        };
        let relayed = Open::Proof(crate::streams::payload::Proof {
            port: dst.port(),
            migration: UidDigest::of("u1"),
            ticket: crate::streams::payload::ticket_of(&nonce),
            tag: signed_by_source.tag(&key(1), Label::Proof),
        });
        assert_eq!(
            judge(&relayed.encode(), attacker),
            (Answer::AuthFailed, Outcome::BadProof)
        );
        // The challenge is gone after that one try.
        assert_eq!(
            judge(&relayed.encode(), attacker),
            (Answer::AuthFailed, Outcome::NoChallenge)
        );
        assert!(!dialed(&l, Duration::from_millis(200)).await);
        // A version-1 request (an older gateway) is refused as such.
        let v1 = b"G\x01\x04\xc0\x00\x7f\x00\x00\x01\x01\x02\x03\x04\x05\x06\x07\x08";
        assert_eq!(judge(v1, source), (Answer::Version, Outcome::OldVersion));
        assert_eq!(
            judge(b"S\x01", source),
            (Answer::BadRequest, Outcome::BadRequest)
        );
    });
}

#[test]
fn challenges_are_bounded_per_source() {
    within(Duration::from_secs(20), || async {
        let core = target(keys(&[1]));
        let (_l, dst) = destination().await;
        core.handle(started(dst)).await;
        let shared = core.shared().clone();
        let hello = Open::Hello(Hello {
            port: dst.port(),
            migration: UidDigest::of("u1"),
            nonce: [3; 16],
        })
        .encode();
        let from: SocketAddr = "198.18.0.66:1".parse().unwrap();
        let mut busy = 0;
        for _ in 0..crate::streams::challenges::PER_SOURCE + 5 {
            if let Verdict::Refuse(Answer::Busy, Outcome::Busy) =
                admission::judge(&shared, &hello, Some(from), None, Instant::now())
            {
                busy += 1;
            }
        }
        assert_eq!(
            busy, 0,
            "no local address known: refused as a bad request before"
        );
        let ours: SocketAddr = TARGET_GW.parse().unwrap();
        for _ in 0..crate::streams::challenges::PER_SOURCE + 5 {
            if let Verdict::Refuse(Answer::Busy, Outcome::Busy) =
                admission::judge(&shared, &hello, Some(from), Some(ours), Instant::now())
            {
                busy += 1;
            }
        }
        assert_eq!(busy, 5);
        // Another source still gets its challenge.
        let other: SocketAddr = "198.18.0.1:1".parse().unwrap();
        assert!(matches!(
            admission::judge(&shared, &hello, Some(other), Some(ours), Instant::now()),
            Verdict::Refuse(Answer::Challenge(_), Outcome::Challenged)
        ));
    });
}

#[test]
fn a_late_announce_is_waited_for_and_an_unknown_migration_is_refused() {
    within(Duration::from_secs(20), || async {
        let core = target(keys(&[1]));
        let (l, dst) = destination().await;
        let link = Arc::new(Loop::new(&core));
        // Never announced: the source asks again until its bound, then falls back.
        let t0 = Instant::now();
        let r = open(link.clone(), keys(&[1]), dst, Duration::from_millis(500)).await;
        assert_eq!(r.err(), Some(Fallback::PeerRefused));
        assert!(t0.elapsed() >= Duration::from_millis(350), "asked again");
        assert!(outcome(&core, Outcome::UnknownMigration) >= 3);
        // Announced 200 ms after the first HELLO: the stream opens.
        let opening = tokio::spawn(open(link, keys(&[1]), dst, Duration::from_secs(5)));
        tokio::time::sleep(Duration::from_millis(200)).await;
        core.handle(started(dst)).await;
        assert!(opening.await.unwrap().is_ok());
        assert!(dialed(&l, Duration::from_secs(2)).await);
    });
}

#[test]
fn an_unreachable_destination_is_refused_after_the_proof() {
    within(Duration::from_secs(20), || async {
        let core = target(keys(&[1]));
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dst = closed.local_addr().unwrap();
        drop(closed);
        core.handle(started(dst)).await;
        let r = open(
            Arc::new(Loop::new(&core)),
            keys(&[1]),
            dst,
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(r.err(), Some(Fallback::PeerRefused));
        assert_eq!(outcome(&core, Outcome::Unreachable), 1);
        assert_eq!(core.shared().metrics.connections_active.get(), 0);
    });
}

#[test]
fn a_request_whose_source_gave_up_is_never_dialed() {
    within(Duration::from_secs(20), || async {
        let core = target(keys(&[1]));
        let (l, dst) = destination().await;
        core.handle(started(dst)).await;
        let shared = core.shared().clone();
        let (handles, destination) = shared.target_for(&UidDigest::of("u1"), dst.port()).unwrap();
        let conn = FakeConn::default();
        conn.kill();
        serve(
            shared,
            conn.clone(),
            Admitted {
                handles,
                destination,
                accept: [0; 16],
            },
        )
        .await;
        assert_eq!(conn.calls(), []);
        assert!(!dialed(&l, Duration::from_millis(300)).await);
    });
}

#[test]
fn a_target_dials_only_its_own_virt_handlers_addresses() {
    within(Duration::from_secs(30), || async {
        // virt-handler's namespace holds 10.9.0.5; the node advertises 10.0.0.7.
        let vh = TestNetns::start();
        let core = GatewayCore::new(Arc::new(
            Shared::new(
                Err(Fallback::NoProvider),
                Arc::new(crate::streams::StaticPeers::default()),
                Arc::new(PathLocator(vh.path())),
                crate::metrics::Metrics::default(),
                Settings {
                    advertised: Some("10.0.0.7".parse().unwrap()),
                    ..Settings::default()
                },
            )
            .with_keys(KeyRing::fixed(keys(&[1]))),
        ));
        let shared = core.shared().clone();
        let ours: SocketAddr = TARGET_GW.parse().unwrap();
        let from: SocketAddr = SOURCE_GW.parse().unwrap();
        let hello = |port: u16, uid: &str| {
            let h = Open::Hello(Hello {
                port,
                migration: UidDigest::of(uid),
                nonce: [1; 16],
            })
            .encode();
            match admission::judge(&shared, &h, Some(from), Some(ours), Instant::now()) {
                Verdict::Refuse(_, o) => o,
                Verdict::Admit(_) => panic!("a HELLO is never admitted"),
            }
        };
        let start = |uid: &str, target: &str, port: u16| {
            MigrationEvent::Started(Migration {
                uid: uid.into(),
                id: uid.into(),
                vmi: format!("default/{uid}"),
                role: Role::Target,
                target: target.parse::<IpAddr>().unwrap(),
                ports: vec![port],
                started: None,
            })
        };
        // virt-handler's address, and the node's advertised one: challenged.
        core.handle(start("a", "10.9.0.5", 1)).await;
        core.handle(start("b", "10.0.0.7", 2)).await;
        // Anything else (another node's pod, a service, loopback) is refused.
        core.handle(start("c", "10.9.0.6", 3)).await;
        core.handle(start("d", "127.0.0.1", 4)).await;
        assert_eq!(hello(1, "a"), Outcome::Challenged);
        assert_eq!(hello(2, "b"), Outcome::Challenged);
        assert_eq!(hello(3, "c"), Outcome::NotLocal);
        assert_eq!(hello(4, "d"), Outcome::NotLocal);
        assert_eq!(hello(5, "a"), Outcome::UnknownMigration);
        drop(vh);
        // virt-handler gone (its namespace unreadable): only the advertised address.
        core.handle(start("e", "10.9.0.5", 6)).await;
        assert_eq!(hello(6, "e"), Outcome::NotLocal);
    });
}
