#!/bin/bash
# System calls per short connection: a client that opens a connection, has 1 byte echoed,
# sends the byte that makes the server close, reads to EOF and closes, again and again
# (python3), against `rdma_tool server`, both under `strace -f -c`, over TCP and with both ends
# under each build of the shim, in one Soft-RoCE guest. Each side's count per connection is
# the difference between a run of N2 and a run of N1 connections, divided by N2 - N1, so what
# a process does once (python's start, the shim's decision and engine) is not in it. Prints,
# per build, the count per connection on each side and the calls that make it up. Under TCG
# a system call costs tens of microseconds (a clock read, which the guest's emulated clock
# source cannot answer in user space, more), so the counts are a cost that carries over
# where times do not. Run it with
#   cargo build --release -p rdma-streams-shim
#   cargo run -p rdma-streams-softroce --example guest -- -- env \
#     SHIMS="new=$PWD/target/release/libstreamshim.so" bash "$PWD/tests/softroce/benches/syscalls.sh"
# SHIMS: NAME=PATH pairs (a `tcp` run without a shim comes first); N1, N2 (default 10, 60).
set -u
export LC_ALL=C
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/listening.sh"
A=${SOFTROCE_ADDR_A:-198.18.0.1}
N1=${N1:-10}
N2=${N2:-60}
W=$(mktemp -d)
cc -O2 -o "$W/rdma_tool" "$HERE/rdma_tool.c" -lpthread || exit 1
cat >"$W/client.py" <<'PY'
import socket, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for _ in range(n):
    s = socket.create_connection((host, port))
    s.sendall(b"k")
    assert s.recv(1) == b"k"
    s.sendall(b"x")
    s.recv(1)
    while s.recv(64):
        pass
    s.close()
PY

# The calls of an `strace -c` summary as "name count" lines.
calls() {
	awk 'NR > 2 && $1 !~ /^-/ && $NF != "total" { print $NF, ($5 ~ /^[0-9]+$/) ? $4 : $4 }' "$1"
}

# One run: NAME PORT N ENV...; leaves $W/NAME-N-{client,server}.st.
run() {
	local name=$1 port=$2 n=$3
	shift 3
	strace -f -c -o "$W/$name-$n-server.st" env "$@" "$W/rdma_tool" server "$A" "$port" >/dev/null 2>&1 &
	local tracer=$!
	wait_port "$port"
	strace -f -c -o "$W/$name-$n-client.st" env "$@" python3 "$W/client.py" "$A" "$port" "$n" ||
		echo "$name: the client failed" >&2
	pkill -TERM -x rdma_tool
	wait "$tracer"
}

# Per-connection counts of side SIDE of NAME: "total" then "call count" lines, most first.
per_connection() {
	local name=$1 side=$2
	join -a1 -a2 -e 0 -o 0,1.2,2.2 \
		<(calls "$W/$name-$N1-$side.st" | sort) <(calls "$W/$name-$N2-$side.st" | sort) |
		awk -v d=$((N2 - N1)) '{ c = ($3 - $2) / d; if (c >= 0.5) { t += c; printf "%s %.1f\n", $1, c } }
			END { printf "total %.1f\n", t }' | sort -k2,2nr
}

port=7300
for spec in tcp=tcp ${SHIMS:-}; do
	name=${spec%%=*}
	so=${spec#*=}
	port=$((port + 1))
	if [ "$so" = tcp ]; then
		set -- STREAMSHIM_UNUSED=1
	else
		set -- LD_PRELOAD="$so" STREAMSHIM_NEGOTIATE_MS=5000
	fi
	run "$name" "$port" "$N1" "$@"
	port=$((port + 1))
	run "$name" "$port" "$N2" "$@"
	for side in client server; do
		per_connection "$name" "$side" >"$W/out"
		printf '%s %s: %s system calls per connection:' "$name" "$side" "$(awk '$1 == "total" { print $2 }' "$W/out")"
		awk '$1 != "total" { printf " %s %s", $1, $2 }' "$W/out"
		echo
	done
done
rm -rf "$W"
