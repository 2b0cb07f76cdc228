//! `libstreamshim.so`: the LD_PRELOAD stream shim of rdma-streams.
//!
//! **Phase 1** (this build): loaded into arbitrary programs, it always keeps plain kernel TCP,
//! but decides, counts and reports exactly like the upgrading shim will, so that phase 2 only
//! adds the upgrade path (docs/shim-protocol.md).
//!
//! One call, step by step (`connect(fd, addr, len)` from a program):
//! 1. [`hooks`]: the exported `connect` detour finds libc's original in [`real`]'s table
//!    (resolved by the ELF constructor with `dlsym(RTLD_NEXT)`), enters the per-thread
//!    re-entrancy [`guard`] (nested calls go straight to the original) and runs the op under
//!    `catch_unwind`.
//! 2. [`ops::connect`]: looks the fd up in the lock-free [`fdtable`] (an INET stream socket made
//!    by a hooked `socket()`?), calls the original, and if the connect succeeded or is in
//!    progress counts it once with its reason: the process's [`decision`] (one atomic load), or
//!    in a capable process the per-peer policy.
//! 3. Back in the detour, errno is the original call's errno, and the result is returned.
//!
//! Env: `STREAMSHIM_DISABLE`, `STREAMSHIM_POLICY`, `STREAMSHIM_PROVIDER`, `STREAMSHIM_STATS`
//! (JSON at exit, `%p` = pid), `STREAMSHIM_LOG` (`info`/`debug`; silent otherwise).
//!
//! Only [`hooks`], [`real`] and [`sys`] contain `unsafe` code (each says why).

mod decision;
mod fdtable;
mod guard;
mod hooks;
mod log;
mod ops;
mod real;
mod sys;
