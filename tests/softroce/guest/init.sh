#!/bin/bash
# Guest init of rdma-streams-softroce: loads Soft-RoCE (rdma_rxe), builds one of two topologies,
# then runs a command with the topology described in SOFTROCE_* variables.
#
#   init.sh --work DIR            what the harness runs inside a virtme-ng guest: reads
#                                 DIR/guest.env (role, command, env), sets up, runs the command
#                                 with its output in DIR/stdout and DIR/stderr (and on the
#                                 console), writes "exit N" (or "setup-failed STEP") to DIR/status
#   init.sh --role loop|a|b [-- COMMAND ARGS...]
#                                 by hand inside a guest, for example
#       vng --disable-kvm --rwdir=/tmp --run /boot/vmlinuz-6.1.0-57-amd64 --memory 3G --cpus 2 \
#           --exec "bash $PWD/tests/softroce/guest/init.sh --role loop -- ibv_devices"
#   init.sh --setup-only --role loop   direct mode on a host with rdma_rxe: the loop topology in
#                                 the initial network namespace, nothing else (no tmpfs, no command)
#   init.sh --teardown --role loop     undoes --setup-only
#
# Topologies (SOFTROCE_MTU, default 9000, is the MTU of the links; rxe then uses a 4096 path MTU):
#   loop  one guest, both ends inside it: veth va (198.18.0.1/24) <-> vb (198.18.0.2/24), rxe
#         devices rxea on va and rxeb on vb, permanent neighbour entries and policy routing
#         (tables 201 and 202, the local table demoted to pref 100) so that traffic between the
#         two addresses crosses the veth, and so rxe's UDP path, instead of lo.
#   a, b  two guests joined by a QEMU socket netdev: the guest's NIC gets 198.18.1.1/24 (a) or
#         198.18.1.2/24 (b) and one rxe device rxe0.
set -u

role=${SOFTROCE_ROLE:-loop}
work=""
mode=run
cmd=()
while [ $# -gt 0 ]; do
	case $1 in
	--work) work=$2; shift 2 ;;
	--role) role=$2; shift 2 ;;
	--setup-only) mode=setup; shift ;;
	--teardown) mode=teardown; shift ;;
	--) shift; cmd=("$@"); break ;;
	*) echo "init.sh: unknown argument '$1' (see the comment at the top of this file)" >&2; exit 2 ;;
	esac
done

# guest.env (written by the harness) sets SOFTROCE_ROLE, SOFTROCE_WORK, SOFTROCE_OUT,
# SOFTROCE_CMD (an array) and exports the command's own variables.
SOFTROCE_OUT=""
if [ -n "$work" ]; then
	if [ ! -f "$work/guest.env" ]; then
		echo "init.sh: $work/guest.env is missing" >&2
		exit 2
	fi
	# shellcheck disable=SC1091
	. "$work/guest.env"
	role=$SOFTROCE_ROLE
	if [ -n "${SOFTROCE_CMD+x}" ]; then cmd=("${SOFTROCE_CMD[@]}"); fi
fi
out=$SOFTROCE_OUT
mtu=${SOFTROCE_MTU:-9000}

mark() { echo "SOFTROCE-MARK $1 uptime=$(cut -d' ' -f1 /proc/uptime)"; }
fail() {
	echo "softroce-init: FAILED: $*"
	[ -n "$out" ] && echo "setup-failed $*" >"$out/status"
	exit 125
}
# Echoes a setup command, runs it, and fails the whole init with the command as its step.
step() {
	echo "+ $*"
	"$@" || fail "$*"
}

teardown_loop() {
	ip rule show pref 0 | grep -q 'lookup local' || ip rule add pref 0 lookup local
	ip rule del pref 100 lookup local 2>/dev/null
	ip rule del pref 10 2>/dev/null
	ip rule del pref 11 2>/dev/null
	ip route flush table 201 2>/dev/null
	ip route flush table 202 2>/dev/null
	rdma link del rxea 2>/dev/null
	rdma link del rxeb 2>/dev/null
	ip link del va 2>/dev/null
	local state=${SOFTROCE_SYSCTL_STATE:-/run/softroce-direct.sysctl}
	if [ -f "$state" ]; then
		while read -r key value; do sysctl -qw "$key=$value"; done <"$state"
		rm -f "$state"
	fi
	echo "softroce-init: loop topology removed"
}

if [ "$mode" = teardown ]; then
	[ "$role" = loop ] || { echo "init.sh: --teardown knows the loop topology only" >&2; exit 2; }
	teardown_loop
	exit 0
fi

mark INIT-START
echo "softroce-init: role $role, kernel $(uname -r), $(nproc) cpus, $(grep MemTotal /proc/meminfo | tr -s ' ')"

step modprobe rdma_rxe
step modprobe rdma_ucm
ip link set lo up

if [ "$mode" = run ]; then
	ulimit -l unlimited || fail "ulimit -l unlimited"
	# The 9p root cannot ftruncate or bind unix sockets: work files go on a tmpfs.
	mkdir -p /run/w && { mountpoint -q /run/w || mount -t tmpfs tmpfs /run/w; } || fail "tmpfs on /run/w"
	export TMPDIR=/run/w
fi

case $role in
loop)
	if [ "$mode" = setup ]; then
		for dev in va vb; do [ -e "/sys/class/net/$dev" ] && fail "$dev exists already (another run, or --teardown missing)"; done
		state=${SOFTROCE_SYSCTL_STATE:-/run/softroce-direct.sysctl}
		: >"$state"
		for i in all default; do
			for k in rp_filter accept_local; do
				echo "net.ipv4.conf.$i.$k $(sysctl -n "net.ipv4.conf.$i.$k")" >>"$state"
			done
		done
		echo "net.core.netdev_max_backlog $(sysctl -n net.core.netdev_max_backlog)" >>"$state"
	fi
	# A veth hands every frame to a per-CPU backlog (1000 frames by default); 64 streams sending
	# at once overflow it, and rxe in Debian 12's kernel (6.1) does not recover from such a
	# transmit drop: the connection fails with "remote invalid request" (`rdma statistic`
	# counted send_err in exactly the failing runs: 5 of 20). With 32768: 0 of 10.
	step sysctl -qw net.core.netdev_max_backlog=32768
	step ip link add va type veth peer name vb
	if ! ip link set va mtu "$mtu" || ! ip link set vb mtu "$mtu"; then
		echo "softroce-init: veth refused MTU $mtu; staying at $(cat /sys/class/net/va/mtu)"
	fi
	step ip addr add 198.18.0.1/24 dev va
	step ip addr add 198.18.0.2/24 dev vb
	step ip link set va up
	step ip link set vb up
	step rdma link add rxea type rxe netdev va
	step rdma link add rxeb type rxe netdev vb
	step ip neigh replace 198.18.0.2 lladdr "$(cat /sys/class/net/vb/address)" dev va nud permanent
	step ip neigh replace 198.18.0.1 lladdr "$(cat /sys/class/net/va/address)" dev vb nud permanent
	step ip rule add pref 100 lookup local
	step ip rule del pref 0 lookup local
	step ip rule add pref 10 iif lo to 198.18.0.1 lookup 201
	step ip rule add pref 11 iif lo to 198.18.0.2 lookup 202
	step ip route add 198.18.0.1 dev vb src 198.18.0.2 table 201
	step ip route add 198.18.0.2 dev va src 198.18.0.1 table 202
	for i in all default va vb; do
		step sysctl -qw "net.ipv4.conf.$i.rp_filter=0" "net.ipv4.conf.$i.accept_local=1"
	done
	export SOFTROCE_ADDR_A=198.18.0.1 SOFTROCE_ADDR_B=198.18.0.2 SOFTROCE_DEVICES="rxea rxeb"
	;;
a | b)
	[ "$mode" = run ] || fail "--setup-only knows the loop topology only"
	nic=""
	for d in /sys/class/net/*; do
		n=${d##*/}
		[ "$n" = lo ] && continue
		[ -e "$d/device" ] || continue
		nic=$n
		break
	done
	[ -n "$nic" ] || fail "no NIC besides lo (QEMU needs -netdev socket ... -device virtio-net-pci)"
	if [ "$role" = a ]; then addr=198.18.1.1; else addr=198.18.1.2; fi
	# QEMU's socket netdev carries frames up to 69632 bytes (NET_BUFSIZE) and virtio-net takes
	# up to 65535, so 9000 is accepted; if not, stay and say so.
	if ! ip link set "$nic" mtu "$mtu"; then
		echo "softroce-init: $nic refused MTU $mtu; staying at $(cat "/sys/class/net/$nic/mtu")"
	fi
	step ip addr add "$addr/24" dev "$nic"
	step ip link set "$nic" up
	step rdma link add rxe0 type rxe netdev "$nic"
	export SOFTROCE_ADDR_A=198.18.1.1 SOFTROCE_ADDR_B=198.18.1.2 SOFTROCE_NIC=$nic SOFTROCE_DEVICES=rxe0
	;;
*) fail "unknown role '$role' (loop, a or b)" ;;
esac

echo "== ip -br addr"
ip -br addr
echo "== rdma link"
rdma link
echo "== ibv_devices"
ibv_devices
for d in /sys/class/infiniband/*; do
	[ -e "$d" ] || continue
	echo "== ibv_devinfo ${d##*/}: $(ibv_devinfo -d "${d##*/}" | grep -E 'state|active_mtu' | tr -s ' \t' ' ' | tr '\n' ';')"
done

if [ "$mode" = setup ]; then
	echo "softroce-init: loop topology ready (undo: init.sh --teardown --role loop)"
	exit 0
fi

export SOFTROCE_ROLE=$role SOFTROCE_IN_GUEST=1 SOFTROCE_WORK=${SOFTROCE_WORK:-$work} SOFTROCE_OUT SOFTROCE_MTU=$mtu
cd "$TMPDIR" || fail "cd $TMPDIR"
mark SETUP-DONE

if [ ${#cmd[@]} -eq 0 ]; then
	echo "softroce-init: no command; topology ready"
	exit 0
fi
echo "softroce-init: running ${cmd[*]}"
if [ -n "$out" ]; then
	# The command's output goes to files in the shared work dir and, through tee, to the console.
	exec 3> >(tee "$out/stdout")
	tee_out=$!
	exec 4> >(tee "$out/stderr" >&2)
	tee_err=$!
	"${cmd[@]}" >&3 2>&4
	rc=$?
	exec 3>&- 4>&-
	wait "$tee_out" "$tee_err"
	echo "exit $rc" >"$out/status"
else
	"${cmd[@]}"
	rc=$?
fi
mark "EXIT rc=$rc"
exit "$rc"
