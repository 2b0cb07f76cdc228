//! The RDMA data path of rdma-streams: reliable byte streams over the RDMA connection manager
//! and verbs, driven by one event loop per process.
//!
//! Used by the shim (`libstreamshim.so`, no async runtime) and by the migration gateway.
//!
//! - [`rdma`]: librdmacm and libibverbs, loaded with `dlopen` (nothing links rdma-core), and one
//!   thin wrapper per C call: the crate's only `unsafe` code.
//! - [`probe`]: whether this process can use RDMA at all (devices, iWARP, fork safety).
//! - [`engine`]: the [`Engine`]: connect, listen, attach a local fd, with the stream protocol of
//!   [`flow`] (credits over a receive ring) and [`wire`] (private data, control messages).
//! - The shim's upgrade pieces: [`handshake`] (its negotiation payloads), [`policy`]
//!   (`STREAMSHIM_POLICY`), [`negative_cache`], [`reason`] (paths and fallback reasons) and
//!   [`stats`] (`STREAMSHIM_STATS`).

pub mod engine;
pub mod fd;
pub mod flow;
pub mod handshake;
pub mod negative_cache;
pub mod policy;
pub mod probe;
pub mod rdma;
pub mod reason;
pub mod route;
mod sockaddr;
pub mod stats;
pub mod wire;

pub use engine::{
    Acceptor, Attach, Conn, ConnectError, ConnectRequest, Decision, End, Engine, EngineConfig,
    EngineError, Event, Handshake, Listener, RejectedBy, Request, StreamPath, WaitError,
};
pub use probe::{Unusable, Usable, probe};
