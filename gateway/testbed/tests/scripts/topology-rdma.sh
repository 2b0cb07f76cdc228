# The gateway topology where RDMA works (sourced; needs root, in a private mount namespace):
# the two "nodes" are the caller's network namespace, which must be the initial one (rxe does
# not work in other namespaces on Debian's 6.1 kernel) and hold the RDMA addresses of both
# gateways (the Soft-RoCE loop guest's 198.18.0.1 on rxea and 198.18.0.2 on rxeb); each
# "virt-handler" is a network namespace behind its own veth, as in topology.sh:
#
#   vhA 10.1.0.2 (vvhA) <-> hvhA 10.1.0.1 | initial namespace | hvhB 10.2.0.1 <-> vvhB 10.2.0.2 vhB
#
# Both gateways run in the initial namespace: gateway A captures in vhA, gateway B dials
# 10.2.0.2 straight. `ip netns` names live on a tmpfs over /run/netns (private to the mount
# namespace), so the namespaces, and with them the veths, go when its last process does.
# topology_rdma_down removes them at once.
mkdir -p /run/netns
mount -t tmpfs -o size=1m,mode=0755 gw-rdma-netns /run/netns
topology_rdma_forward=$(sysctl -n net.ipv4.ip_forward)
vh_link() { # vh host_ip pod_ip
	ip netns add $1
	ip -n $1 link set lo up
	ip link add h$1 type veth peer name v$1
	ip link set v$1 netns $1
	ip addr add $2/24 dev h$1
	ip link set h$1 up
	ip -n $1 addr add $3/24 dev v$1
	ip -n $1 link set v$1 up
	ip -n $1 route add default via $2
}
vh_link vhA 10.1.0.1 10.1.0.2
vh_link vhB 10.2.0.1 10.2.0.2
# Routed through the node, as a pod network is (a connection that is not captured goes
# straight from vhA to vhB).
sysctl -qw net.ipv4.ip_forward=1
topology_rdma_down() {
	ip link del hvhA 2>/dev/null || true
	ip link del hvhB 2>/dev/null || true
	ip netns del vhA 2>/dev/null || true
	ip netns del vhB 2>/dev/null || true
	sysctl -qw net.ipv4.ip_forward="$topology_rdma_forward"
}
