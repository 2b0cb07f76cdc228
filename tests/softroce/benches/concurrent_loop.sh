#!/bin/bash
# The 64-connection scenario's programs (tests/scenarios/scripts/concurrent.py: 64 connections, 2 MiB each way, sha256)
# again and again, to count failed runs. Run it in the Soft-RoCE guest:
#   cargo build -p rdma-streams-shim
#   cargo run -p rdma-streams-softroce --example guest -- --timeout 2900 -- env N=10 \
#     VARIANTS="main|$PWD/target/debug/deps/libstreamshim.so|" bash "$PWD/tests/softroce/benches/concurrent_loop.sh"
# VARIANTS: one per line, "name|path of the shim|VAR=VALUE VAR2=VALUE" (variables for both ends);
# N runs of each, the variants alternated. Prints one line per run and the failed-run counts.
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/listening.sh"
A=$SOFTROCE_ADDR_A
W=/tmp/rw; mkdir -p $W
port=9600
declare -A fails
for i in $(seq 1 ${N:-5}); do
while IFS='|' read -r name so extra; do
  [ -z "$name" ] && continue
  port=$((port+1))
  rdma statistic show link rxea/1 > $W/s0
  env LD_PRELOAD=$so STREAMSHIM_NEGOTIATE_MS=5000 STREAMSHIM_LOG=info $extra python3 $HERE/../tests/scenarios/scripts/concurrent.py server $A $port 64 waitall >$W/srv.out 2>&1 &
  sp=$!
  wait_port "$port" 400
  t0=$(date +%s.%N)
  timeout 300 env LD_PRELOAD=$so STREAMSHIM_NEGOTIATE_MS=10000 STREAMSHIM_LOG=info $extra python3 $HERE/../tests/scenarios/scripts/concurrent.py client $A $port 64 >$W/cli.out 2>&1
  rc=$?
  wait $sp; src=$?
  t1=$(date +%s.%N)
  echo "== $name run $i: client rc $rc server rc $src $(echo "$t1-$t0"|bc) s: $(grep errors $W/cli.out | cut -c1-60)"
  if [ $rc != 0 ] || [ $src != 0 ]; then
    fails[$name]=$(( ${fails[$name]:-0} + 1 ))
    grep -h "ended" $W/cli.out $W/srv.out | head -6
  fi
done <<< "$VARIANTS"
done
for k in "${!fails[@]}"; do echo "FAILS $k ${fails[$k]}"; done
echo "N=${N:-5} done"
