//! The target side's judgement of a connect request (`crate::streams::payload`), made on the
//! engine thread before anything is allocated for the connection, so it must be quick and
//! must not block: decode, look the migration up, issue or take a challenge, verify a MAC.
//!
//! - HELLO: the target must hold a key; the migration (uid digest) must be one this node
//!   carries as target, publishing the port, with its target address this node's (checked at
//!   its start); then a challenge is issued (`crate::streams::challenges`: bounded,
//!   expiring, single-use) and the request is rejected with it.
//! - PROOF: its challenge is taken (gone from then on, whatever follows), the proof tag must
//!   verify under one of the keys over the transcript (both nonces, port, digest, destination,
//!   both gateways' addresses as this side sees them), and the migration must still be here.
//!   Only then is the request [`Verdict::Admit`]ted: the caller defers it, dials the
//!   destination, and accepts with the accept tag, made with the key the proof verified under
//!   (the source holds it: it signed with it).
//!
//! Every other outcome is a reject with its answer, counted under its cause
//! (`rdma_gw_peer_requests_total{outcome}`).

use std::{
    net::{IpAddr, SocketAddr},
    time::Instant,
};

use super::state::{Handles, NoTarget, Shared};
use crate::streams::{
    challenges::IssueError,
    payload::{Answer, Hello, Open, PayloadError, Proof},
    transcript::{Label, Tag, Transcript, random_nonce},
};

/// What became of a request (metric label `outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A HELLO answered with a challenge.
    Challenged,
    /// A PROOF that verified: the stream is opened (if the destination answers).
    Admitted,
    /// Not a gateway's request (or malformed, or no addresses).
    BadRequest,
    /// A version-1 request: a gateway without peer authentication.
    OldVersion,
    /// This gateway has no peer key.
    NoKey,
    /// No such target migration here (uid digest and port).
    UnknownMigration,
    /// The migration's target address is not this node's.
    NotLocal,
    /// Too many challenges pending (for the source or in all).
    Busy,
    /// A PROOF whose challenge is unknown: expired, already used (a replay), or never issued.
    NoChallenge,
    /// A PROOF whose tag verifies under no key.
    BadProof,
    /// Admitted, but the destination could not be dialed.
    Unreachable,
}

impl Outcome {
    pub const ALL: [Outcome; 11] = [
        Outcome::Challenged,
        Outcome::Admitted,
        Outcome::BadRequest,
        Outcome::OldVersion,
        Outcome::NoKey,
        Outcome::UnknownMigration,
        Outcome::NotLocal,
        Outcome::Busy,
        Outcome::NoChallenge,
        Outcome::BadProof,
        Outcome::Unreachable,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Challenged => "challenged",
            Outcome::Admitted => "admitted",
            Outcome::BadRequest => "bad_request",
            Outcome::OldVersion => "old_version",
            Outcome::NoKey => "no_key",
            Outcome::UnknownMigration => "unknown_migration",
            Outcome::NotLocal => "not_local",
            Outcome::Busy => "busy",
            Outcome::NoChallenge => "no_challenge",
            Outcome::BadProof => "bad_proof",
            Outcome::Unreachable => "unreachable",
        }
    }
}

/// An authenticated request: what the target does next.
#[derive(Clone)]
pub struct Admitted {
    pub handles: Handles,
    /// Where to dial: the migration's target address, the requested port.
    pub destination: SocketAddr,
    /// The accept's tag.
    pub accept: Tag,
}

/// The judgement of one request.
pub enum Verdict {
    /// Reject with this answer.
    Refuse(Answer, Outcome),
    /// Authenticated: dial, then accept.
    Admit(Box<Admitted>),
}

fn refuse(answer: Answer, outcome: Outcome) -> Verdict {
    Verdict::Refuse(answer, outcome)
}

fn missing(why: NoTarget) -> Verdict {
    match why {
        NoTarget::Unknown => refuse(Answer::UnknownMigration, Outcome::UnknownMigration),
        NoTarget::NotLocal => refuse(Answer::NotLocal, Outcome::NotLocal),
    }
}

/// Judges the request `payload` from `peer` (the source gateway's RDMA address) to `local`
/// (ours, as the request names it; else our `--listen` address) at `now`.
pub fn judge(
    shared: &Shared,
    payload: &[u8],
    peer: Option<SocketAddr>,
    local: Option<SocketAddr>,
    now: Instant,
) -> Verdict {
    let open = match Open::decode(payload) {
        Ok(open) => open,
        Err(PayloadError::Legacy) => return refuse(Answer::Version, Outcome::OldVersion),
        Err(_) => return refuse(Answer::BadRequest, Outcome::BadRequest),
    };
    let source = peer.map(|p| p.ip().to_canonical());
    let ours = local
        .map(|l| l.ip().to_canonical())
        .filter(|ip| !ip.is_unspecified())
        .or(shared.settings.stream_source);
    let (Some(source), Some(ours)) = (source, ours) else {
        return refuse(Answer::BadRequest, Outcome::BadRequest);
    };
    if shared.keys.current().is_empty() {
        return refuse(Answer::NoKey, Outcome::NoKey);
    }
    match open {
        Open::Hello(hello) => challenge(shared, &hello, source, now),
        Open::Proof(proof) => verify(shared, &proof, source, ours, now),
    }
}

fn challenge(shared: &Shared, hello: &Hello, source: IpAddr, now: Instant) -> Verdict {
    if let Err(why) = shared.target_for(&hello.migration, hello.port) {
        return missing(why);
    }
    let issued = shared.challenges().issue(
        now,
        source,
        hello.migration,
        hello.port,
        hello.nonce,
        random_nonce,
    );
    match issued {
        Ok(nonce) => refuse(Answer::Challenge(nonce), Outcome::Challenged),
        Err(IssueError::SourceFull(_) | IssueError::TableFull(_) | IssueError::Random) => {
            refuse(Answer::Busy, Outcome::Busy)
        }
    }
}

fn verify(shared: &Shared, proof: &Proof, source: IpAddr, ours: IpAddr, now: Instant) -> Verdict {
    let Some(pending) = shared.challenges().take(now, source, &proof.ticket) else {
        return refuse(Answer::AuthFailed, Outcome::NoChallenge);
    };
    if pending.migration != proof.migration || pending.port != proof.port {
        return refuse(Answer::AuthFailed, Outcome::NoChallenge);
    }
    let (handles, destination) = match shared.target_for(&proof.migration, proof.port) {
        Ok(found) => found,
        Err(why) => return missing(why),
    };
    let transcript = Transcript {
        source_nonce: pending.source_nonce,
        target_nonce: pending.target_nonce,
        port: proof.port,
        migration: proof.migration,
        destination: destination.ip(),
        source_gateway: source,
        target_gateway: ours,
    };
    let keys = shared.keys.current();
    match transcript.verify(&keys, Label::Proof, &proof.tag) {
        Some(key) => Verdict::Admit(Box::new(Admitted {
            handles,
            destination,
            accept: transcript.tag(key, Label::Accept),
        })),
        None => refuse(Answer::AuthFailed, Outcome::BadProof),
    }
}
