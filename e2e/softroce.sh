#!/usr/bin/env bash
# e2e/softroce.sh: libstreamshim.so over real rsockets on Soft-RoCE (rdma_rxe).
#
# Two network namespaces joined by a veth pair (198.18.0.1/24 <-> 198.18.0.2/24), one rxe link
# on each veth end, then iperf3 from the first namespace to the second three ways:
#   1. plain TCP,
#   2. libstreamshim.so on both ends with the real librdmacm (STREAMSHIM_PROVIDER unset): the
#      shim's STREAMSHIM_STATS must show both connections (control + data) rdma UPGRADED on
#      both ends,
#   3. Debian's librspreload.so on both ends (reference only: a failure or hang is reported,
#      not fatal).
# Throughput of each and the ratios to plain TCP are printed, and the shim's against a plain
# AF_UNIX socketpair copy (proxy-mode goal: >= 0.7; fails the run when missed). Then, if
# tests/tools/qemu_migrate.py
# exists, one QEMU live migration across the namespaces, plain and under the shim (see QEMU below).
# Namespaces, veths, rxe links and processes are removed on every exit (trap).
#
# Usage: e2e/softroce.sh [--shim PATH] [--rspreload PATH] [--seconds N] [-h|--help]
#
#   --shim PATH       the shim (env STREAMSHIM_LIB); default target/release/libstreamshim.so,
#                     built with `cargo build --release -p rdma-streams-shim` when missing
#   --rspreload PATH  librspreload (env SOFTROCE_RSPRELOAD); default Debian's
#                     /usr/lib/x86_64-linux-gnu/rsocket/librspreload.so; skipped when absent
#   --seconds N       iperf3 -t (env SOFTROCE_SECONDS, default 5)
#
# Other environment:
#   SOFTROCE_REQUIRE=1   a host without rdma_rxe is an error (exit 77) instead of a skip (exit 0)
#   SOFTROCE_NO_RXE=1    testing only: no rxe links; runs the namespaces, the veth pair and all
#                        three legs anyway, expecting the shim to count NO_DEVICE instead of
#                        UPGRADED (what this script can check on a kernel without RDMA)
#   SOFTROCE_QEMU_MIGRATE  the QEMU driver (default tests/tools/qemu_migrate.py)
#   SOFTROCE_KEEP=1      keep the work directory (iperf3 JSON, stats files, logs)
#
# Exit status: 0 all legs passed, or the host cannot run Soft-RoCE (one `SKIP: <why>; needs
# <what>` line); 77 for that skip under SOFTROCE_REQUIRE=1; 1 a leg failed; 2 usage or setup error.
#
# QEMU: the driver is another engineer's; its CLI is taken from its --help. This script uses it
# only when the help offers all of --src-netns, --dst-netns and --dst-addr (and passes the shim
# with --env KEY=VALUE when offered, else exports it to the driver's environment); otherwise it
# prints why and skips the step. The time printed is the driver's wall time.

set -euo pipefail

readonly ADDR_A=198.18.0.1
readonly ADDR_B=198.18.0.2
readonly PORT=5201
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly ROOT

die() {
	echo "softroce: $*" >&2
	exit 2
}

usage() {
	sed -n '2,/^$/{s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
}

shim=${STREAMSHIM_LIB:-}
rspreload=${SOFTROCE_RSPRELOAD:-/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so}
seconds=${SOFTROCE_SECONDS:-5}
qemu_driver=${SOFTROCE_QEMU_MIGRATE:-$ROOT/tests/tools/qemu_migrate.py}
no_rxe=${SOFTROCE_NO_RXE:-0}

while (($#)); do
	case $1 in
	--shim)
		[[ $# -ge 2 ]] || die "--shim needs a path"
		shim=$2
		shift 2
		;;
	--rspreload)
		[[ $# -ge 2 ]] || die "--rspreload needs a path"
		rspreload=$2
		shift 2
		;;
	--seconds)
		[[ $# -ge 2 ]] || die "--seconds needs a number"
		seconds=$2
		shift 2
		;;
	-h | --help)
		usage
		exit 0
		;;
	*) die "unknown argument: $1 (see --help)" ;;
	esac
done
[[ $seconds =~ ^[1-9][0-9]*$ ]] || die "--seconds must be a positive integer, not '$seconds'"

# shellcheck source=e2e/rxe-preflight.sh
. "$ROOT/e2e/rxe-preflight.sh"

# ------------------------------------------------------------------------------------------
# Can this host run Soft-RoCE? (No changes made before these checks pass.)

[[ $(id -u) -eq 0 ]] || skip "not root; needs root (network namespaces, veth, rdma link add)"
for tool in ip iperf3 timeout python3 ss; do
	command -v "$tool" >/dev/null || skip "$tool not found; needs it installed (make deps)"
done

rxe_state=""
if [[ $no_rxe == 1 ]]; then
	echo "softroce: SOFTROCE_NO_RXE=1: no rxe links (testing the script only; expecting NO_DEVICE)"
else
	rxe_preflight
fi

# ------------------------------------------------------------------------------------------
# The shim

if [[ -z $shim ]]; then
	shim=$ROOT/target/release/libstreamshim.so
	if [[ ! -f $shim ]]; then
		echo "softroce: $shim missing: cargo build --release -p rdma-streams-shim"
		(cd "$ROOT" && cargo build --release -p rdma-streams-shim) || die "building the shim failed"
	fi
fi
[[ -f $shim ]] || die "shim $shim not found"
shim=$(realpath "$shim")
if [[ ! -f $rspreload ]]; then
	echo "softroce: $rspreload not found: the librspreload leg is skipped"
	rspreload=""
fi

# ------------------------------------------------------------------------------------------
# Namespaces, veth, rxe (each recorded as soon as it exists, so the trap removes exactly that)

tag=$$
ns_a=srs-a-$tag
ns_b=srs-b-$tag
veth_a=srsa$tag
veth_b=srsb$tag
rxe_a=srs_rxe_a_$tag
rxe_b=srs_rxe_b_$tag
created_ns=()
created_rxe=()
srv_pid=""
cli_pid=""
work=$(mktemp -d /tmp/softroce.XXXXXX)

cleanup() {
	local rc=$?
	set +e
	for pid in $cli_pid $srv_pid; do
		kill "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	done
	for entry in "${created_rxe[@]}"; do
		ip netns exec "${entry%%:*}" rdma link delete "${entry#*:}" 2>/dev/null
	done
	for ns in "${created_ns[@]}"; do
		ip netns delete "$ns" 2>/dev/null
	done
	# A veth whose namespace move failed is still here.
	ip link delete "$veth_a" 2>/dev/null
	if [[ ${SOFTROCE_KEEP:-0} == 1 ]]; then
		echo "softroce: work directory kept: $work"
	else
		rm -rf "$work"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "$ns_a"
created_ns+=("$ns_a")
ip netns add "$ns_b"
created_ns+=("$ns_b")
ip link add "$veth_a" type veth peer name "$veth_b"
ip link set "$veth_a" netns "$ns_a"
ip link set "$veth_b" netns "$ns_b"
ip -n "$ns_a" addr add "$ADDR_A/24" dev "$veth_a"
ip -n "$ns_b" addr add "$ADDR_B/24" dev "$veth_b"
for ns in "$ns_a" "$ns_b"; do
	ip -n "$ns" link set lo up
done
ip -n "$ns_a" link set "$veth_a" up
ip -n "$ns_b" link set "$veth_b" up
echo "softroce: namespaces $ns_a ($ADDR_A on $veth_a) <-> $ns_b ($ADDR_B on $veth_b)"

if [[ $no_rxe != 1 ]]; then
	ip netns exec "$ns_a" rdma link add "$rxe_a" type rxe netdev "$veth_a"
	created_rxe+=("$ns_a:$rxe_a")
	ip netns exec "$ns_b" rdma link add "$rxe_b" type rxe netdev "$veth_b"
	created_rxe+=("$ns_b:$rxe_b")
	rxe_state=$(ip netns exec "$ns_a" rdma link show 2>&1 | grep -E "$rxe_a|$rxe_b" || true)
	echo "softroce: rxe links:"
	while IFS= read -r line; do
		echo "  $line"
	done <<<"$rxe_state"
fi

# Wait until something listens on $PORT in namespace $1.
wait_port() {
	local _
	for _ in $(seq 1 200); do
		if ip netns exec "$1" ss -ltnH | grep -q ":$PORT "; then
			return 0
		fi
		sleep 0.05
	done
	echo "softroce: nothing listens on $PORT in $1" >&2
	return 1
}

# bits/s received from an iperf3 -J file, or nothing.
iperf_bps() {
	python3 -c '
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print(int(d["end"]["sum_received"]["bits_per_second"]))
except Exception:
    pass
' "$1"
}

# One iperf3 run from A to B (leg name $1), both ends run with the words of $2 in front, where
# @ROLE@ becomes srv or cli. Sets leg_bps on success; returns 1 with leg_why set otherwise.
leg() {
	local name=$1 wrap=$2 limit=$((seconds + 20)) crc=0 src=0 e
	local -a pre_srv=() pre_cli=()
	read -r -a pre_srv <<<"${wrap//@ROLE@/srv}"
	read -r -a pre_cli <<<"${wrap//@ROLE@/cli}"
	leg_bps="" leg_why=""
	echo "+ ip netns exec $ns_b timeout $limit ${pre_srv[*]:+${pre_srv[*]} }iperf3 -s -1 -p $PORT -B $ADDR_B"
	echo "+ ip netns exec $ns_a timeout $limit ${pre_cli[*]:+${pre_cli[*]} }iperf3 -c $ADDR_B -p $PORT -t $seconds -J"
	ip netns exec "$ns_b" timeout -k 2 "$limit" "${pre_srv[@]}" iperf3 -s -1 -p "$PORT" -B "$ADDR_B" \
		>"$work/$name-srv.out" 2>&1 &
	srv_pid=$!
	if ! wait_port "$ns_b"; then
		leg_why="server did not start: $(head -n1 "$work/$name-srv.out")"
		return 1
	fi
	# In the background and waited for, so a signal is handled at once (bash defers traps
	# while a foreground child runs).
	ip netns exec "$ns_a" timeout -k 2 "$limit" "${pre_cli[@]}" iperf3 -c "$ADDR_B" -p "$PORT" \
		-t "$seconds" -J >"$work/$name-cli.json" 2>"$work/$name-cli.err" &
	cli_pid=$!
	wait "$cli_pid" || crc=$?
	cli_pid=""
	wait "$srv_pid" || src=$?
	srv_pid=""
	if ((crc == 124 || crc == 137)); then
		leg_why="hung: client killed by timeout after ${limit}s"
		return 1
	fi
	if ((crc != 0)); then
		e=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("error",""))' \
			"$work/$name-cli.json" 2>/dev/null || true)
		leg_why="client exit $crc: ${e:-$(head -n1 "$work/$name-cli.err")}"
		return 1
	fi
	if ((src != 0)); then
		leg_why="server exit $src: $(tail -n1 "$work/$name-srv.out")"
		return 1
	fi
	leg_bps=$(iperf_bps "$work/$name-cli.json")
	if [[ -z $leg_bps ]]; then
		leg_why="no throughput in iperf3's JSON"
		return 1
	fi
}

# "ok" when the stats file(s) $1* show exactly {$3: 2} under role $2 path $4, else what they show.
check_stats() {
	python3 - "$1" "$2" "$3" "$4" <<'EOF'
import glob, json, sys
prefix, role, reason, path = sys.argv[1:]
files = sorted(glob.glob(prefix + "*.json"))
got = [json.load(open(f))[role] for f in files]
other = "tcp" if path == "rdma" else "rdma"
ok = len(got) == 1 and got[0][path] == {reason: 2} and got[0]["total"][other] == 0
print("ok" if ok else "%d file(s): %s" % (len(files), json.dumps([{path: g[path], other: g[other]} for g in got])))
EOF
}

gbit() { awk -v b="$1" 'BEGIN { printf "%.2f Gbit/s", b / 1e9 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }

failed=0
declare -A result=()
leg_bps="" leg_why=""

echo
echo "== iperf3 $ADDR_A -> $ADDR_B, $seconds s, one stream"
if leg tcp ""; then
	result[tcp]=$leg_bps
	echo "plain TCP:      $(gbit "$leg_bps")"
else
	echo "plain TCP:      FAILED: $leg_why"
	failed=1
fi

expect_reason=UPGRADED expect_path=rdma
if [[ $no_rxe == 1 ]]; then
	expect_reason=NO_DEVICE expect_path=tcp
fi
if leg shim "env LD_PRELOAD=$shim STREAMSHIM_STATS=$work/shim-@ROLE@-%p.json"; then
	result[shim]=$leg_bps
	echo "shim:           $(gbit "$leg_bps")"
else
	echo "shim:           FAILED: $leg_why"
	failed=1
fi
for role in client server; do
	file_role=cli
	[[ $role == server ]] && file_role=srv
	verdict=$(check_stats "$work/shim-$file_role-" "$role" "$expect_reason" "$expect_path" 2>&1 || true)
	if [[ $verdict == ok ]]; then
		echo "shim $role STREAMSHIM_STATS: $expect_path $expect_reason 2 (control + data): ok"
	else
		echo "shim $role STREAMSHIM_STATS: expected $expect_path {$expect_reason: 2}, got $verdict"
		failed=1
	fi
done

if [[ -n $rspreload ]]; then
	if leg rspreload "env LD_PRELOAD=$rspreload"; then
		result[rspreload]=$leg_bps
		echo "librspreload:   $(gbit "$leg_bps") (reference)"
	else
		echo "librspreload:   fails (reference, not counted): $leg_why"
	fi
fi

if [[ -n ${result[tcp]:-} && -n ${result[shim]:-} ]]; then
	echo "ratio shim / TCP:          $(ratio "${result[shim]}" "${result[tcp]}")"
fi

# The proxy-mode goal (issue 3): upgraded throughput >= 0.7 of a plain AF_UNIX socketpair copy
# on the same machine (the benchmark's C tool, 128 KiB blocks, as iperf3's).
tool_src=$ROOT/shim/benches/streams_tool.c
if [[ -n ${result[shim]:-} && -f $tool_src ]] && command -v cc >/dev/null; then
	cc -O2 -o "$work/streams_tool" "$tool_src"
	sp=$("$work/streams_tool" sockpair "$seconds" 131072 | sed -n 's/.*bits_per_second=\([0-9.]*\).*/\1/p')
	if [[ -n $sp ]]; then
		echo "AF_UNIX socketpair copy:   $(gbit "$sp")"
		r=$(ratio "${result[shim]}" "$sp")
		if [[ $no_rxe == 1 ]]; then
			echo "ratio shim / socketpair:   $r (not upgraded without rxe: the goal is not checked)"
		elif awk -v r="$r" 'BEGIN { exit !(r >= 0.7) }'; then
			echo "ratio shim / socketpair:   $r (goal >= 0.7: ok)"
		else
			echo "ratio shim / socketpair:   $r (goal >= 0.7: MISSED)"
			failed=1
		fi
	fi
fi
if [[ -n ${result[tcp]:-} && -n ${result[rspreload]:-} ]]; then
	echo "ratio librspreload / TCP:  $(ratio "${result[rspreload]}" "${result[tcp]}")"
fi

# One run of the QEMU driver across the namespaces ($1: tcp or shim). Sets migrate_ms (its wall
# time) or returns 1 after printing why.
migrate() {
	local name=$1 t0 t1 rc=0
	local -a args=(--src-wrap "ip netns exec $ns_a" --dst-wrap "ip netns exec $ns_b"
		--listen "tcp:$ADDR_B:4444" --target "tcp:$ADDR_B:4444" --timeout 240)
	if [[ $name == shim ]]; then
		args+=(--env "LD_PRELOAD=$shim" --env "STREAMSHIM_STATS=$work/qemu-%p.json")
	fi
	echo "+ python3 $qemu_driver ${args[*]}"
	t0=$(date +%s%N)
	timeout -k 5 300 python3 "$qemu_driver" "${args[@]}" >"$work/qemu-$name.out" 2>&1 &
	cli_pid=$!
	wait "$cli_pid" || rc=$?
	cli_pid=""
	t1=$(date +%s%N)
	if ((rc != 0)); then
		echo "QEMU $name: FAILED (exit $rc): $(tail -n 3 "$work/qemu-$name.out" | tr '\n' ' ')"
		return 1
	fi
	migrate_ms=$(((t1 - t0) / 1000000))
}

# ------------------------------------------------------------------------------------------
# QEMU live migration across the namespaces (optional)

echo
if [[ ! -f $qemu_driver ]]; then
	echo "QEMU: $qemu_driver not found: migration step skipped"
else
		if migrate tcp; then
			tcp_ms=$migrate_ms
			if migrate shim; then
				echo "QEMU migration, driver wall time: TCP $tcp_ms ms, shim $migrate_ms ms (ratio $(ratio "$migrate_ms" "$tcp_ms"))"
				python3 - "$work" <<'EOF'
import glob, json, sys
rdma = tcp = 0
reasons = {}
for f in glob.glob(sys.argv[1] + "/qemu-*.json"):
    d = json.load(open(f))
    rdma += d["total"]["rdma"]
    tcp += d["total"]["tcp"]
    for role in ("client", "server"):
        for r, n in d[role]["tcp"].items():
            reasons[r] = reasons.get(r, 0) + n
print("QEMU under the shim: %d connection(s) upgraded, %d stayed TCP %s" % (rdma, tcp, reasons or ""))
EOF
			else
				failed=1
			fi
		else
			failed=1
		fi
fi

echo
if ((failed)); then
	echo "softroce: FAILED (work files in $work with SOFTROCE_KEEP=1)"
	exit 1
fi
echo "softroce: ok"
