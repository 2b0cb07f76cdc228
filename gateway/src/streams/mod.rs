//! What the gateways speak between them, and the TCP fallback: where the peer gateway of a
//! target address is ([`PeerLookup`]), the connect requests and their answers ([`payload`]),
//! the pre-shared keys ([`keys`]) and the MACs over a stream's opening ([`transcript`]) the
//! gateways authenticate each other with, the challenges a target holds ([`challenges`]),
//! opening a stream to a peer ([`outbound`]), carrying a TCP connection over an open stream
//! ([`stream`]), relaying it over TCP instead ([`relay`]) and why ([`Fallback`]). Nothing here
//! knows a migration's state: [`crate::migration`] uses it for both roles.

pub(crate) mod challenges;
mod fallback;
pub mod keys;
pub(crate) mod outbound;
pub(crate) mod payload;
mod peers;
pub(crate) mod relay;
pub(crate) mod stream;
pub(crate) mod transcript;

pub use fallback::Fallback;
pub use peers::{ChainedPeers, PeerEntry, PeerLookup, StaticPeers};
