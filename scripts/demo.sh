#!/usr/bin/env bash
# make demo: the newcomer's tour of rdma-streams, no cluster needed.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "Building rdma-device-plugin and rdma-stream-injector (the first build takes a few minutes)"
cargo build -q -p rdma-device-plugin --bin rdma-device-plugin --example kubelet_demo
cargo build -q -p rdma-stream-injector --bin rdma-stream-injector
BIN=target/debug/rdma-device-plugin
INJECTOR=target/debug/rdma-stream-injector

step "1. What this machine would advertise (rdma-device-plugin discover, real /sys)"
out=$(RDMA_DP_LOG_LEVEL=warn "$BIN" discover --sysfs-root /sys --dev-root /dev)
if grep -q "no RDMA device found" <<<"$out"; then
  echo "  This machine has no RDMA device (no InfiniBand/RoCE HCA, or no driver loaded)."
  echo "  The plugin would register and advertise zero devices, and pick HCAs up when they appear."
else
  echo "$out"
fi

step "2. What a two-HCA node would advertise (examples/sysfs/two-hca-node)"
RDMA_DP_LOG_LEVEL=warn "$BIN" discover \
  --sysfs-root examples/sysfs/two-hca-node/sys --dev-root examples/sysfs/two-hca-node/dev -o json |
python3 -c '
import json, sys
r = json.load(sys.stdin)
print("  %-7s %-32s %-11s %-5s %-9s %s" % ("HCA", "bus", "link", "NUMA", "health", "char devices"))
for h in r["hcas"]:
    bus = h["bus"].get("address") or "%s on %s" % (h["bus"].get("name"), h["bus"].get("parentPci"))
    links = ",".join(sorted({p["linkLayer"] for p in h["ports"]}))
    devs = " ".join(c["name"] for c in h["charDevices"])
    print("  %-7s %-32s %-11s %-5s %-9s %s" % (h["name"], bus, links, h.get("numaNode", "-"), h["health"]["status"], devs))
for p in r["pools"]:
    print("  pool %s: %d healthy devices (%d per HCA), ids %s" % (
        p["resourceName"], p["healthyDevices"], p["slotsPerHca"], " .. ".join(p.get("sampleIds", []))))
'

step "3. The plugin and a (fake) kubelet on that node, over the real gRPC protos"
target/debug/examples/kubelet_demo

step "4. Opting a Deployment in: rdma-stream-injector inject -f (the webhook's own logic, offline)"
echo "  examples/manifests/iperf3-server.yaml carries one label, rdma-streams.io/inject: \"true\"."
echo "  What the webhook would add to its pods (built-in default profile):"
RDMA_INJECTOR_LOG_LEVEL=warn "$INJECTOR" inject --diff -f examples/manifests/iperf3-server.yaml | sed 's/^/    /'
echo "  And a KubeVirt VM opted in to RDMA migrations (only its template label; KubeVirt makes the pod):"
RDMA_INJECTOR_LOG_LEVEL=warn "$INJECTOR" inject --diff -f examples/manifests/migratable-vm.yaml | sed 's/^/    /'

bash scripts/demo-streams.sh
bash scripts/demo-gateway.sh

step "Done"
echo "  Next: 'make test' runs every test; docs/quickstart.md, docs/architecture.md, docs/shim.md"
echo "  and docs/kubevirt.md explain the parts, docs/benchmarks.md has the measured figures."
