#!/bin/bash
# Two (or more) builds of the shim side by side: `rdma_tool connlat` (N sequential connects,
# each with a 1-byte echo and 10 more round trips, then one connection with 1,000 round trips)
# with both ends under each build in turn, REPS rounds, in one Soft-RoCE guest; `tcp` runs
# without a shim. Prints one line per run: the build's name and connlat's medians in ms
# (socket+connect+close, until the first echo, a round trip on a new connection, on a long
# one). Run it with, for example,
#   git worktree add /tmp/base HEAD~1 && (cd /tmp/base && cargo build --release -p rdma-streams-shim)
#   cargo build --release -p rdma-streams-shim
#   cargo run -p rdma-streams-softroce --example guest -- -- env \
#     SHIMS="tcp=tcp base=/tmp/base/target/release/libstreamshim.so new=$PWD/target/release/libstreamshim.so" \
#     bash "$PWD/tests/softroce/benches/shim_ab.sh"
# SHIMS: NAME=PATH pairs (PATH `tcp`: no shim), PATH optionally followed by `,VAR=VALUE`
# settings for both ends (`reuse-only=$PWD/target/release/libstreamshim.so,STREAMSHIM_SPARE=0`);
# REPS (default 3); N connects per run (100).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/listening.sh"
A=${SOFTROCE_ADDR_A:-198.18.0.1}
N=${N:-100}
W=$(mktemp -d)
cc -O2 -o "$W/rdma_tool" "$HERE/rdma_tool.c" -lpthread || exit 1
T=$W/rdma_tool
ms() { # KEY LINE
	tr ' ' '\n' <<<"$2" | awk -F= -v k="$1" '$1 == k { printf "%.3f", $2 / 1e6 }'
}
port=7100
for ((rep = 0; rep < ${REPS:-3}; rep++)); do
	for kv in $SHIMS; do
		name=${kv%%=*} rest=${kv#*=}
		so=${rest%%,*} settings=()
		[ "$so" != "$rest" ] && IFS=, read -r -a settings <<<"${rest#*,}"
		port=$((port + 1))
		pre=(env)
		[ "$so" != tcp ] && pre=(env LD_PRELOAD="$so" STREAMSHIM_NEGOTIATE_MS=5000 "${settings[@]}")
		"${pre[@]}" "$T" server "$A" "$port" >"$W/srv.out" 2>&1 &
		srv=$!
		wait_port "$port"
		sleep 0.3
		"${pre[@]}" "$T" connlat "$A" "$port" "$N" 5 >"$W/cli.out" 2>&1 || { cat "$W/cli.out"; exit 1; }
		line=$(tail -1 "$W/cli.out")
		echo "$name connect $(ms median_ns "$line") echo $(ms echo_median_ns "$line")" \
			"rtt $(ms rtt_median_ns "$line") long_rtt $(ms long_rtt_median_ns "$line")"
		kill -TERM "$srv"
		wait "$srv"
	done
done
rm -rf "$W"
