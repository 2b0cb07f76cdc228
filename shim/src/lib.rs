//! `libstreamshim.so`: the LD_PRELOAD stream shim of rdma-streams.
//!
//! **Phase 2** (this build): loaded into arbitrary programs, it decides once per process
//! whether it may upgrade at all, and in a capable process negotiates each TCP connection with
//! the peer's shim on the rsocket side channel and, when both agree, moves its bytes to an
//! rsocket stream in proxy mode ([`upgrade`], docs/shim-protocol.md); everything else stays the
//! plain kernel TCP connection, counted and reported with its reason.
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
mod forksafe;
mod guard;
mod hooks;
mod log;
mod ops;
mod real;
mod sys;
mod upgrade;
