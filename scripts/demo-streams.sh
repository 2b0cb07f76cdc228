#!/usr/bin/env bash
# make demo, part 2: unmodified iperf3 and QEMU between two "hosts" (network namespaces joined by
# a veth pair, 198.18.0.1 and 198.18.0.2) under libstreamshim.so. With an RDMA device the real
# librdmacm carries the streams; without one (these development machines) the fake rsocket
# provider does, over kernel TCP: a simulation of the path, labelled as such.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
SECONDS_PER_RUN=${DEMO_IPERF_SECONDS:-3}

if [[ $(id -u) -ne 0 ]] || ! unshare -n true 2>/dev/null; then
  step "5. Streams between two network namespaces: skipped (needs root for network namespaces)"
  exit 0
fi

cargo build -q -p rdma-streams-shim -p fake-rsocket
SHIM=$PWD/target/debug/libstreamshim.so
FAKE=$PWD/target/debug/libfakersocket.so
W=$(mktemp -d)
R=$(head -c4 /dev/urandom | od -An -tx1 | tr -d ' \n')
NSA=demo${R}a
NSB=demo${R}b
A=198.18.0.1
B=198.18.0.2
cleanup() {
  jobs -p | xargs -r kill 2>/dev/null || true
  wait 2>/dev/null || true
  ip netns del "$NSA" 2>/dev/null || true
  ip netns del "$NSB" 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
ip netns add "$NSA"
ip netns add "$NSB"
ip link add "${NSA}v" type veth peer name "${NSB}v"
ip link set "${NSA}v" netns "$NSA"
ip link set "${NSB}v" netns "$NSB"
ip -n "$NSA" addr add "$A/24" dev "${NSA}v"
ip -n "$NSB" addr add "$B/24" dev "${NSB}v"
for ns in "$NSA" "$NSB"; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "${ns}v" up
done

if [[ -n $(ls -A /sys/class/infiniband 2>/dev/null) ]]; then
  PROVIDER=librdmacm.so.1
  LABEL="real RDMA: librdmacm on $(find /sys/class/infiniband -mindepth 1 -maxdepth 1 -printf '%f ')"
  NO_RDMA_PROVIDER=/nonexistent/librdmacm.so.1
else
  PROVIDER=$FAKE
  NO_RDMA_PROVIDER=librdmacm.so.1
  LABEL="SIMULATION: no RDMA device here, the fake rsocket provider carries the streams over kernel TCP"
fi

# iperf3 between the hosts; $1 label, $2 env words for both ends (empty: no shim), $3 run number.
# shellcheck disable=SC2086 # $envs is a list of words on purpose
iperf() {
  local label=$1 envs=$2 n=$3
  rm -rf "$W/fk" && mkdir -p "$W/fk"
  ip netns exec "$NSB" env $envs STREAMSHIM_STATS="$W/srv$n-%p.json" iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
  local srv=$!
  for _ in $(seq 1 100); do ip netns exec "$NSB" ss -ltnH | grep -q ':5201 ' && break; sleep 0.05; done
  ip netns exec "$NSA" env $envs STREAMSHIM_STATS="$W/cli$n-%p.json" \
    iperf3 -c "$B" -p 5201 -t "$SECONDS_PER_RUN" -J >"$W/iperf$n.json"
  wait $srv || true
  python3 - "$label" "$W/iperf$n.json" "$W" "$n" <<'EOF'
import glob, json, os, sys
label, path, w, n = sys.argv[1:]
r = json.load(open(path))
bps = r["end"]["sum_received"]["bits_per_second"]
stats = [json.load(open(f)) for f in glob.glob(os.path.join(w, "cli%s-*.json" % n))]
if not stats:
    how = "no shim"
else:
    c = stats[0]["client"]
    how = ", ".join("%s %s %d" % (p, k, v) for p in ("rdma", "tcp") for k, v in sorted(c[p].items()))
fk = glob.glob(os.path.join(w, "fk", "*.json"))
carried = max((json.load(open(f))["bytes_sent"] for f in fk), default=0)
extra = "; the rsocket provider carried %.0f MB" % (carried / 1e6) if carried else ""
print("  %-44s %6.2f Gbit/s   connections: %s%s" % (label, bps / 1e9, how, extra))
EOF
}

step "5. iperf3 between two network namespaces ($A -> $B) under libstreamshim.so"
echo "  $LABEL"
echo "  (debug builds, ${SECONDS_PER_RUN}s each; 'make bench' measures release builds side by side)"
iperf "plain TCP, no shim" "" 1
iperf "both ends shimmed, rsocket provider" \
  "LD_PRELOAD=$SHIM STREAMSHIM_PROVIDER=$PROVIDER FAKE_RSOCKET_STATS_DIR=$W/fk" 2
iperf "both ends shimmed, no RDMA (fallback)" \
  "LD_PRELOAD=$SHIM STREAMSHIM_PROVIDER=$NO_RDMA_PROVIDER" 3
ip netns exec "$NSB" iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
srv=$!
for _ in $(seq 1 100); do ip netns exec "$NSB" ss -ltnH | grep -q ':5201 ' && break; sleep 0.05; done
ip netns exec "$NSA" env LD_PRELOAD="$SHIM" STREAMSHIM_PROVIDER="$PROVIDER" \
  STREAMSHIM_STATS="$W/cli5-%p.json" iperf3 -c "$B" -p 5201 -t 1 -J >"$W/iperf5.json"
wait $srv || true
python3 - "$W" <<'EOF'
import glob, json, os, sys
c = json.load(open(glob.glob(os.path.join(sys.argv[1], "cli5-*.json"))[0]))["client"]
print("  %-44s stayed TCP: %s (the plain server never saw a stray byte)" % (
    "client shimmed, server plain", ", ".join("%s %d" % kv for kv in sorted(c["tcp"].items()))))
EOF

if command -v qemu-system-x86_64 >/dev/null; then
  step "6. A QEMU live migration between the namespaces, both QEMUs under the shim"
  echo "  $LABEL"
  echo "  256 MiB of random guest RAM, checked byte for byte on arrival:"
  mkdir -p "$W/fk"
  python3 tests/tools/qemu_migrate.py --workdir "$W/qemu" \
    --src-wrap "ip netns exec $NSA" --dst-wrap "ip netns exec $NSB" \
    --listen "tcp:$B:4444" --target "tcp:$B:4444" \
    --env "LD_PRELOAD=$SHIM" --env "STREAMSHIM_PROVIDER=$PROVIDER" \
    --env "FAKE_RSOCKET_STATS_DIR=$W/fk" --env "STREAMSHIM_STATS=$W/qemu-%p.json" >"$W/qemu.json"
  python3 - "$W" <<'EOF'
import glob, json, os, sys
w = sys.argv[1]
r = json.load(open(os.path.join(w, "qemu.json")))
up = sum(json.load(open(f))["total"]["rdma"] for f in glob.glob(os.path.join(w, "qemu-*.json")))
print("  %s in %.2f s, %.0f MB sent, RAM identical: %s, upgraded connections: %d" % (
    r["status"], r["seconds"], r["bytes"] / 1e6, r["ram_match"], up))
EOF
fi
