//! The FFI edge: librdmacm and libibverbs loaded with `dlopen`, and one thin wrapper per call.
//!
//! This module tree is the crate's only `unsafe` code (hence the `allow`, overriding the
//! workspace's `unsafe_code = "deny"`); every block says why it is sound. Struct layouts and the
//! inline verbs come from `rdma-sys` (bindgen over the system headers), whose link directives
//! the linker drops (`--as-needed`): nothing here references an rdma-core symbol at link time.
#![allow(unsafe_code)]

mod cm;
mod lib;
mod verbs;

pub use cm::{
    CmEvent, CmId, ConnSettings, EventChannel, EventKind, MAX_ACCEPT_PRIVATE_DATA,
    MAX_CONNECT_PRIVATE_DATA, MAX_REJECT_PRIVATE_DATA, PortSpace, devices,
};
pub use lib::{DEFAULT_PROVIDER, Lib, LoadError, VERBS_SONAME};
pub use verbs::{
    Access, Context, Cq, Device, Local, Mr, Pd, Qp, Region, SIOCATMARK, Wc, at_mark,
    ensure_fork_safe, unread_by_peer,
};

/// `IBV_WC_SUCCESS`.
pub const WC_SUCCESS: u32 = rdma_sys::ibv_wc_status::IBV_WC_SUCCESS;
/// `IBV_WC_WR_FLUSH_ERR`: work flushed after the QP entered the error state.
pub const WC_FLUSH_ERR: u32 = rdma_sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
/// `IBV_WC_RECV`.
pub const WC_RECV: u32 = rdma_sys::ibv_wc_opcode::IBV_WC_RECV;
/// `IBV_WC_RECV_RDMA_WITH_IMM`.
pub const WC_RECV_RDMA_WITH_IMM: u32 = rdma_sys::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM;
