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
//! once (60 s bound) and caches the answer in `<target>/softroce/accel-<kernel release>`. On the
//! development machines nested KVM fails (QEMU 7.2 aborts on `failed to set MSR 0x10a`, or the
//! guest hangs after "Probing EDD"), so guests run under TCG.
//!
//! # Measured on the development machines (2 cores, TCG, another build running)
//! - A loop guest boots to its init script in about 25-35 s, most of it kernel boot under
//!   emulation and udev's coldplug (about 8 s); the topology takes another 1-2 s.
//! - Two guests given the same `--rwdir` host directory see each other's files at once: vng
//!   mounts it as 9p without a cache (`sync,dirsync`), so a file created by one guest is
//!   visible to the other on its next lookup (a 100 ms poll saw it), and appends from both
//!   interleave line by line. The wire scenarios' barriers ([`Ctx::barrier`]) rely on this.
//! - QEMU's socket netdev carries 9000-byte frames (virtio-net accepts MTUs up to 65535 and
//!   the socket backend passes frames up to 69632 bytes), so the wire runs at MTU 9000 and rxe
//!   at a 4096 path MTU, like the loop's veth.
//! - vng needs a static busybox (busybox-static) for the initramfs it builds: Debian's kernel
//!   has 9p as a module. With `--verbose` the kernel console goes to vng's stderr and the
//!   command's stdout to vng's stdout; both are kept in `console.log`.
//! - The 9p root cannot `ftruncate` or bind unix sockets, hence the tmpfs `TMPDIR`.
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

pub use accel::Accel;
pub use error::Error;
pub use guest::{Outcome, run, run_pair, run_pair_with, run_with};
pub use scenario::{Ctx, Role, Scenario, ScenarioFn, Topology};
pub use spec::{GuestSpec, Net, WireRole};
