#!/bin/bash
# One shimmed connection's timeline: `rdma_tool connlat` (N connects, each with a 1-byte echo)
# against `rdma_tool server`, both under the shim, with the kernel's tracer recording every
# system call and scheduler switch and wake-up of both processes' threads (tracefs: low
# overhead, the loop's medians stay where they are untraced), in one Soft-RoCE guest. The
# trace goes to the guest's output directory; `timeline.py` prints a connection's events from
# the client's `socket()` to its echo, all four threads side by side. Run it with
#   cargo build --release -p rdma-streams-shim
#   cargo run -p rdma-streams-softroce --example guest -- --keep -- \
#     bash "$PWD/tests/softroce/benches/timeline.sh"
#   python3 tests/softroce/benches/timeline.py <the kept directory>/guest/trace.txt 20
# SHIM: the shim (default: target/release/libstreamshim.so of this checkout); N (default 30).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/listening.sh"
A=${SOFTROCE_ADDR_A:-198.18.0.1}
SHIM=${SHIM:-$HERE/../../../target/release/libstreamshim.so}
N=${N:-30}
OUT=${SOFTROCE_OUT:?run in a Soft-RoCE guest}
W=$(mktemp -d)
cc -O2 -o "$W/rdma_tool" "$HERE/rdma_tool.c" -lpthread || exit 1
T=/sys/kernel/tracing
[ -d $T/events ] || mount -t tracefs nodev $T || exit 1
env LD_PRELOAD="$SHIM" STREAMSHIM_NEGOTIATE_MS=5000 "$W/rdma_tool" server "$A" 7040 >/dev/null 2>&1 &
server=$!
wait_port 7040 || exit 1
sleep 0.5
echo 0 >$T/tracing_on
echo >$T/trace
echo 16384 >$T/buffer_size_kb
echo 1 >$T/options/event-fork
# The server's threads (its engine's among them), then the client and what it starts.
for t in /proc/$server/task/*; do echo "${t##*/}" >>$T/set_event_pid; done
printf '%s\n' raw_syscalls:sys_enter raw_syscalls:sys_exit sched:sched_switch sched:sched_wakeup >$T/set_event
bash -c "echo \$\$ >>$T/set_event_pid; echo 1 >$T/tracing_on; exec env LD_PRELOAD=$SHIM \
	STREAMSHIM_NEGOTIATE_MS=5000 $W/rdma_tool connlat $A 7040 $N 5" >"$W/client.out" 2>&1
echo 0 >$T/tracing_on
tail -1 "$W/client.out"
cp $T/trace "$OUT/trace.txt"
echo >$T/set_event
echo >$T/set_event_pid
kill -TERM "$server"
wait "$server"
rm -rf "$W"
echo "trace: $OUT/trace.txt"
