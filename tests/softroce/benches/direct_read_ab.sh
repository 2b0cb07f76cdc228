#!/bin/bash
# iperf3 -P 4 between two shimmed processes with direct reads on and off
# (STREAMSHIM_DIRECT_READ=1 / 0), alternated, three times, in one Soft-RoCE guest; prints the
# received rate and the share of the server's received bytes read straight from the rings.
# Recorded in docs/benchmarks.md ("Direct reads"). Run it with
#   cargo build --release -p rdma-streams-shim
#   cargo run -p rdma-streams-softroce --example guest -- -- bash "$PWD/tests/softroce/benches/direct_read_ab.sh"
# SHIM: the shim to use (default: target/release/libstreamshim.so of this checkout).
set -u
A=198.18.0.1
SHIM=${SHIM:-$(cd "$(dirname "$0")/../../.." && pwd)/target/release/libstreamshim.so}
export STREAMSHIM_NEGOTIATE_MS=5000
mkdir -p /tmp/st
n=0
for rep in 1 2 3; do
 for d in 1 0; do
  n=$((n+1)); port=$((5300+n))
  rm -f /tmp/st/*
  env LD_PRELOAD=$SHIM STREAMSHIM_DIRECT_READ=$d STREAMSHIM_STATS=/tmp/st/srv-%p.json iperf3 -s -1 -B $A -p $port > /dev/null 2>&1 &
  SP=$!
  for _ in $(seq 1 100); do ss -ltnH | grep -q ":$port " && break; sleep 0.1; done
  env LD_PRELOAD=$SHIM STREAMSHIM_DIRECT_READ=$d iperf3 -c $A -p $port -t 5 -P 4 -J > /tmp/cli.json 2>/dev/null
  wait $SP
  bps=$(python3 -c "import json;print(json.load(open('/tmp/cli.json'))['end']['sum_received']['bits_per_second']/1e9)")
  dr=$(python3 -c "import json,glob;v=[json.load(open(f)) for f in glob.glob('/tmp/st/srv-*.json')];print(sum(x['rdma_bytes']['direct'] for x in v)/max(1,sum(x['rdma_bytes']['received'] for x in v)))")
  echo "rep $rep direct_read=$d: $bps Gbit/s received; server direct share $dr"
 done
done
