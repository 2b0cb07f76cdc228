#!/bin/bash
# Direct reads on and off (STREAMSHIM_DIRECT_READ=1 / 0), alternated, three times each, in one
# Soft-RoCE guest, both ends shimmed:
# - rstream -T s -T b (blocking sockets: recv with MSG_WAITALL), 1 MiB transfers x 100 each
#   way: rstream's usec/xfer and the share of each end's received bytes read from the rings;
# - 4 such rstream pairs at once, 32 transfers each way each: their bytes over the wall-clock
#   time from the first client's start to the last one's end, and the shares;
# - iperf3 -P 4 for 5 s (select() and plain reads): the received rate and the server's share.
# Recorded in docs/benchmarks.md ("Direct reads"). Run it with
#   cargo build --release -p rdma-streams-shim
#   cargo run -p rdma-streams-softroce --example guest -- -- bash "$PWD/tests/softroce/benches/direct_read_ab.sh"
# SHIM: the shim to use (default: target/release/libstreamshim.so of this checkout);
# AB_ONLY=rstream, rstream4 or iperf3: one part only.
set -u
A=198.18.0.1
SHIM=${SHIM:-$(cd "$(dirname "$0")/../../.." && pwd)/target/release/libstreamshim.so}
export STREAMSHIM_NEGOTIATE_MS=5000
ST=$(mktemp -d)
. "$(dirname "$0")/listening.sh"
share() { # share FILES...: direct / received over the stats files
  python3 -c "import json,sys;v=[json.load(open(f)) for f in sys.argv[1:]];print('%.4f' % (sum(x['rdma_bytes']['direct'] for x in v)/max(1,sum(x['rdma_bytes']['received'] for x in v))))" "$@"
}
n=0
if [ "${AB_ONLY:-rstream}" = rstream ]; then
 for rep in 1 2 3; do
  for d in 1 0; do
   n=$((n+1)); port=$((5400+n)); rm -f "$ST"/*
   env LD_PRELOAD="$SHIM" STREAMSHIM_DIRECT_READ=$d STREAMSHIM_STATS="$ST/srv-%p.json" rstream -T s -T b -p $port -S 1048576 -C 100 > /dev/null 2>&1 &
   SP=$!
   wait_port $port
   out=$(timeout 600 env LD_PRELOAD="$SHIM" STREAMSHIM_DIRECT_READ=$d STREAMSHIM_STATS="$ST/cli-%p.json" rstream -T s -T b -s $A -p $port -S 1048576 -C 100 | tail -1)
   wait $SP
   echo "rstream rep $rep direct_read=$d: usec/xfer $(echo "$out" | awk '{print $NF}'); direct share client $(share "$ST"/cli-*.json) server $(share "$ST"/srv-*.json)"
  done
 done
fi
if [ "${AB_ONLY:-rstream4}" = rstream4 ]; then
 for rep in 1 2 3; do
  for d in 1 0; do
   rm -f "$ST"/*; sps=()
   for p in 1 2 3 4; do
    n=$((n+1)); port=$((5500+n))
    env LD_PRELOAD="$SHIM" STREAMSHIM_DIRECT_READ=$d STREAMSHIM_STATS="$ST/srv-%p.json" rstream -T s -T b -p $port -S 1048576 -C 32 > /dev/null 2>&1 &
    sps+=($!)
    wait_port $port
    ports[p]=$port
   done
   t0=$(date +%s.%N)
   cps=()
   for p in 1 2 3 4; do
    timeout 600 env LD_PRELOAD="$SHIM" STREAMSHIM_DIRECT_READ=$d STREAMSHIM_STATS="$ST/cli-%p.json" rstream -T s -T b -s $A -p "${ports[p]}" -S 1048576 -C 32 > /dev/null 2>&1 &
    cps+=($!)
   done
   wait "${cps[@]}"
   t1=$(date +%s.%N)
   wait "${sps[@]}"
   echo "rstream 4 pairs rep $rep direct_read=$d: $(python3 -c "import sys;print('%.3f' % (4*2*32*8*1048576/1e9/(float(sys.argv[2])-float(sys.argv[1]))))" "$t0" "$t1") Gbit/s (both ways, all 4 pairs, wall clock); direct share client $(share "$ST"/cli-*.json) server $(share "$ST"/srv-*.json)"
  done
 done
fi
if [ "${AB_ONLY:-iperf3}" = iperf3 ]; then
 for rep in 1 2 3; do
  for d in 1 0; do
   n=$((n+1)); port=$((5300+n)); rm -f "$ST"/*
   env LD_PRELOAD="$SHIM" STREAMSHIM_DIRECT_READ=$d STREAMSHIM_STATS="$ST/srv-%p.json" iperf3 -s -1 -B $A -p $port > /dev/null 2>&1 &
   SP=$!
   wait_port $port
   env LD_PRELOAD="$SHIM" STREAMSHIM_DIRECT_READ=$d iperf3 -c $A -p $port -t 5 -P 4 -J > "$ST/cli.json" 2>/dev/null
   wait $SP
   bps=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['end']['sum_received']['bits_per_second']/1e9)" "$ST/cli.json")
   echo "iperf3 rep $rep direct_read=$d: $bps Gbit/s received; server direct share $(share "$ST"/srv-*.json)"
  done
 done
fi
rm -rf "$ST"
