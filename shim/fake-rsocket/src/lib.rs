//! A fake rsocket provider: librdmacm's rsocket ABI over ordinary kernel TCP sockets.
//!
//! No development machine or CI host has an RDMA device, so the transport crate and the shim
//! are exercised against this library (`libfakersocket.so`) instead of `librdmacm.so.1`. It is
//! loaded the same way (`dlopen` + `dlsym` of `rsocket`, `rconnect`, `rpoll`, ...) and behaves
//! like rsockets where it matters for the callers:
//!
//! - **Socket numbers are not kernel fds.** `rsocket()` hands out numbers from [`FIRST_RFD`]
//!   (1,000,000) upward, looked up in a private table, so an r-fd leaked into a libc call fails
//!   loudly with `EBADF` instead of touching an unrelated file.
//! - **A separate port space.** rsocket port `P` is kernel TCP port `P + offset`
//!   (`FAKE_RSOCKET_PORT_OFFSET`, default 20000, modulo 65536), as rdma_cm's port space is apart
//!   from the kernel's: an rsocket listener and a kernel listener can share a port number.
//! - **Only `AF_INET`/`AF_INET6` `SOCK_STREAM`**, `rfcntl` only `F_GETFL`/`F_SETFL`, a
//!   non-blocking `rconnect` always answers `EINPROGRESS` (rdma_cm connects are asynchronous).
//! - **Counters** of connections and bytes that went through r-fds, so a test can prove which
//!   path carried a connection (`FAKE_RSOCKET_STATS_DIR`, [`fake_rsocket_stats_json`]).
//! - **Faults** from `FAKE_RSOCKET_FAULTS` (see [`Faults`]): no device, ENOMEM, refused, slow
//!   or hanging connects, EAGAIN storms, mid-stream resets, a poll that never wakes.
//!
//! Layout: [`ffi`] is the only module with `unsafe` (the exported C functions turn raw
//! pointers into slices and back, set `errno`, catch panics); `ops`, `poll`, `table`, `addr`,
//! `stats` and `config` are safe Rust.
//!
//! Environment (each read once per process, on first use):
//!
//! | variable | meaning |
//! | --- | --- |
//! | `FAKE_RSOCKET_FAULTS` | comma list of faults, see [`Faults::parse`] |
//! | `FAKE_RSOCKET_PORT_OFFSET` | kernel port = rsocket port + offset (default 20000) |
//! | `FAKE_RSOCKET_HANG_MS` | cap of a blocking `hang_connect` (default 30000) |
//! | `FAKE_RSOCKET_STATS_DIR` | write `<dir>/<pid>.json` on every `rclose` and at exit |

mod addr;
mod config;
mod errno;
mod faults;
pub mod ffi;
mod ops;
mod poll;
mod stats;
mod table;

pub use config::{
    DEFAULT_HANG_MS, DEFAULT_PORT_OFFSET, ENV_FAULTS, ENV_HANG_MS, ENV_PORT_OFFSET, ENV_STATS_DIR,
};
pub use faults::Faults;
pub use ffi::*;
pub use stats::Snapshot;
pub use table::FIRST_RFD;

/// The faults this process runs with (parsed once from `FAKE_RSOCKET_FAULTS`); for tests.
pub fn fake_rsocket_faults() -> &'static Faults {
    &config::config().faults
}

/// The port offset this process runs with (`FAKE_RSOCKET_PORT_OFFSET`); for tests.
pub fn fake_rsocket_port_offset() -> u16 {
    config::config().port_offset
}

/// A copy of this process's counters; for in-process tests.
pub fn fake_rsocket_stats() -> Snapshot {
    stats::snapshot()
}
