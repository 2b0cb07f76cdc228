//! `libstreamshim.so`: the LD_PRELOAD stream shim of rdma-streams.
//!
//! Loaded into arbitrary programs, it decides once per process whether it may upgrade at all,
//! and in a capable process moves a TCP connection's bytes onto an RDMA stream when the peer's
//! shim agrees (docs/shim-protocol.md); everything else stays the plain kernel TCP connection,
//! counted and reported with its reason.
//!
//! This crate is only the C boundary: [`hooks`] (the exported detours, the ELF constructor and
//! destructor, the exit and fork callbacks) and [`real`] (libc's originals, resolved with
//! `dlsym(RTLD_NEXT)`). The logic is the `rdma-streams-shim-core` library (`streamshim_core`),
//! which tests drive in-process; the RDMA data path is `rdma-streams-transport`.

mod hooks;
mod real;
mod waits;
