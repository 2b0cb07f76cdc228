#!/bin/bash
# A 1-byte request and its reply on a long-lived connection, shim against rsocket, with the
# processes free to use every vCPU and pinned one per vCPU (`taskset -c 0` for the server,
# `-c 1` for the client, so each process's threads share one CPU), alternated in one
# Soft-RoCE guest. Each run is `rdma_tool connlat` with one new connection (its 10 round trips
# after the first echo) and then one connection with 1,000 round trips (after 50 untimed);
# prints both medians per run.
# Run it with
#   cargo build --release -p rdma-streams-shim
#   cargo run -p rdma-streams-softroce --example guest -- -- bash "$PWD/tests/softroce/benches/round_trip_pin.sh"
# SHIM: the shim to use (default: target/release/libstreamshim.so of this checkout); REPS
# (default 3); KINDS: the runs of each rep, in turn (default "shim shim/pinned rsocket
# rsocket/pinned"; `shim/VAR=VALUE[,VAR=VALUE]` is an unpinned shimmed run with those
# variables too, for example KINDS="shim shim/STREAMSHIM_DIRECT_READ=0").
set -u
A=198.18.0.1
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
SHIM=${SHIM:-$ROOT/target/release/libstreamshim.so}
RSPRELOAD=${RSPRELOAD:-$(ls /usr/lib/*/rsocket/librspreload.so | head -1)}
REPS=${REPS:-3}
KINDS=${KINDS:-"shim shim/pinned rsocket rsocket/pinned"}
export STREAMSHIM_NEGOTIATE_MS=5000
ST=$(mktemp -d)
cc -O2 -o "$ST/rdma_tool" "$ROOT/tests/softroce/benches/rdma_tool.c" || exit 1
wait_cm() { for _ in $(seq 1 100); do rdma resource show cm_id 2>/dev/null | grep -q "state LISTEN.*:$1 " && return 0; sleep 0.1; done; return 1; }
kv() { tr ' ' '\n' | sed -n "s/^$1=//p"; }

port=9300
for ((rep = 0; rep < REPS; rep++)); do
	for kind in $KINDS; do
		port=$((port + 1))
		lib=${kind%%/*} extra=${kind#*/}
		[ "$extra" = "$kind" ] && extra=""
		pin_s="" pin_c="" vars=()
		if [ "$extra" = pinned ]; then
			pin_s="taskset -c 0" pin_c="taskset -c 1"
		elif [ -n "$extra" ]; then
			IFS=, read -r -a vars <<<"$extra"
		fi
		case $lib in
		shim) pre=(env LD_PRELOAD="$SHIM" "${vars[@]}") ;;
		rsocket) pre=(env LD_PRELOAD="$RSPRELOAD") ;;
		esac
		$pin_s "${pre[@]}" "$ST/rdma_tool" server "$A" "$port" &
		srv=$!
		wait_cm "$port" || { echo "$kind: no listener"; kill "$srv"; continue; }
		out=$($pin_c timeout 120 "${pre[@]}" "$ST/rdma_tool" connlat "$A" "$port" 1 0)
		kill "$srv" 2>/dev/null
		wait "$srv" 2>/dev/null
		printf '%-40s new %6.0f us  long %6.0f us\n' "$kind" \
			"$(($(kv rtt_median_ns <<<"$out") / 1000))" "$(($(kv long_rtt_median_ns <<<"$out") / 1000))"
	done
done
rm -rf "$ST"
