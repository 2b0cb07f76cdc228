#!/usr/bin/env bash
# make demo, part 3: a KubeVirt-shaped live migration through the migration gateway.
# Two "nodes" (network namespaces joined by a veth), each with a "virt-handler" namespace whose
# relay behaves like KubeVirt's migration proxy (unix socket <-> TCP to the other node):
#
#   source QEMU -> unix -> relay A -> TCP, captured by nftables -> gateway A
#     -> RDMA stream (fake provider where there is no RDMA) -> gateway B -> relay B -> dest QEMU
#
# The migration events come from the gateway's test hook (in a cluster: the VMI watch).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

if [[ $(id -u) -ne 0 ]] || ! command -v nft >/dev/null || ! command -v qemu-system-x86_64 >/dev/null; then
  step "7. Migration gateway: skipped (needs root, nftables and qemu-system-x86)"
  exit 0
fi
cargo build -q -p rdma-migration-gateway -p fake-rsocket
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export GW=$PWD/target/debug/rdma-migration-gateway FAKE=$PWD/target/debug/libfakersocket.so
export S=$PWD/gateway/tests/scripts QEMU_TOOL=$PWD/tests/tools/qemu_migrate.py
export RAM=$work/ram-256M.bin PY=python3

# One migration in a private network/PID/mount namespace; $1: "up" (both gateways) or
# "peer-down" (no gateway on node B: the connection falls back to TCP).
run() {
  local start_b="gw nodeB; started nodeB target u1 49152"
  [[ $1 == peer-down ]] && start_b=":"
  timeout 180 unshare -n -p -f --mount-proc --kill-child bash -c "
set -eu; set -m; T=\$(mktemp -d)
trap 'kill \$(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf \"\$T\"' EXIT
ip link set lo up; . \$S/topology.sh; . \$S/gateways.sh
gw nodeA --peer 10.2.0.2=198.18.0.2:7471
$start_b
started nodeA source u1 49152; wait_table vhA; relays 49152
migrate | tail -1 >\$T/result.json
python3 - \"\$T/result.json\" \"\$(metrics nodeA)\" \"\$(stats nodeA)\" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
metrics = {}
for line in sys.argv[2].splitlines():
    if line and not line.startswith('#'):
        k, _, v = line.rpartition(' ')
        metrics[k] = float(v)
paths = {p: int(metrics.get('rdma_gw_connections_total{role=\"source\",path=\"%s\"}' % p, 0)) for p in ('rdma', 'tcp')}
reasons = {k.split('\"')[1]: int(v) for k, v in metrics.items() if k.startswith('rdma_gw_fallbacks_total') and v}
sent = max([json.loads(l).get('bytes_sent', 0) for l in sys.argv[3].splitlines() if l.startswith('{')] or [0])
print('  migration %s in %.2f s, %.0f MB, RAM identical: %s' % (r['status'], r['seconds'], r['bytes'] / 1e6, r['ram_match']))
print('  gateway A: connections over the RDMA stream %d, over TCP %d%s; its rsockets sent %.0f MB' % (
    paths['rdma'], paths['tcp'], (' (fallback: %s)' % ', '.join('%s %d' % kv for kv in reasons.items())) if reasons else '', sent / 1e6))
EOF
"
}

step "7. A KubeVirt-shaped live migration through the migration gateway"
if [[ -n $(ls -A /sys/class/infiniband 2>/dev/null) ]]; then
  echo "  (the demo uses the fake rsocket provider even here: a test topology of namespaces)"
else
  echo "  SIMULATION: no RDMA device here, the fake rsocket provider carries the stream over kernel TCP"
fi
echo "  QEMU -> relay A -> captured (nftables in virt-handler's namespace) -> gateway A -> stream -> gateway B -> relay B -> QEMU"
run up
echo "  The same with no gateway on the target node: the connection is relayed over TCP, the migration completes:"
run peer-down
