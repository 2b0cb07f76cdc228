#!/bin/bash
# Guest side of the per-connection memory-isolation probe (isolation_cost.c beside this file):
# compiles it with cc in the guest (whose root is the host's) and runs it once on the loop
# topology (listener on SOFTROCE_ADDR_A / rxea, clients from SOFTROCE_ADDR_B / rxeb).
#   cargo run -p rdma-streams-softroce --example guest -- --timeout 1400 -- \
#       bash "$PWD/tests/softroce/benches/isolation_cost.sh"
# N: rounds per timing (default 200). The host-side calibration of the memset term (TCG
# inflates user-space memset far more than the kernel's verbs work):
#   cc -O2 -o /tmp/isolation_cost tests/softroce/benches/isolation_cost.c -lrdmacm -libverbs
#   /tmp/isolation_cost memset 200
set -u
here=$(cd "$(dirname "$0")" && pwd)
bin=${TMPDIR:-/tmp}/isolation_cost
cc -O2 -Wall -o "$bin" "$here/isolation_cost.c" -lrdmacm -libverbs || exit 1
echo "kernel $(uname -r); rdma-core $(dpkg-query -W -f '${Version}' rdma-core 2>/dev/null); $(nproc) vCPUs"
rdma link
ADDR_A=${SOFTROCE_ADDR_A:-198.18.0.1} ADDR_B=${SOFTROCE_ADDR_B:-198.18.0.2} PORT=${PORT:-7471} \
	"$bin" "${N:-200}"
rc=$?
echo "isolation_cost exit $rc"
dmesg | grep -iE 'rxe|rdma' | tail -n 20
exit $rc
