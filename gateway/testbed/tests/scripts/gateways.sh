# Helpers for the gateway tests, benchmarks and Soft-RoCE scenarios (sourced after the topology).
# Needs GW, S, T, PY (and QEMU_TOOL, RAM for migrate).
#
# Two node layouts:
#   GW_NODES=netns (default, topology.sh): nodes nodeA and nodeB are network namespaces, each
#     gateway listens on its node's address (198.18.0.1/.2) port 7471, admin on 127.0.0.1:9103;
#   GW_NODES=initial (topology-rdma.sh, where RDMA works): both gateways in the caller's network
#     namespace, gateway A on $ADDR_A:7471 (admin 9103), gateway B on $ADDR_B:7472 (admin 9104).
# PEER_B is the --peer value that sends the target 10.2.0.2 to gateway B.
if [ "${GW_NODES:-netns}" = initial ]; then
	PEER_B="10.2.0.2=$ADDR_B:7472"
else
	PEER_B="10.2.0.2=198.18.0.2:7471"
fi
# node_exec NODE COMMAND..: a command in the node's network namespace.
node_exec() {
	local node=$1; shift
	if [ "${GW_NODES:-netns}" = initial ]; then "$@"; else ip netns exec "$node" "$@"; fi
}
# node_listen NODE, node_admin NODE: the gateway's stream and admin addresses.
node_listen() {
	case ${GW_NODES:-netns}/$1 in
	initial/nodeA) echo "$ADDR_A:7471" ;;
	initial/nodeB) echo "$ADDR_B:7472" ;;
	*/nodeA) echo 198.18.0.1:7471 ;;
	*) echo 198.18.0.2:7471 ;;
	esac
}
node_admin() {
	if [ "${GW_NODES:-netns}" = initial ] && [ "$1" = nodeB ]; then echo 127.0.0.1:9104; else echo 127.0.0.1:9103; fi
}
# new_key: a fresh peer key (32 random bytes, standard base64).
new_key() { head -c 32 /dev/urandom | base64 -w0; echo; }
# put_keys FILE KEY..: writes a peer keys file at once (a rename: the gateway never reads half
# of it), the first key first.
put_keys() {
	local f=$1; shift
	{ echo "# peer keys: the first signs, all verify"; printf '%s\n' "$@"; } >"$f.tmp"
	mv "$f.tmp" "$f"
}
# gw NODE [ARGS..]: start the gateway of nodeA or nodeB (env from the caller: PROVIDER, the
# librdmacm to load, default the system's; CAPTURE_ARGS instead of --capture-netns
# /run/netns/vhX; NO_KEYS=1: no --peer-keys-file), log in $T/gw-NODE.log, pid in
# $T/gw-NODE.pid. Its peer keys file is $T/keys-NODE, made with the key both nodes share
# ($T/key) unless the caller wrote one.
gw() {
	local node=$1; shift
	local vh=vh${node#node}
	rm -f "$T/$node.sock"
	[ -s "$T/key" ] || new_key >"$T/key"
	[ -e "$T/keys-$node" ] || put_keys "$T/keys-$node" "$(cat "$T/key")"
	local keys=(--peer-keys-file "$T/keys-$node")
	[ -z "${NO_KEYS:-}" ] || keys=()
	# shellcheck disable=SC2206 # CAPTURE_ARGS is words
	local args=(--listen $(node_listen $node) --admin-listen $(node_admin $node)
		--provider ${PROVIDER:-librdmacm.so.1} ${CAPTURE_ARGS:---capture-netns /run/netns/$vh}
		"${keys[@]}" --test-events-socket $T/$node.sock --log-level ${GW_LOG:-info} --log-format json "$@")
	# The gateway's own pid in the pid file (`ip netns exec` execs it), not a subshell's.
	if [ "${GW_NODES:-netns}" = initial ]; then
		$GW "${args[@]}" 2>>$T/gw-$node.log &
	else
		ip netns exec $node $GW "${args[@]}" 2>>$T/gw-$node.log &
	fi
	echo $! >$T/gw-$node.pid
	for _ in $(seq 200); do [ -S $T/$node.sock ] && return 0; sleep 0.05; done
	echo "gateway $node did not start"; cat $T/gw-$node.log; return 1
}
# event NODE JSON: one migration event through the test bed's events socket; fails unless "ok" comes within
# EVENT_TIMEOUT seconds (default 5; a source start installs the capture first).
event() { [ "$(echo "$2" | socat -t${EVENT_TIMEOUT:-5} - UNIX-CONNECT:$T/$1.sock)" = ok ]; }
started() { # NODE ROLE UID PORTS(comma)
	event $1 "{\"started\":{\"uid\":\"$3\",\"vmi\":\"default/vm-$3\",\"role\":\"$2\",\"target\":\"10.2.0.2\",\"ports\":[$4]}}"
}
ended() { event $1 "{\"ended\":{\"uid\":\"$2\",\"aborted\":$3}}"; }
# tables NS: the gateway's nft tables in a namespace.
tables() { ip netns exec $1 nft list tables | grep rdma_gw_ || true; }
wait_table() { for _ in $(seq 600); do [ -n "$(tables $1)" ] && return 0; sleep 0.05; done; return 1; }
metrics() { node_exec $1 curl -s $(node_admin $1)/metrics; }
# metric NODE NAME{labels}: one value (0 when absent).
metric() { metrics $1 | awk -v k="$2" '$1 == k {print $2; f=1} END {if (!f) print 0}'; }
# Relays imitating virt-handler's migration proxy.
relays() { # PORT: relay A (vhA: unix $T/src.sock -> 10.2.0.2:PORT), relay B (vhB: PORT -> unix $T/dst.sock)
	rm -f $T/relayA.out $T/relayB.out
	ip netns exec vhA $PY $S/relay.py unix-to-tcp $T/src.sock 10.2.0.2:$1 >$T/relayA.out &
	ip netns exec vhB $PY $S/relay.py tcp-to-unix $1 $T/dst.sock >$T/relayB.out &
	for _ in $(seq 600); do grep -q ready $T/relayA.out $T/relayB.out 2>/dev/null && [ $(cat $T/relayA.out $T/relayB.out | grep -c ready) = 2 ] && return 0; sleep 0.05; done
	return 1
}
# migrate [TOOL ARGS..]: one QEMU migration source -> relay A -> ... -> relay B -> destination
# (RAM_MIB MiB of guest RAM, default 256, from the random file $RAM).
migrate() {
	$PY $QEMU_TOOL --ram-mib ${RAM_MIB:-256} --ram-file $RAM --listen unix:$T/dst.sock --target unix:$T/src.sock --timeout ${MIGRATE_TIMEOUT:-60} "$@"
}
