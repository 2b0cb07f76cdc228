# Helpers for the gateway tests (sourced after topology.sh). Needs GW, S, T.
# gw NODE [ARGS..]: start the gateway of nodeA or nodeB (env from the caller: PROVIDER, the
# librdmacm to load, default the system's; CAPTURE_ARGS instead of --capture-netns
# /run/netns/vhX), log in $T/gw-NODE.log, pid in $T/gw-NODE.pid.
gw() {
	local node=$1; shift
	local vh=vh${node#node}
	local ip=198.18.0.1; [ $node = nodeB ] && ip=198.18.0.2
	ip netns exec $node $GW \
		--listen $ip:7471 --admin-listen 127.0.0.1:9103 --provider ${PROVIDER:-librdmacm.so.1} \
		${CAPTURE_ARGS:---capture-netns /run/netns/$vh} --test-events-socket $T/$node.sock \
		--log-level ${GW_LOG:-info} --log-format json "$@" 2>$T/gw-$node.log &
	echo $! >$T/gw-$node.pid
	for _ in $(seq 100); do [ -S $T/$node.sock ] && return 0; sleep 0.05; done
	echo "gateway $node did not start"; cat $T/gw-$node.log; return 1
}
# event NODE JSON: one migration event through the test hook; fails unless "ok".
event() { [ "$(echo "$2" | socat -t5 - UNIX-CONNECT:$T/$1.sock)" = ok ]; }
started() { # NODE ROLE UID PORTS(comma)
	event $1 "{\"started\":{\"uid\":\"$3\",\"vmi\":\"default/vm-$3\",\"role\":\"$2\",\"target\":\"10.2.0.2\",\"ports\":[$4]}}"
}
ended() { event $1 "{\"ended\":{\"uid\":\"$2\",\"aborted\":$3}}"; }
# tables NS: the gateway's nft tables in a namespace.
tables() { ip netns exec $1 nft list tables | grep rdma_gw_ || true; }
wait_table() { for _ in $(seq 100); do [ -n "$(tables $1)" ] && return 0; sleep 0.05; done; return 1; }
metrics() { ip netns exec $1 curl -s 127.0.0.1:9103/metrics; }
# metric NODE NAME{labels}: one value (0 when absent).
metric() { metrics $1 | awk -v k="$2" '$1 == k {print $2; f=1} END {if (!f) print 0}'; }
# Relays imitating virt-handler's migration proxy.
relays() { # PORT: relay A (vhA: unix $T/src.sock -> 10.2.0.2:PORT), relay B (vhB: PORT -> unix $T/dst.sock)
	ip netns exec vhA $PY $S/relay.py unix-to-tcp $T/src.sock 10.2.0.2:$1 >$T/relayA.out &
	ip netns exec vhB $PY $S/relay.py tcp-to-unix $1 $T/dst.sock >$T/relayB.out &
	for _ in $(seq 100); do grep -q ready $T/relayA.out $T/relayB.out 2>/dev/null && [ $(cat $T/relayA.out $T/relayB.out | grep -c ready) = 2 ] && return 0; sleep 0.05; done
	return 1
}
# migrate [TOOL ARGS..]: one QEMU migration source -> relay A -> ... -> relay B -> destination.
migrate() {
	$PY $QEMU_TOOL --ram-file $RAM --listen unix:$T/dst.sock --target unix:$T/src.sock --timeout ${MIGRATE_TIMEOUT:-60} "$@"
}
