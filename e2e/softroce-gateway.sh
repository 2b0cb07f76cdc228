#!/usr/bin/env bash
# e2e/softroce-gateway.sh: the migration gateway over real RDMA streams on Soft-RoCE (rdma_rxe),
# on a host whose own kernel has rdma_rxe (the development machines' has not: there the same
# runs inside a Soft-RoCE guest, see gateway/testbed/tests/scripts/softroce-migration.sh).
#
# Sets up the Soft-RoCE loop topology in the initial network namespace
# (tests/softroce/guest/init.sh --setup-only --role loop: veth va/vb with rxea/rxeb at
# 198.18.0.1/.2 and policy routing across the veth; rxe works in no other namespace on 6.1),
# then runs
#   1. gateway/testbed/tests/scripts/softroce-migration.sh: QEMU migrations through two gateways over
#      the stream (byte-exact, counted as RDMA), parallel streams, abort, the peer killed
#      mid-migration, the peer down, no peer, a stream timeout;
#   2. the gateway benchmark in RDMA mode (GATEWAY_BENCH_RDMA=198.18.0.1,198.18.0.2
#      cargo bench -p rdma-gateway-testbed --bench chain): every gateway round must take the
#      stream; its goals are judged on hardware only (rxe is software);
# and removes the topology.
#
# Usage: e2e/softroce-gateway.sh [-h|--help]
#
# Environment: SOFTROCE_REQUIRE=1 turns a host without rdma_rxe into exit 77 instead of a skip.
# Exit status: 0 passed or skipped (one `SKIP: <why>` line); 77 skip under SOFTROCE_REQUIRE=1;
# 1 a scenario or the benchmark failed.

set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly ROOT

case ${1:-} in
-h | --help)
	sed -n '2,/^$/{s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
	exit 0
	;;
"") ;;
*)
	echo "softroce-gateway: unknown argument '$1' (see --help)" >&2
	exit 2
	;;
esac

# shellcheck source=e2e/rxe-preflight.sh
. "$ROOT/e2e/rxe-preflight.sh"

[[ $(id -u) -eq 0 ]] || skip "not root; needs root (network namespaces, veth, rdma link add)"
for tool in ip nft qemu-system-x86_64 socat curl cc cargo python3; do
	command -v "$tool" >/dev/null || skip "$tool not found; needs it installed (make deps)"
done
rxe_preflight

cd "$ROOT"
cargo build --release -p rdma-gateway-testbed
bash tests/softroce/guest/init.sh --setup-only --role loop
trap 'bash tests/softroce/guest/init.sh --teardown --role loop' EXIT
bash gateway/testbed/tests/scripts/softroce-migration.sh target/release/rdma-gateway-testbed \
	tests/tools/qemu_migrate.py 198.18.0.1 198.18.0.2
GATEWAY_BENCH_RDMA=198.18.0.1,198.18.0.2 cargo bench -p rdma-gateway-testbed --bench chain
