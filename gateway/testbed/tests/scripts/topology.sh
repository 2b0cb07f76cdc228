# Two "nodes" (network namespaces nodeA, nodeB joined by a veth, 198.18.0.1/.2), each with a
# "virt-handler" pod namespace (vhA 10.1.0.2, vhB 10.2.0.2) behind its own veth, routed
# through the node. Sourced by the gateway tests inside `unshare -n -p -f --mount-proc`;
# `ip netns add` mounts are private to that mount namespace and vanish with it; the files it
# creates go to a private tmpfs over /run/netns, so none is left on the host.
mkdir -p /run/netns
mount -t tmpfs -o size=1m,mode=0755 gw-test-netns /run/netns
for n in nodeA nodeB vhA vhB; do
	ip netns add $n
	ip -n $n link set lo up
done
ip link add ab type veth peer name ba
ip link set ab netns nodeA
ip link set ba netns nodeB
ip -n nodeA addr add 198.18.0.1/24 dev ab
ip -n nodeB addr add 198.18.0.2/24 dev ba
ip -n nodeA link set ab up
ip -n nodeB link set ba up
pod_link() { # node vh node_ip pod_ip other_pod_net other_node_ip
	ip link add v$2 type veth peer name h$2
	ip link set v$2 netns $2
	ip link set h$2 netns $1
	ip -n $2 addr add $4/24 dev v$2
	ip -n $1 addr add $3/24 dev h$2
	ip -n $2 link set v$2 up
	ip -n $1 link set h$2 up
	ip -n $2 route add default via $3
	ip -n $1 route add $5 via $6
	ip netns exec $1 sysctl -qw net.ipv4.ip_forward=1
}
pod_link nodeA vhA 10.1.0.1 10.1.0.2 10.2.0.0/24 198.18.0.2
pod_link nodeB vhB 10.2.0.1 10.2.0.2 10.1.0.0/24 198.18.0.1
