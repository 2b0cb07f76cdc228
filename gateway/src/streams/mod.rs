//! What the gateways speak between them, and the TCP fallback: where the peer gateway of a
//! target address is ([`PeerLookup`]), the connect request and its answer ([`payload`]),
//! opening a stream to a peer ([`outbound`]), carrying a TCP connection over an open stream
//! ([`stream`]), relaying it over TCP instead ([`relay`]) and why ([`Fallback`]). Nothing here
//! knows a migration's state: [`crate::migration`] uses it for both roles.

mod fallback;
pub(crate) mod outbound;
pub(crate) mod payload;
mod peers;
pub(crate) mod relay;
pub(crate) mod stream;

pub use fallback::Fallback;
pub use peers::{ChainedPeers, PeerEntry, PeerLookup, StaticPeers};
