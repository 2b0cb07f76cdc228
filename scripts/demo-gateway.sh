#!/usr/bin/env bash
# make demo, part 3: a KubeVirt-shaped live migration through the migration gateway, over real
# RDMA streams. Two gateways on two RDMA addresses, each virt-handler a network namespace whose
# relay behaves like KubeVirt's migration proxy (unix socket <-> TCP to the other node):
#
#   source QEMU -> unix -> relay A -> TCP, captured by nftables -> gateway A
#     -> RDMA stream -> gateway B -> relay B -> dest QEMU
#
# then the same with no gateway on the target node (the connection is relayed over TCP). These
# machines' kernel has no RDMA, so it runs in a QEMU guest with Soft-RoCE (tests/softroce):
# gateway/testbed/tests/scripts/softroce-migration.sh, scenarios rdma and peer-down. Where this host has
# RDMA itself, DEMO_DIRECT=1 with SOFTROCE_ADDR_A and SOFTROCE_ADDR_B set to two local RDMA
# addresses runs it here. The gateways run as rdma-gateway-testbed (gateway/testbed: the gateway
# plus a unix socket the migration events come from; in a cluster: the VMI watch).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "6. A KubeVirt-shaped live migration through the migration gateway, over Soft-RoCE in a QEMU guest"
if [[ $(id -u) -ne 0 ]] || ! command -v nft >/dev/null || ! command -v qemu-system-x86_64 >/dev/null; then
  echo "  skipped (needs root, nftables and qemu-system-x86)"
  exit 0
fi
cargo build -q -p rdma-gateway-testbed
cargo build -q -p rdma-streams-softroce --example guest
scenario=(bash "$PWD/gateway/testbed/tests/scripts/softroce-migration.sh" --scenario rdma,peer-down --ram-mib 32
  "$PWD/target/debug/rdma-gateway-testbed" "$PWD/tests/tools/qemu_migrate.py")
echo "  QEMU -> relay A -> captured (nftables in virt-handler's namespace) -> gateway A -> RDMA stream -> gateway B -> relay B -> QEMU"
if [[ ${DEMO_DIRECT:-0} == 1 ]]; then
  "${scenario[@]}" "${SOFTROCE_ADDR_A:?}" "${SOFTROCE_ADDR_B:?}"
  exit
fi
echo "  booting the guest (TCG here: the two migrations take a few minutes)..."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! target/debug/examples/guest --timeout 1200 -- "${scenario[@]}" 198.18.0.1 198.18.0.2 >"$log" 2>&1; then
  tail -n 60 "$log"
  echo "  the guest run failed (log above)"
  exit 1
fi
# The guest example prints the console, then the command's stdout: show the latter.
sed -n '/^== stdout of /,/^== stderr of /p' "$log" | sed '1d;$d'
