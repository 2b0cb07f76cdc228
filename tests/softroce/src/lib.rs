//! Soft-RoCE test guests: boots QEMU guests with [virtme-ng] (`vng`) on a Debian kernel that
//! has `rdma_rxe`, sets up an RDMA topology inside them with the real rdma-core, and runs test
//! scenarios there. The development machines' own kernel has no RDMA at all
//! (`/work/shared/rdma-stack.md`, section 1).
//!
//! - [`run`] boots one guest from a [`GuestSpec`] and returns its [`Outcome`]; [`run_pair`]
//!   boots two joined by a wire ([`Net::Wire`]).
//! - The guest runs `guest/init.sh` (a real file: it can be read and run by hand), which loads
//!   `rdma_rxe`, lifts the memlock limit, mounts a tmpfs on `/run/w` (`TMPDIR`), builds the
//!   topology and runs the command with `SOFTROCE_ADDR_A`, `SOFTROCE_ADDR_B`, `SOFTROCE_ROLE`
//!   (`loop`, `a`, `b`), `SOFTROCE_DEVICES`, `SOFTROCE_IN_GUEST=1`, `SOFTROCE_WORK` (the shared
//!   host directory) and `SOFTROCE_OUT` (this guest's directory in it).
//! - [`runner::main`] is the whole `harness = false` test binary: a registry of [`Scenario`]s
//!   run in one loop guest and one wire pair (see `tests/softroce.rs`).
//!
//! # Finding things
//! The kernel is `SOFTROCE_KERNEL` or the newest `/boot/vmlinuz-<v>` whose
//! `/lib/modules/<v>` has `rdma_rxe`; vng is `SOFTROCE_VNG`, `<workspace>/.tools/vng/bin/vng`
//! (`make deps` installs virtme-ng 1.42 there) or `vng` on `PATH`. The guest's root is the
//! host's over 9p, so the guest's tools are host packages: `make deps` installs them
//! (linux-image-amd64, qemu-system-x86, busybox-static, rdma-core, ibverbs-utils,
//! ibverbs-providers, rdmacm-utils, perftest, kmod). [`locate::tools`] names what is missing.
//!
//! # KVM or TCG
//! `SOFTROCE_ACCEL=kvm|tcg` forces one; otherwise [`accel::accel`] boots a trivial KVM guest
//! once (60 s bound, after a `vng --dry-run` that must work) and caches the answer in
//! `<target>/softroce/accel-<kernel release>` (re-probed when the host kernel changes). On the
//! development machines nested KVM fails within seconds: QEMU 7.2 aborts with `failed to set
//! MSR 0x10a` (or hangs after "Probing EDD"), so guests run under TCG.
//!
//! # What vng needs and does here (virtme-ng 1.42, QEMU 7.2, Debian's 6.1 kernel)
//! - vng runs `virtme-run` through `/bin/sh`: its virtualenv's `bin` must be on `PATH` or it
//!   fails at once with "virtme-run: not found" (exit 127); [`locate::vng_command`] does that.
//! - It needs a static busybox (busybox-static) for the initramfs it builds, since Debian's
//!   kernel has 9p as a module.
//! - It tries virtiofsd first (QEMU's old C virtiofsd is in `/usr/lib/qemu`), which fails with
//!   "fuse: invalid argument" after about 3.3 s per shared directory before vng falls back to
//!   9p: guests use `--force-9p` ([`guest::VNG_OPTIONS`]).
//! - udev's coldplug in the guest loads modules for QEMU's `-cpu max` and q35 devices; `kvm_amd`
//!   alone took 8 s under TCG. `modprobe.blacklist=` on the kernel command line skips the ones
//!   no scenario uses: the guest reached its init script at 12-19 s of guest uptime instead of
//!   32-34 s.
//! - `SOFTROCE_APPEND` adds kernel command-line options to every guest (an experiment's, such
//!   as `idle=poll`; [`guest::APPEND_VAR`]).
//! - With `--verbose` the kernel console goes to vng's stderr and the command's stdout to vng's
//!   stdout (without it the console goes to /dev/null); both are kept in `console.log`.
//! - The 9p root cannot `ftruncate` or bind unix sockets, hence the tmpfs `TMPDIR`; the root
//!   has no `ping` (iputils-ping is not installed on the host).
//! - `unshare --pid --fork --kill-child --mount-proc` works in the guest (root, initial
//!   namespaces); the runner runs every scenario that way.
//!
//! # Shared directories and the wire
//! - Two guests given the same `--rwdir` host directory see each other's files at once: vng
//!   mounts it as 9p with no cache (`sync,dirsync`), so a file created by one guest is visible
//!   to the other on its next lookup (a 1 s poll saw it on its first try), and appends from both
//!   interleave line by line. The wire scenarios' barriers ([`Ctx::barrier`]) rely on this.
//! - QEMU's socket netdev takes MTU 9000 (virtio-net accepts up to 65535 and the socket
//!   backend passes frames up to 69632 bytes): the wire runs at MTU 9000 and rxe at a 4096 path
//!   MTU, like the loop's veth, and 64 KiB rstream messages cross in 4096-byte RoCE packets.
//! - A QEMU 7.2 `connect=` socket netdev that finds nothing listening neither retries nor
//!   exits: the guest boots with a dead link. [`run_pair`] starts B's QEMU only once A's
//!   listening socket shows in `/proc/net/tcp` (connecting to check would take the one
//!   connection QEMU accepts).
//!
//! # Measured (2 cores, TCG, another engineer's build running: times vary with that load)
//! - A loop guest reaches its init script 15-55 s after vng starts and has its topology 6-20 s
//!   later; the three loop smoke scenarios take 4-10 s together; the whole loop guest 33-79 s.
//! - The wire pair (two guests booting at once) reaches the init scripts after 36-70 s; the two
//!   wire smoke scenarios take about 10 s; the pair 58-97 s.
//! - `cargo test -p rdma-streams-softroce` (both, one after the other): 101-160 s.
//! - The KVM probe costs about 7 s, once per kernel and host kernel.
//!
//! # Files of a run
//! Each run has a directory `<target>/softroce/runs/<name>-<time>-<random>/` (shared with the
//! guest at the same path); guest `G`'s files are in its `G/` subdirectory: `init.sh`,
//! `guest.env`, `console.log`, `stdout`, `stderr`, `status` (`exit N` or `setup-failed STEP`)
//! and, for the runner, `scenarios/<name>.log`. The runner removes the directory after a run
//! where everything passed and keeps it (and says where) otherwise; [`run`] leaves it to the
//! caller.
//!
//! [virtme-ng]: https://github.com/arighi/virtme-ng

pub mod accel;
pub mod cli;
mod error;
pub mod guest;
pub mod helpers;
pub mod locate;
pub mod process;
pub mod runner;
pub mod scenario;
pub mod spec;
mod stacks;
pub mod unittest_log;

pub use accel::Accel;
pub use error::Error;
pub use guest::{Outcome, run, run_pair, run_pair_with, run_with};
pub use scenario::{Ctx, Role, Scenario, ScenarioFn, Topology};
pub use spec::{GuestSpec, Net, WireRole};
