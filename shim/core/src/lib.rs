//! The stream shim's logic, as a safe library that tests drive in-process; `libstreamshim.so`
//! (the `rdma-streams-shim` crate) is only its C boundary: the exported hooks, the table of
//! libc originals and the ELF constructor.
//!
//! One call, step by step (`connect(fd, addr, len)` from a program):
//! 1. the hook finds libc's original and runs the op in [`ops`] through [`guard::detour`]: the
//!    per-thread re-entrancy guard (nested calls go straight to the original), `catch_unwind`
//!    and errno, written once; data calls ask [`calls`] which way they go;
//! 2. [`ops::connect`] looks the fd up in the lock-free [`fdtable`] (an INET stream socket made
//!    by a hooked `socket()`?), and for a capable process (the once-per-process [`decision`], one
//!    atomic load) whose policy allows the peer runs [`upgrade::connect`]; everything else calls
//!    the original and counts the connection once with its reason;
//! 3. back in the hook, errno is the original call's errno, and the result is returned.
//!
//! Env: every `STREAMSHIM_*` variable is read once, at the decision, by [`settings`]; the rest
//! of the shim takes its values from there (the table is in `docs/shim.md`).
//!
//! Only [`sys`] contains `unsafe` code (syscalls on raw fd numbers; each block says why).

pub mod calls;
pub mod decision;
pub mod direct;
pub mod errqueue;
pub mod fdtable;
pub mod forksafe;
pub mod guard;
pub mod log;
pub mod negative_cache;
pub mod negotiation;
pub mod ops;
pub mod policy;
pub mod readiness;
pub mod reason;
pub mod ring;
pub mod services;
pub mod settings;
pub mod stats;
pub mod sys;
pub mod upgrade;
pub mod watches;

#[cfg(test)]
mod env_fuzz;
