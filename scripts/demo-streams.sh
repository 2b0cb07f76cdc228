#!/usr/bin/env bash
# make demo, part 2: unmodified iperf3 and QEMU under libstreamshim.so on a real RDMA stack.
# These machines' kernel has no RDMA, so the demo boots Debian's kernel in a QEMU guest with
# Soft-RoCE (rdma_rxe) and the real librdmacm/libibverbs (tests/softroce), and runs
# scripts/demo-streams-guest.sh there. Where this host has rdma_rxe or an HCA itself, the same
# script runs on the host (DEMO_DIRECT=1 with SOFTROCE_ADDR_A set to a local RDMA address).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "5. iperf3 and a QEMU live migration under libstreamshim.so, over Soft-RoCE in a QEMU guest"
cargo build -q -p rdma-streams-shim
cargo build -q -p rdma-streams-softroce --example guest
SHIM=$PWD/target/debug/libstreamshim.so
if [[ ${DEMO_DIRECT:-0} == 1 ]]; then
  STREAMSHIM_LIB=$SHIM bash scripts/demo-streams-guest.sh
  exit
fi
echo "  booting the guest (TCG here: about a minute)..."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! target/debug/examples/guest --timeout 900 -- env STREAMSHIM_LIB="$SHIM" \
  bash "$PWD/scripts/demo-streams-guest.sh" >"$log" 2>&1; then
  tail -n 40 "$log"
  echo "  the guest run failed (full log above)"
  exit 1
fi
# The guest example prints the console, then the command's stdout: show the latter.
sed -n '/^== stdout of /,/^== stderr of /p' "$log" | sed '1d;$d'
