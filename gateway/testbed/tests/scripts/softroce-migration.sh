#!/usr/bin/env bash
# softroce-migration.sh: KubeVirt-shaped QEMU live migrations through two migration gateways with
# real RDMA streams between them: the cases the host tests (gateway/testbed/tests/migration.rs) cannot
# run, because the development machines have no RDMA device.
#
# `make test` runs it in the Soft-RoCE loop guest: the gateway_loop_* scenarios of
# tests/softroce (tests/softroce/tests/scenarios/gateway.rs) run it with one --scenario each
# (the three fallbacks together) and --ram-mib 32, judge its PASS/FAIL lines and report its
# `figure:` lines. The two-guest migration (gateway_wire_*) is written out in that file.
#
# Usage: softroce-migration.sh [--scenario NAME[,NAME..]] [--ram-mib N] GATEWAY QEMU_MIGRATE ADDR_A ADDR_B
#
#   GATEWAY       the rdma-gateway-testbed binary (the gateway with the test events socket)
#   QEMU_MIGRATE  tests/tools/qemu_migrate.py
#   ADDR_A/B      two addresses of this host on RDMA devices, in the initial network namespace:
#                 gateway A (the source node's) listens on ADDR_A:7471, gateway B (the target
#                 node's) on ADDR_B:7472; with the Soft-RoCE loop guest, 198.18.0.1 (rxea on
#                 veth va) and 198.18.0.2 (rxeb on vb), whose policy routing sends the traffic
#                 between them across the veth
#   --ram-mib N   guest RAM of the QEMU migrations (default 64: QEMU runs under TCG inside a TCG
#                 guest)
#
# Topology (scripts/topology-rdma.sh): both gateways in this (initial) network namespace, since
# rxe works in no other on Debian's 6.1 kernel; virt-handler A is network namespace vhA
# (10.1.0.2), virt-handler B is vhB (10.2.0.2), each behind a veth. The migration path is the one
# of the host tests, with the RDMA stream in the middle:
#
#   source QEMU -unix-> relay A (vhA, like virt-handler's proxy) -TCP 10.2.0.2:P, nft redirect->
#   gateway A (capture listener in vhA) =RDMA stream ADDR_A -> ADDR_B= gateway B -TCP-> relay B
#   (vhB) -unix-> destination QEMU
#
# Scenarios (default: all, in this order; each with fresh gateways):
#   rdma         one migration over the stream, RAM byte-exact; both gateways count it as RDMA
#                (connections, bytes >= the RAM), no fallback; the rxe devices' packet counters
#                moved (and, in the loop guest, the veth carried the RAM: rxe's UDP, not lo)
#   parallel     8 parallel connections on two published ports (the multifd shape), each
#                sha256-checked, all carried as streams and dialed by gateway B
#   abort        the migration aborted while bytes flow: it fails, its streams are reset, both
#                gateways are back to their fd and thread counts, no table left
#   peer-killed  gateway B killed (SIGKILL) mid-migration: the reset reaches both QEMUs (the
#                migration fails within a bound), gateway A keeps serving with nothing open
#   peer-down    no gateway B: the stream is refused (PEER_REFUSED) and the same connection is
#                relayed over TCP; the migration completes (the RAM check of the TCP relay is
#                the host tests')
#   no-peer      gateway A knows no peer (NO_PEER, judged only where RDMA is usable): TCP
#   timeout      --stream-timeout-ms 1 (TIMEOUT): TCP, and gateway B never dials a request whose
#                source gave up (the destination QEMU takes only one connection)
#   no-key       gateway A has no peer keys file: NO_PEER_KEY, over TCP
#   wrong-key    the two gateways hold different keys: PEER_AUTH_FAILED (B refused A's proof,
#                dialed nothing), over TCP, the migration byte-exact
#   rotation     the keys files are rewritten while the gateways run, through a whole rotation
#                (new key second on both, first on A, first on B, old one gone from A, a bad
#                file on B that keeps its keys); every connection takes a stream; then A alone
#                moves to a key B lacks: PEER_AUTH_FAILED, over TCP
#   forged       an RDMA peer without the key (ATTACKER: tests/softroce/tools/attacker.c, built)
#                asks gateway B for a stream to the announced migration, whose uid and port it
#                knows: a version-1 request is refused (unsupported version), a HELLO gets a
#                challenge, a forged proof and its replay are refused, and the destination sees
#                no connection
#
# Both gateways get a peer keys file with one key they share ($T/keys-nodeA, $T/keys-nodeB)
# unless a scenario says otherwise.
#
# By hand on a development machine (no RDMA: in a Soft-RoCE loop guest of tests/softroce):
#   cargo build -p rdma-gateway-testbed
#   cargo run -p rdma-streams-softroce --example guest -- --timeout 2400 -- \
#     bash $PWD/gateway/testbed/tests/scripts/softroce-migration.sh $PWD/target/debug/rdma-gateway-testbed \
#     $PWD/tests/tools/qemu_migrate.py 198.18.0.1 198.18.0.2
#
# Needs root, ip, nft, socat, curl, python3, qemu-system-x86_64. Prints `PASS NAME (N s)` or
# `FAIL NAME` per scenario (each check as it goes, with the seconds since the scenario started;
# `figure: SCENARIO KEY VALUE` lines with what was measured; the gateways' logs after a
# failure) and a summary line. Exit status: 0 every scenario passed; 1 one failed; 2 usage; 77
# no RDMA device.

set -euo pipefail

usage() { sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0"; }

scenarios=rdma,parallel,abort,peer-killed,peer-down,no-peer,timeout,no-key,wrong-key,rotation,forged
RAM_MIB=64
args=()
while [ $# -gt 0 ]; do
	case $1 in
	-h | --help) usage; exit 0 ;;
	--scenario) scenarios=$2; shift 2 ;;
	--ram-mib) RAM_MIB=$2; shift 2 ;;
	--) shift; args+=("$@"); break ;;
	-*) echo "softroce-migration: unknown option '$1' (see --help)" >&2; exit 2 ;;
	*) args+=("$1"); shift ;;
	esac
done
if [ ${#args[@]} -ne 4 ]; then
	echo "softroce-migration: need GATEWAY QEMU_MIGRATE ADDR_A ADDR_B (see --help)" >&2
	exit 2
fi
GW=$(readlink -f "${args[0]}")
QEMU_TOOL=$(readlink -f "${args[1]}")
ADDR_A=${args[2]}
ADDR_B=${args[3]}
S=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${PY:-python3}
export GW QEMU_TOOL ADDR_A ADDR_B S PY RAM_MIB

[ "$(id -u)" -eq 0 ] || { echo "softroce-migration: needs root" >&2; exit 2; }
for f in "$GW" "$QEMU_TOOL"; do [ -e "$f" ] || { echo "softroce-migration: $f not found" >&2; exit 2; }; done
for tool in ip nft socat curl "$PY" qemu-system-x86_64 unshare; do
	command -v "$tool" >/dev/null || { echo "softroce-migration: $tool not found" >&2; exit 2; }
done
if ! ls /sys/class/infiniband/* >/dev/null 2>&1; then
	echo "softroce-migration: no RDMA device here (/sys/class/infiniband is empty)"
	exit 77
fi

# Everything below runs in a private mount and PID namespace (same network namespace): the
# netns names and every process started die with it.
if [ -z "${GW_SR_INNER:-}" ]; then
	exec unshare -m -p -f --mount-proc --kill-child env GW_SR_INNER=1 bash "$0" --scenario "$scenarios" --ram-mib "$RAM_MIB" "$GW" "$QEMU_TOOL" "$ADDR_A" "$ADDR_B"
fi

T=$(mktemp -d)
cleanup() {
	kill $(jobs -p) 2>/dev/null || true
	wait 2>/dev/null || true
	topology_rdma_down 2>/dev/null || true
	rm -rf "$T"
}
trap cleanup EXIT
ip link set lo up
# shellcheck source=gateway/testbed/tests/scripts/topology-rdma.sh
. "$S/topology-rdma.sh"
GW_NODES=initial
RAM=$T/ram-$RAM_MIB.bin
MIGRATE_TIMEOUT=900
# Installing a capture (setns threads, nft) took 8 s in a TCG guest.
EVENT_TIMEOUT=120
# shellcheck source=gateway/testbed/tests/scripts/gateways.sh
. "$S/gateways.sh"

PORT=49152
RAM_BYTES=$((RAM_MIB << 20))
# The throttled migrations (abort, peer-killed) would take 32 s whatever the RAM: time to see
# bytes flow and act while they do, also in a loaded TCG guest (at a fixed 4 MiB/s, a 32 MiB
# migration there completed before the abort came).
THROTTLE=$((RAM_BYTES / 32))
echo "softroce-migration: RDMA devices $(ls /sys/class/infiniband | tr '\n' ' ')gateways $(node_listen nodeA) -> $(node_listen nodeB), $RAM_MIB MiB migrations, $(qemu-system-x86_64 --version | head -1)"

## Helpers (each scenario runs in a subshell: its gateways and relays go with it); the
## gateways, events, metrics, relays and migrate come from gateways.sh.

# Gateway A with a bound generous for a TCG guest.
gw_a() { gw nodeA --stream-timeout-ms 10000 "$@"; }
gw_b() { gw nodeB "$@"; }
pid_of() { cat "$T/gw-$1.pid"; }
fallbacks() { metrics "$1" | awk '$1 ~ /^rdma_gw_fallbacks_total/ {s += $2} END {print s + 0}'; }
conns() { metric "$1" "rdma_gw_connections_total{role=\"$2\",path=\"$3\"}"; }
bytes() { metric "$1" "rdma_gw_bytes_total{path=\"$2\",direction=\"$3\"}"; }
active() { metric "$1" rdma_gw_connections_active; }
# wait_for SECONDS COMMAND..: polls every 0.1 s.
wait_for() {
	local n=$(($1 * 10)); shift
	for _ in $(seq "$n"); do "$@" && return 0; sleep 0.1; done
	return 1
}
idle() { [ "$(active "$1")" = 0 ]; }
field() { "$PY" -c 'import json, sys; print(json.loads(sys.argv[1]).get(sys.argv[2]))' "$1" "$2" 2>/dev/null || echo none; }
rxe_sent() {
	local n=0 f
	for f in /sys/class/infiniband/*/ports/1/hw_counters/sent_pkts; do [ -r "$f" ] && n=$((n + $(cat "$f"))); done
	echo "$n"
}
tx_bytes() { cat "/sys/class/net/$1/statistics/tx_bytes" 2>/dev/null || echo 0; }
fds() { ls "/proc/$1/fd" | wc -l; }
threads() { ls "/proc/$1/task" | wc -l; }

failed=0
# check WHAT COMMAND..: one check of the scenario (with the seconds since it started).
check() {
	local what=$1; shift
	if "$@"; then
		echo "  ok: $what [$((SECONDS - started)) s]"
	else
		echo "  FAILED: $what [$((SECONDS - started)) s]"
		failed=$((failed + 1))
	fi
}
eq() { [ "$(awk -v a="$1" -v b="$2" 'BEGIN {print (a + 0 == b + 0)}')" = 1 ]; }
ge() { [ "$(awk -v a="$1" -v b="$2" 'BEGIN {print (a + 0 >= b + 0)}')" = 1 ]; }
lt() { [ "$(awk -v a="$1" -v b="$2" 'BEGIN {print (a + 0 < b + 0)}')" = 1 ]; }
say() { echo "  $*"; }
# figure KEY VALUE: a figure worth keeping, with the scenario's name (tests/softroce reports
# these lines with every run).
figure() { echo "  figure: $name $1 $2"; }
# A migration that completed byte-exact.
completed() { # RESULT
	check "the migration completed ($(field "$1" status), $(field "$1" seconds) s)" [ "$(field "$1" status)" = completed ]
	check "the destination's RAM equals the source's" [ "$(field "$1" ram_match)" = True ]
}
# Migration u1 announced on the running gateways (target first), the relays up.
announce() {
	if [ -S "$T/nodeB.sock" ]; then check "B: the migration started" started nodeB target u1 $PORT; fi
	check "A: the migration started" started nodeA source u1 $PORT
	check "the capture table is in vhA" [ -n "$(tables vhA)" ]
	check "the relays are up" relays $PORT
}

## Scenarios

scenario_rdma() {
	gw_b
	gw_a --peer $PEER_B
	check "A: RDMA usable" eq "$(metric nodeA rdma_gw_rdma_usable)" 1
	check "B: RDMA usable" eq "$(metric nodeB rdma_gw_rdma_usable)" 1
	announce
	local pkts va vb lo r
	pkts=$(rxe_sent) va=$(tx_bytes va) vb=$(tx_bytes vb) lo=$(tx_bytes lo)
	r=$(migrate | tail -1)
	say "qemu: $r"
	local open_ms
	open_ms=$(grep -o '"open_ms":[0-9]*' "$T/gw-nodeA.log" | head -1 | cut -d: -f2)
	say "the stream opened in $open_ms ms (connect, the peer's dial, the accept)"
	figure stream_open_ms "$open_ms"
	figure migration_s "$(field "$r" seconds)"
	completed "$r"
	check "A: the streams ended" wait_for 30 idle nodeA
	check "B: the streams ended" wait_for 30 idle nodeB
	check "A: the connection took an RDMA stream" eq "$(conns nodeA source rdma)" 1
	check "A: none over TCP" eq "$(conns nodeA source tcp)" 0
	check "A: no fallback" eq "$(fallbacks nodeA)" 0
	check "B: one stream accepted and dialed" eq "$(conns nodeB target rdma)" 1
	check "A: the RAM went out on the stream ($(bytes nodeA rdma to_target) bytes)" ge "$(bytes nodeA rdma to_target)" $RAM_BYTES
	check "B: the RAM came in on the stream ($(bytes nodeB rdma to_target) bytes)" ge "$(bytes nodeB rdma to_target)" $RAM_BYTES
	check "rxe sent $(($(rxe_sent) - pkts)) packets (>= RAM / 4096)" ge $(($(rxe_sent) - pkts)) $((RAM_BYTES / 4096))
	if [ -e /sys/class/net/va ] && [ -e /sys/class/net/vb ]; then
		local dva=$(($(tx_bytes va) - va)) dvb=$(($(tx_bytes vb) - vb)) dlo=$(($(tx_bytes lo) - lo))
		check "the veth carried the RAM (va $dva + vb $dvb bytes), lo did not ($dlo)" \
			eval "ge $((dva + dvb)) $RAM_BYTES && lt $dlo $((RAM_BYTES / 10))"
	fi
	ended nodeA u1 false
	ended nodeB u1 false
	check "no capture table left" [ -z "$(tables vhA)" ]
}

scenario_parallel() {
	gw_b
	gw_a --peer $PEER_B
	ip netns exec vhB "$PY" "$S/hashsrv.py" 0.0.0.0 49160 49161 >"$T/hs.out" &
	wait_for 60 grep -q ready "$T/hs.out"
	check "B: the migration started" started nodeB target u2 49160,49161
	check "A: the migration started" started nodeA source u2 49160,49161
	local a=10.2.0.2:49160 b=10.2.0.2:49161
	ip netns exec vhA "$PY" "$S/hashcli.py" 4 $a $b $a $b $a $b $a $b >"$T/hc.out"
	sed 's/^/  hashcli: /' "$T/hc.out"
	check "8 connections arrived sha256-exact" [ "$(sed -n 's/^matched=//p' "$T/hc.out")" = 8 ]
	check "each was dialed by gateway B (10.2.0.1)" [ "$(grep -c ' 10.2.0.1 True' "$T/hc.out")" = 8 ]
	check "A: 8 streams" eq "$(conns nodeA source rdma)" 8
	check "B: 8 streams" eq "$(conns nodeB target rdma)" 8
	check "A: no fallback" eq "$(fallbacks nodeA)" 0
	check "A: the streams ended" wait_for 30 idle nodeA
	check "B: the streams ended" wait_for 30 idle nodeB
}

scenario_abort() {
	gw_b
	gw_a --peer $PEER_B
	local A B
	A=$(pid_of nodeA) B=$(pid_of nodeB)
	# A first stream opens the device in both engines: the baseline is taken after it.
	ip netns exec vhB "$PY" "$S/hashsrv.py" 0.0.0.0 49170 >"$T/hs.out" &
	wait_for 60 grep -q ready "$T/hs.out"
	check "B: the warm-up migration started" started nodeB target u0 49170
	check "A: the warm-up migration started" started nodeA source u0 49170
	ip netns exec vhA "$PY" "$S/hashcli.py" 1 10.2.0.2:49170 >"$T/hc.out"
	check "a first stream carried (warm-up)" [ "$(sed -n 's/^matched=//p' "$T/hc.out")" = 1 ]
	ended nodeA u0 false
	ended nodeB u0 false
	wait_for 30 idle nodeA || true
	sleep 2
	local fa fb ta tb
	fa=$(fds "$A") fb=$(fds "$B") ta=$(threads "$A") tb=$(threads "$B")
	announce
	MIGRATE_TIMEOUT=300 migrate --max-bandwidth $THROTTLE --no-verify >"$T/mig.out" 2>"$T/mig.err" &
	local m=$!
	check "bytes flow on a stream" wait_for 300 eval '[ "$(active nodeA)" -ge 1 ] && [ "$(active nodeB)" -ge 1 ]'
	sleep 2
	local t0=$SECONDS
	ended nodeA u1 true
	ended nodeB u1 true
	local rc=0
	wait $m || rc=$?
	say "qemu (rc $rc, $((SECONDS - t0)) s after the abort): $(tail -1 "$T/mig.out")"
	figure failed_after_abort_s $((SECONDS - t0))
	check "the migration failed" [ $rc -ne 0 ]
	check "... within 60 s of the abort" lt $((SECONDS - t0)) 60
	check "A: nothing open" wait_for 30 idle nodeA
	check "B: nothing open" wait_for 30 idle nodeB
	back() { [ "$(fds "$A")" -le "$fa" ] && [ "$(fds "$B")" -le "$fb" ] && [ "$(threads "$A")" -le "$ta" ] && [ "$(threads "$B")" -le "$tb" ]; }
	# A tokio blocking-pool thread lives 10 s after its last task, and the gateways' periodic
	# work starts one now and then (seen: B 5 -> 6 at one look, 5 at the next): the counts
	# must come back within 30 s, not hold at every look. A leak never comes back.
	local came_back=0
	wait_for 30 back && came_back=1
	say "fds A $fa -> $(fds "$A"), B $fb -> $(fds "$B"); threads A $ta -> $(threads "$A"), B $tb -> $(threads "$B")"
	figure fds_after_abort "A $fa->$(fds "$A"), B $fb->$(fds "$B")"
	figure threads_after_abort "A $ta->$(threads "$A"), B $tb->$(threads "$B")"
	check "both gateways came back to their fd and thread counts within 30 s" eq "$came_back" 1
	check "no capture table left" [ -z "$(tables vhA)" ]
	check "A: it was carried as a stream" eq "$(conns nodeA source rdma)" 2
	check "A: counted as aborted" eq "$(metric nodeA 'rdma_gw_migrations_ended_total{role="source",outcome="aborted"}')" 1
}

scenario_peer_killed() {
	gw_b
	gw_a --peer $PEER_B
	announce
	MIGRATE_TIMEOUT=300 migrate --max-bandwidth $THROTTLE --no-verify >"$T/mig.out" 2>"$T/mig.err" &
	local m=$!
	check "bytes flow on a stream" wait_for 300 eval '[ "$(active nodeA)" -ge 1 ] && [ "$(active nodeB)" -ge 1 ]'
	sleep 2
	kill -KILL "$(pid_of nodeB)"
	local t0=$SECONDS rc=0
	wait $m || rc=$?
	say "qemu (rc $rc, $((SECONDS - t0)) s after the kill): $(tail -1 "$T/mig.out")"
	figure failed_after_kill_s $((SECONDS - t0))
	check "the migration failed" [ $rc -ne 0 ]
	check "... within 60 s of the kill" lt $((SECONDS - t0)) 60
	check "A: its stream ended" wait_for 30 idle nodeA
	say "A's stream end: $(grep -h 'stream ended' "$T/gw-nodeA.log" | tail -1)"
	check "A: it was carried as a stream" eq "$(conns nodeA source rdma)" 1
	check "A: still serving" eq "$(metric nodeA rdma_gw_rdma_usable)" 1
	ended nodeA u1 true
	check "no capture table left" [ -z "$(tables vhA)" ]
}

# A migration that completes over TCP with REASON counted (the RAM check is the host tests'
# business: the TCP fallback is the same code there).
falls_back() { # REASON
	local r
	r=$(migrate --no-verify | tail -1)
	say "qemu: $r"
	figure tcp_migration_s "$(field "$r" seconds)"
	check "the migration completed ($(field "$r" status), $(field "$r" seconds) s)" [ "$(field "$r" status)" = completed ]
	check "A: over TCP" eq "$(conns nodeA source tcp)" 1
	check "A: not over RDMA" eq "$(conns nodeA source rdma)" 0
	check "A: reason $1 ($(metrics nodeA | grep -E '^rdma_gw_fallbacks_total.* [1-9]' | tr '\n' ' '))" \
		eq "$(metric nodeA "rdma_gw_fallbacks_total{reason=\"$1\"}")" 1
	check "A: the RAM took the TCP relay" ge "$(bytes nodeA tcp to_target)" $RAM_BYTES
}

scenario_peer_down() {
	gw_a --peer $PEER_B
	announce
	falls_back PEER_REFUSED
}

scenario_no_peer() {
	gw_b
	gw_a
	announce
	falls_back NO_PEER
}

scenario_timeout() {
	gw_b
	gw nodeA --peer $PEER_B --stream-timeout-ms 1
	announce
	falls_back TIMEOUT
	# B may have accepted the stream A gave up on (A's abort crosses B's accept): whether B
	# saw it before or after it took its destination connection is timing. Not a byte of the
	# migration may go that way, and nothing may stay open.
	check "B: no byte reached the destination over a stream" eq "$(bytes nodeB rdma to_target)" 0
	check "B: nothing open" wait_for 30 idle nodeB
}

scenario_no_key() {
	gw_b
	NO_KEYS=1 gw_a --peer $PEER_B
	check "A: no peer key" eq "$(metric nodeA rdma_gw_peer_keys)" 0
	announce
	falls_back NO_PEER_KEY
	check "B: asked for nothing" eq "$(metric nodeB 'rdma_gw_peer_requests_total{outcome="challenged"}')" 0
}

scenario_wrong_key() {
	put_keys "$T/keys-nodeA" "$(new_key)"
	gw_b
	gw_a --peer $PEER_B
	announce
	local r
	r=$(migrate | tail -1)
	say "qemu: $r"
	figure tcp_migration_s "$(field "$r" seconds)"
	completed "$r"
	check "A: over TCP" eq "$(conns nodeA source tcp)" 1
	check "A: not over RDMA" eq "$(conns nodeA source rdma)" 0
	check "A: reason PEER_AUTH_FAILED ($(metrics nodeA | grep -E '^rdma_gw_fallbacks_total.* [1-9]' | tr '\n' ' '))" \
		eq "$(metric nodeA 'rdma_gw_fallbacks_total{reason="PEER_AUTH_FAILED"}')" 1
	check "B: challenged A once" eq "$(metric nodeB 'rdma_gw_peer_requests_total{outcome="challenged"}')" 1
	check "B: refused its proof" eq "$(metric nodeB 'rdma_gw_peer_requests_total{outcome="bad_proof"}')" 1
	check "B: admitted nothing" eq "$(metric nodeB 'rdma_gw_peer_requests_total{outcome="admitted"}')" 0
	check "B: no stream" eq "$(conns nodeB target rdma)" 0
	check "A: the RAM took the TCP relay" ge "$(bytes nodeA tcp to_target)" $RAM_BYTES
}

# reloaded NODE N: the node's gateway has applied N key files since it started (or refused N,
# with `failed`).
reloaded() { [ "$(metric "$1" rdma_gw_peer_keys_config_reloads_total)" = "$2" ]; }
refused_keys() { [ "$(metric "$1" rdma_gw_peer_keys_config_reload_failures_total)" = "$2" ]; }

scenario_rotation() {
	local k1 k2 k3 n=0
	gw_b
	gw_a --peer $PEER_B
	# The key both started with (gw made it).
	k1=$(cat "$T/key") k2=$(new_key) k3=$(new_key)
	check "k1 is a key" [ -n "$k1" ]
	ip netns exec vhB "$PY" "$S/hashsrv.py" 0.0.0.0 49180 >"$T/hs.out" &
	wait_for 60 grep -q ready "$T/hs.out"
	check "B: the migration started" started nodeB target u7 49180
	check "A: the migration started" started nodeA source u7 49180
	# one_stream WHAT: one more sha256-checked connection, carried on a stream.
	one_stream() {
		n=$((n + 1))
		ip netns exec vhA "$PY" "$S/hashcli.py" 1 10.2.0.2:49180 >"$T/hc.out"
		check "$1: sha256-exact" [ "$(sed -n 's/^matched=//p' "$T/hc.out")" = 1 ]
		check "$1: on a stream ($(conns nodeA source rdma) of $n)" eq "$(conns nodeA source rdma)" $n
	}
	one_stream "both [k1]"
	put_keys "$T/keys-nodeA" "$k1" "$k2"
	put_keys "$T/keys-nodeB" "$k1" "$k2"
	check "both reloaded [k1, k2]" wait_for 30 eval 'reloaded nodeA 1 && reloaded nodeB 1'
	check "A: 2 keys" wait_for 30 eval '[ "$(metric nodeA rdma_gw_peer_keys)" = 2 ]'
	one_stream "both [k1, k2]"
	put_keys "$T/keys-nodeA" "$k2" "$k1"
	check "A reloaded [k2, k1]" wait_for 30 reloaded nodeA 2
	one_stream "A [k2, k1], B [k1, k2]"
	put_keys "$T/keys-nodeB" "$k2" "$k1"
	put_keys "$T/keys-nodeA" "$k2"
	check "A reloaded [k2], B [k2, k1]" wait_for 30 eval 'reloaded nodeA 3 && reloaded nodeB 2'
	one_stream "A [k2], B [k2, k1]"
	printf 'not base64!\n' >"$T/keys-nodeB.tmp" && mv "$T/keys-nodeB.tmp" "$T/keys-nodeB"
	check "B refused a bad file" wait_for 30 refused_keys nodeB 1
	check "B kept its 2 keys" wait_for 30 eval '[ "$(metric nodeB rdma_gw_peer_keys)" = 2 ]'
	one_stream "A [k2], B keeping [k2, k1]"
	put_keys "$T/keys-nodeA" "$k3"
	check "A reloaded [k3]" wait_for 30 reloaded nodeA 4
	ip netns exec vhA "$PY" "$S/hashcli.py" 1 10.2.0.2:49180 >"$T/hc.out"
	check "A [k3], B [k2, k1]: sha256-exact" [ "$(sed -n 's/^matched=//p' "$T/hc.out")" = 1 ]
	check "... over TCP" eq "$(conns nodeA source tcp)" 1
	check "... with PEER_AUTH_FAILED" eq "$(metric nodeA 'rdma_gw_fallbacks_total{reason="PEER_AUTH_FAILED"}')" 1
	check "A: no other fallback" eq "$(fallbacks nodeA)" 1
	check "B: $n streams" eq "$(conns nodeB target rdma)" $n
}

# hex BYTES..: random bytes as hex.
rand_hex() { head -c "$1" /dev/urandom | od -An -tx1 -v | tr -d ' \n'; }

scenario_forged() {
	[ -x "${ATTACKER:-}" ] || { say "ATTACKER (the built tests/softroce/tools/attacker.c) is not set"; return 1; }
	gw_b
	check "B: the migration started" started nodeB target u1 $PORT
	# The destination the target would dial: it counts the connections it gets.
	ip netns exec vhB "$PY" -c '
import socket, sys
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("10.2.0.2", int(sys.argv[1]))); l.listen(8); print("ready", flush=True)
while True:
    c, p = l.accept(); print("connection", p, flush=True); c.close()
' $PORT >"$T/dest.out" &
	check "the destination listens" wait_for 10 grep -q ready "$T/dest.out"
	local digest port nonce out ticket
	digest=$("$PY" -c 'import hashlib, sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest()[:16])' u1)
	port=$(printf '%04x' $PORT)
	# Version 1 (no peer authentication): 'G' 1 family port ip digest.
	out=$("$ATTACKER" raw_connect v1 "$ADDR_B" 7472 "$ADDR_A" 470104${port}0a020002${digest})
	say "v1: $out"
	check "a version-1 request is refused (9: unsupported version)" grep -q "^v1 rejected .* payload 4709" <<<"$out"
	out=$("$ATTACKER" raw_connect hello "$ADDR_B" 7472 "$ADDR_A" 470201${port}${digest}$(rand_hex 16))
	say "hello: $out"
	check "a HELLO with the known uid gets a challenge (4)" grep -q "^hello rejected .* payload 4704" <<<"$out"
	ticket=$(sed -n 's/^hello rejected .* payload 4704\(.\{14\}\).*/\1/p' <<<"$out")
	local proof=470202${port}${digest}${ticket}$(rand_hex 16)
	out=$("$ATTACKER" raw_connect proof "$ADDR_B" 7472 "$ADDR_A" "$proof" raw_connect replay "$ADDR_B" 7472 "$ADDR_A" "$proof")
	say "proof: $out"
	check "a forged proof is refused (5: authentication failed)" grep -q "^proof rejected .* payload 4705" <<<"$out"
	check "its replay is refused" grep -q "^replay rejected" <<<"$out"
	check "nothing was established" eval '! grep -q established <<<"$out"'
	sleep 1
	check "the destination saw no connection" eval '! grep -q connection "$T/dest.out"'
	local refused
	refused=$(awk -v a="$(metric nodeB 'rdma_gw_peer_requests_total{outcome="bad_proof"}')" \
		-v b="$(metric nodeB 'rdma_gw_peer_requests_total{outcome="no_challenge"}')" 'BEGIN {print a + b}')
	check "B: refused the proof and its replay ($refused)" ge "$refused" 2
	check "B: admitted nothing" eq "$(metric nodeB 'rdma_gw_peer_requests_total{outcome="admitted"}')" 0
	check "B: no stream" eq "$(conns nodeB target rdma)" 0
	ended nodeB u1 false
}

## Run

passed=() failures=()
for name in ${scenarios//,/ }; do
	fn=scenario_${name//-/_}
	if ! declare -F "$fn" >/dev/null; then
		echo "softroce-migration: unknown scenario '$name' (see --help)" >&2
		exit 2
	fi
	echo "== $name (at $SECONDS s)"
	rm -f "$T"/gw-*.log "$T"/*.sock "$T"/key "$T"/keys-*
	t0=$SECONDS started=$SECONDS
	rc=0
	(
		set +e
		trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null' EXIT
		$fn
		[ $failed -eq 0 ]
	) || rc=$?
	if [ $rc -eq 0 ]; then
		echo "PASS $name ($((SECONDS - t0)) s)"
		passed+=("$name")
	else
		echo "FAIL $name ($((SECONDS - t0)) s)"
		for g in nodeA nodeB; do
			[ -f "$T/gw-$g.log" ] && { echo "  -- gateway of $g, log tail:"; tail -25 "$T/gw-$g.log" | sed 's/^/  | /'; }
		done
		failures+=("$name")
	fi
done
echo "softroce-migration: ${#passed[@]} passed, ${#failures[@]} failed${failures:+: ${failures[*]}}"
[ ${#failures[@]} -eq 0 ]
