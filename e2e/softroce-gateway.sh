#!/usr/bin/env bash
# e2e/softroce-gateway.sh: the migration gateway over real rsockets on Soft-RoCE (rdma_rxe).
#
# Runs the gateway benchmark (gateway/benches/chain.rs: QEMU live migrations through a
# virt-handler-like relay chain, the gateway path against the same chain without the gateway,
# bare relays and socat) with the real librdmacm instead of the fake provider and one rxe link
# on each end of the node veth. Every gateway round must be carried as an RDMA stream (the
# bench checks the gateway's own counters), and gateway / chain >= 0.8 is judged.
#
# Usage: e2e/softroce-gateway.sh [-h|--help]
#
# Environment: SOFTROCE_REQUIRE=1 turns a host without rdma_rxe into exit 77 instead of a skip.
# Exit status: 0 passed or skipped (one `SKIP: <why>` line); 77 skip under SOFTROCE_REQUIRE=1;
# 1 the benchmark failed or missed a goal.

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
for tool in ip nft qemu-system-x86_64 socat cc cargo python3; do
	command -v "$tool" >/dev/null || skip "$tool not found; needs it installed (make deps)"
done
rxe_preflight

cd "$ROOT"
GATEWAY_BENCH_PROVIDER=librdmacm.so.1 GATEWAY_BENCH_RXE=1 \
	cargo bench -p rdma-migration-gateway --bench chain
