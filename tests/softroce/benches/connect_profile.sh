#!/bin/bash
# Where a connect loop's time goes: `rdma_tool connlat` (N sequential connects, each with a
# 1-byte echo and 10 more round trips, then one connection with 1,000 round trips) over TCP,
# both ends shimmed (with spare connections) and both ends shimmed without spares
# (STREAMSHIM_SPARE=0), one after the other in one Soft-RoCE guest. Prints connlat's line and
# the guest's CPU during each run (/proc/stat: busy, idle, softirq, as shares of both vCPUs);
# with PERF=1 also samples the shimmed run (`perf record -a -g`, cpu-clock) and prints the
# share of each thread kind and the engine thread's and the app's top symbols, the verbs and
# connection-manager calls among them (perf's own sampling slows the sampled run).
# Run it with
#   cargo build --release -p rdma-streams-shim
#   cargo run -p rdma-streams-softroce --example guest -- -- bash "$PWD/tests/softroce/benches/connect_profile.sh"
# SHIM: the shim to use (default: target/release/libstreamshim.so of this checkout); N
# connects per run (default 300).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/listening.sh"
A=${SOFTROCE_ADDR_A:-198.18.0.1}
SHIM=${SHIM:-$HERE/../../../target/release/libstreamshim.so}
N=${N:-300}
W=$(mktemp -d)
cc -O2 -o "$W/rdma_tool" "$HERE/rdma_tool.c" -lpthread || exit 1
T=$W/rdma_tool

# The busy, idle and softirq shares of /proc/stat's first line between two readings.
cpu_share() { # BEFORE AFTER
	awk -v a="$1" -v b="$2" 'BEGIN {
		split(a, x); split(b, y); t = 0
		for (i = 2; i <= 9; i++) t += y[i] - x[i]
		idle = (y[5] - x[5]) + (y[6] - x[6]); soft = y[8] - x[8]
		printf "guest CPU: busy %.0f %%, idle %.0f %% (softirq %.0f %%) of %.1f vCPU-seconds\n",
			100 * (t - idle) / t, 100 * idle / t, 100 * soft / t, t / 100 }'
}

run() { # NAME PORT PREFIX...
	local name=$1 port=$2
	shift 2
	"$@" "$T" server "$A" "$port" >"$W/$name-srv.out" 2>&1 &
	local server=$!
	wait_port "$port"
	sleep 0.3
	local before after
	before=$(head -1 /proc/stat)
	if [ -n "${PERF:-}" ] && [ "$name" = shim ]; then
		perf record -q -e cpu-clock -F 2000 -a -g -o "$W/perf.data" -- \
			"$@" "$T" connlat "$A" "$port" "$N" 5 >"$W/$name-cli.out" 2>&1
	else
		"$@" "$T" connlat "$A" "$port" "$N" 5 >"$W/$name-cli.out" 2>&1
	fi
	after=$(head -1 /proc/stat)
	kill -TERM "$server"
	wait "$server"
	echo "== $name"
	tail -1 "$W/$name-cli.out"
	cpu_share "$before" "$after"
}

run tcp 7001 env
run shim 7002 env LD_PRELOAD="$SHIM" STREAMSHIM_NEGOTIATE_MS=5000
run shimcold 7003 env LD_PRELOAD="$SHIM" STREAMSHIM_NEGOTIATE_MS=5000 STREAMSHIM_SPARE=0
if [ -n "${PERF:-}" ]; then
	report() { perf report -i "$W/perf.data" --stdio -g none "$@" 2>/dev/null | grep -v '^#' | grep -v '^$'; }
	echo "== the sampled shim run: threads"
	report --no-children --sort comm | head -8
	for comm in streamshim-io rdma_tool; do
		echo "== $comm: top symbols"
		report --no-children --comms "$comm" --sort dso,sym | head -25
		echo "== $comm: verbs and connection-manager calls (with what they call)"
		report --children --comms "$comm" --sort sym |
			grep -E 'ib_uverbs|ucma_|rdma_(connect|accept|disconnect|resolve)|rxe_(create|destroy|reg|dereg)' | head -25
	done
fi
rm -rf "$W"
