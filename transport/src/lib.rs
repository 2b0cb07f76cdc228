//! The safe Rust face of an rsocket provider: the RDMA data path of rdma-streams.
//!
//! Used by the shim (`libstreamshim.so`, no async runtime) and by the migration gateway.
//!
//! - [`Provider`] loads librdmacm (`STREAMSHIM_PROVIDER`, default `librdmacm.so.1`) or any
//!   library with its rsocket ABI, such as the test double `libfakersocket.so`, with `dlopen`,
//!   and [`Provider::probe`] tells whether an RDMA device is usable. Nothing links rdma-core.
//! - [`RSocket`] owns one rsocket (closed on drop) with a `std::net`-like API and a connect
//!   that always honours its timeout.
//! - [`poll()`] waits on rsockets and ordinary fds together (the provider's `rpoll`).
//! - [`pump()`] moves a connection's bytes both ways between a local stream socket (one end of
//!   the app's socketpair) and an rsocket, with half-close propagation and teardown on error.
//! - The upgrade protocol's pieces: [`handshake`] (side-channel messages), [`policy`]
//!   (`STREAMSHIM_POLICY`), [`negative_cache`], [`reason`] (paths and fallback reasons) and
//!   [`stats`] (`STREAMSHIM_STATS`).
//!
//! All `unsafe` code is in the `provider` module (the `dlopen`/`dlsym` edge and one thin
//! wrapper per C call); everything else is safe Rust on top of it.

pub mod handshake;
pub mod negative_cache;
pub mod policy;
pub mod poll;
pub mod provider;
pub mod pump;
pub mod reason;
pub mod rsocket;
mod sockaddr;
pub mod stats;

pub use poll::{Events, PollError, PollFd, poll};
pub use provider::{
    DEFAULT_PROVIDER, ENV_PROVIDER, NoDevice, Provider, ProviderError, RawFns, provider_name,
};
pub use pump::{
    Peeked, PumpControl, PumpEnd, PumpError, PumpOptions, PumpReport, peek, pump, relay,
};
pub use rsocket::{Family, RSocket, RSocketError, RdmaOption, SOL_RDMA};
