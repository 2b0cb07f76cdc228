#!/usr/bin/env bash
# e2e/softroce.sh (`make e2e-softroce`): the Soft-RoCE suite of tests/softroce run directly on
# this host instead of in QEMU guests: the shim and the migration gateway over real RDMA streams,
# with the real librdmacm and libibverbs. Needs root and a kernel with rdma_rxe (the suite builds
# its topology: two rxe devices on the two ends of a veth in the initial network namespace,
# with policy routing so traffic between them crosses the veth; rxe does not work in other
# network namespaces on 6.1). Everything it sets up is removed on exit. On a machine without
# rdma_rxe it prints one `SKIP: <why>` line and exits 0 (77 with SOFTROCE_REQUIRE=1); `make
# test` runs the same suite in QEMU guests on any machine.
#
# Usage: e2e/softroce.sh [FILTER...]   (scenario name filters, as `cargo test` takes them)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=e2e/rxe-preflight.sh
. "$ROOT/e2e/rxe-preflight.sh"

[[ $(id -u) -eq 0 ]] || skip "needs root (the suite loads rdma_rxe and builds its topology)"
rxe_preflight
cd "$ROOT"
cargo build --workspace
SOFTROCE_DIRECT=1 cargo test -p rdma-streams-softroce --test softroce -- "$@"
