//! The RDMA data path of rdma-streams: reliable byte streams over the RDMA connection manager
//! and verbs, driven by one event loop per process.
//!
//! Used by the shim (`libstreamshim.so`, no async runtime) and by the migration gateway.
//!
//! - [`rdma`]: librdmacm and libibverbs, loaded with `dlopen` (nothing links rdma-core), and one
//!   thin wrapper per C call: the crate's only `unsafe` code.
//! - [`probe`](mod@probe): whether this process can use RDMA at all (devices, iWARP, fork safety).
//! - [`engine`]: the [`Engine`]: connect, listen, attach a local fd, with the stream protocol of
//!   [`flow`] (credits over a receive ring) and [`wire`] (private data, control messages).
//! - [`fd`], [`route`]: operations on the kernel fds the engine drives, and the local address
//!   the kernel would send from to a peer.
//! - [`sockaddr`]: C socket addresses to and from `SocketAddr` (also the shim's hooks').
//!
//! What rides on a stream is the caller's: the shim's negotiation messages, policy, reasons and
//! stats are in `rdma-streams-shim-core`, the gateway's connect payloads in the gateway. The
//! caller also says where the RDMA libraries come from ([`probe()`] takes the librdmacm name).

pub mod engine;
pub mod fd;
pub mod flow;
pub mod probe;
pub mod rdma;
pub mod route;
pub mod sockaddr;
pub mod wire;

pub use engine::{
    Acceptor, Attach, Conn, ConnectError, ConnectRequest, Decision, End, Engine, EngineConfig,
    EngineError, Event, Handshake, Listener, RejectedBy, Request, StreamPath,
};
pub use probe::{Unusable, Usable, probe};
