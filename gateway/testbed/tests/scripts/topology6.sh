# IPv6 on the topology of topology.sh (sourced after it): the node veth fd00:18::1/::2, the
# virt-handler namespaces fd00:1::2 (vhA) and fd00:2::2 (vhB) behind their nodes' fd00:1::1 and
# fd00:2::1, routed through the nodes. `nodad`: usable at once, no duplicate address detection.
ip -n nodeA addr add fd00:18::1/64 dev ab nodad
ip -n nodeB addr add fd00:18::2/64 dev ba nodad
pod_link6() { # node vh node_ip pod_ip other_pod_net other_node_ip
	ip -n $2 addr add $4/64 dev v$2 nodad
	ip -n $1 addr add $3/64 dev h$2 nodad
	ip -n $2 -6 route add default via $3
	ip -n $1 -6 route add $5 via $6
	ip netns exec $1 sysctl -qw net.ipv6.conf.all.forwarding=1
}
pod_link6 nodeA vhA fd00:1::1 fd00:1::2 fd00:2::/64 fd00:18::2
pod_link6 nodeB vhB fd00:2::1 fd00:2::2 fd00:1::/64 fd00:18::1
