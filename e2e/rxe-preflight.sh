# e2e/rxe-preflight.sh: sourced by the Soft-RoCE scripts. `skip WHY` prints one `SKIP: WHY`
# line and exits 0 (77 with SOFTROCE_REQUIRE=1). `rxe_preflight` returns when this host can run
# rdma_rxe links with the real librdmacm (loading rdma_rxe and rdma_ucm if needed) and skips
# otherwise. Changes nothing else.

skip() {
	echo "SKIP: $*"
	if [[ ${SOFTROCE_REQUIRE:-0} == 1 ]]; then
		exit 77
	fi
	exit 0
}

rxe_preflight() {
	command -v rdma >/dev/null ||
		skip "no 'rdma' tool; needs iproute2 with rdma (apt-get install iproute2) and a kernel with rdma_rxe"
	if [[ ! -d /sys/module/rdma_rxe ]]; then
		why=""
		if ! command -v modprobe >/dev/null; then
			why="rdma_rxe is not loaded and there is no modprobe (kmod)"
		elif ! err=$(modprobe rdma_rxe 2>&1); then
			why="modprobe rdma_rxe failed: $(head -n1 <<<"$err")"
		fi
		if [[ -n $why ]]; then
			if ! rdma link show >/dev/null 2>&1; then
				why+="; kernel $(uname -r) has no RDMA core either (no NETLINK_RDMA: CONFIG_INFINIBAND unset)"
			fi
			skip "$why; needs a kernel with CONFIG_RDMA_RXE (module or built in; Ubuntu: linux-modules-extra-\$(uname -r)), kmod and iproute2's rdma, as root"
		fi
	fi
	# librdmacm talks to the kernel through /dev/infiniband/rdma_cm (rdma_ucm), which loading
	# rdma_rxe does not pull in; udev usually loads it when an RDMA device appears.
	if [[ ! -e /dev/infiniband/rdma_cm ]] && command -v modprobe >/dev/null; then
		modprobe rdma_ucm 2>/dev/null || true
	fi
	if [[ ! -e /dev/infiniband/rdma_cm ]]; then
		skip "rdma_rxe is loaded but /dev/infiniband/rdma_cm is missing; needs rdma_ucm (modprobe rdma_ucm) and /dev/infiniband"
	fi
	if ! err=$(rdma link show 2>&1); then
		skip "'rdma link' fails ($(head -n1 <<<"$err")); needs a kernel with RDMA netlink (CONFIG_INFINIBAND) and rdma_rxe"
	fi
	if ! ldconfig -p | grep -q 'librdmacm\.so\.1 '; then
		skip "librdmacm.so.1 not installed; needs librdmacm1 (apt-get install librdmacm1)"
	fi
	if ! compgen -G "/usr/lib/*/libibverbs/librxe-rdmav*.so" >/dev/null; then
		skip "no rxe verbs provider (libibverbs/librxe-rdmav*.so); needs ibverbs-providers"
	fi
}
