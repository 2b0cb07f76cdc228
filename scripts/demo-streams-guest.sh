#!/usr/bin/env bash
# make demo, part 2, inside a Soft-RoCE guest (booted by scripts/demo-streams.sh): unmodified
# iperf3 and QEMU under libstreamshim.so on a real RDMA stack. The guest's topology
# (tests/softroce/guest/init.sh): two rxe devices, rxea on 198.18.0.1 and rxeb on 198.18.0.2,
# the two ends of a veth; traffic between the addresses crosses the veth.
set -euo pipefail
cd "$(dirname "$0")/.."
SHIM=${STREAMSHIM_LIB:?}
A=${SOFTROCE_ADDR_A:-198.18.0.1}
W=$(mktemp -d)
SECS=${DEMO_IPERF_SECONDS:-3}
PY=$(python3 -c 'import sys; print(sys.executable)')
export STREAMSHIM_NEGOTIATE_MS=5000

wait_port() { for _ in $(seq 1 200); do ss -ltnH | grep -q ":$1 " && return 0; sleep 0.05; done; return 1; }

echo "  RDMA devices: $(rdma link show | awk '{print $2, $4, "on", $8}' | paste -sd ';')"
# iperf3 from 198.18.0.2 to 198.18.0.1; $1 label, $2 server env words, $3 client env words.
iperf() {
  local label=$1 srv_env=$2 cli_env=$3 n=$RANDOM
  # shellcheck disable=SC2086 # env words on purpose
  env $srv_env STREAMSHIM_STATS="$W/srv$n-%p.json" iperf3 -s -1 -B "$A" -p 5201 >/dev/null 2>&1 &
  local srv=$!
  wait_port 5201
  # shellcheck disable=SC2086
  env $cli_env STREAMSHIM_STATS="$W/cli$n-%p.json" iperf3 -c "$A" -p 5201 -t "$SECS" -J >"$W/iperf$n.json"
  wait $srv || true
  "$PY" - "$label" "$W/iperf$n.json" "$W" "$n" <<'PYEOF'
import glob, json, os, sys
label, path, w, n = sys.argv[1:]
bps = json.load(open(path))["end"]["sum_received"]["bits_per_second"]
def roles(prefix, role):
    files = glob.glob(os.path.join(w, "%s%s-*.json" % (prefix, n)))
    if not files:
        return "no shim"
    c = json.load(open(files[0]))[role]
    return ", ".join("%s %s %d" % (p, k, v) for p in ("rdma", "tcp") for k, v in sorted(c[p].items()))
print("  %-40s %6.3f Gbit/s   client: %s; server: %s" % (label, bps / 1e9, roles("cli", "client"), roles("srv", "server")))
PYEOF
}

echo "  iperf3, ${SECS} s each (TCG: only ratios mean anything; 'make bench' measures them):"
iperf "plain TCP, no shim" "" ""
iperf "both ends shimmed: an RDMA stream" "LD_PRELOAD=$SHIM" "LD_PRELOAD=$SHIM"
iperf "client shimmed, server plain" "" "LD_PRELOAD=$SHIM"
echo "  Soft-RoCE is RDMA done in software by the guest's kernel (under TCG here), so the stream"
echo "  is slower than kernel TCP on it; what the run shows is the path: both ends upgrade, a"
echo "  one-sided shim stays plain TCP (PEER_NOT_SHIMMED, then the negative cache), no byte lost."

echo
echo "  A QEMU live migration (128 MiB of random guest RAM, checked byte for byte), both QEMUs"
echo "  under the shim:"
"$PY" tests/tools/qemu_migrate.py --workdir "$W/qemu" --ram-mib 128 --port 4444 \
  --listen "tcp:$A:4444" --timeout 400 --env "LD_PRELOAD=$SHIM" \
  --env "STREAMSHIM_STATS=$W/qemu-%p.json" >"$W/qemu.json"
"$PY" - "$W" <<'PYEOF'
import glob, json, os, sys
w = sys.argv[1]
r = json.load(open(os.path.join(w, "qemu.json")))
stats = [json.load(open(f)) for f in glob.glob(os.path.join(w, "qemu-*.json"))]
up = sum(s["total"]["rdma"] for s in stats)
carried = max((s["rdma_bytes"]["sent"] for s in stats), default=0)
print("  %s in %.1f s; RAM identical: %s; upgraded connections (both ends): %d; %.0f MB over the stream" % (
    r["status"], r["seconds"], r["ram_match"], up, carried / 1e6))
PYEOF
