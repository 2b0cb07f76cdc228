#!/bin/bash
# The guest side of `cargo bench -p rdma-streams-softroce --bench rdma` (tests/softroce/benches/
# rdma.rs boots one loop guest and runs this in it; it can be run by hand in a guest started
# with `cargo run -p rdma-streams-softroce --example guest -- -- bash THIS_FILE`, with the
# variables below).
#
# Every variant runs on the same rxe link: servers on rxea's address (SOFTROCE_ADDR_A,
# 198.18.0.1), clients leave from rxeb's (SOFTROCE_ADDR_B) across the veth. Repetitions are
# interleaved: in repetition k each group's variants run in an order rotated by k. Each run
# leaves its raw files in $SOFTROCE_OUT/bench/NNN-<variant>-r<k>/ (the host side parses and
# judges them):
#   meta          variant=, rep=, pairs= (streams), procs= (process pairs), bytes_per_pair= (per
#                 stream), size=, count=
#   stat0 stat1   the guest's `cpu` line of /proc/stat before and after
#   {srv,cli}N.ru   rdma_tool run's line for server/client of pair N (times, CPU, status)
#   {srv,cli}N.out  .err  their output
#   srv-PID.json cli-PID.json (src-/dst- for QEMU)  the shim's STREAMSHIM_STATS files
#
# Variables: TOOL (rdma_tool), SHIM (libstreamshim.so), RSPRELOAD (librspreload.so), PY (a
# python3), MIGRATE (tests/tools/qemu_migrate.py), REPS, SIZE (bytes per transfer), COUNT
# (transfers each way, one stream; each of the 4 pairs does COUNT/2), IPERF_SECONDS, CONNECTS,
# CONNECT_WARMUP, HTTP_REQUESTS (requests without keep-alive per run), FIRST_MIB (a fresh
# connection's first transfer), MIGRATIONS (repetitions that also time a QEMU migration; 0:
# none), MIGRATION_MIB, NEGOTIATE_MS.
set -u

: "${TOOL:?}" "${SHIM:?}" "${RSPRELOAD:?}" "${PY:?}" "${MIGRATE:?}"
REPS=${REPS:-5} SIZE=${SIZE:-1048576} COUNT=${COUNT:-64} IPERF_SECONDS=${IPERF_SECONDS:-5}
CONNECTS=${CONNECTS:-100} CONNECT_WARMUP=${CONNECT_WARMUP:-5} MIGRATIONS=${MIGRATIONS:-3}
MIGRATION_MIB=${MIGRATION_MIB:-128} NEGOTIATE_MS=${NEGOTIATE_MS:-5000}
HTTP_REQUESTS=${HTTP_REQUESTS:-1000} FIRST_MIB=${FIRST_MIB:-100}
# The shim's smaller-memory setting, measured beside its default (2 MiB rings).
SMALL=STREAMSHIM_RING_KIB=256
A=${SOFTROCE_ADDR_A:-198.18.0.1}
B=${SOFTROCE_ADDR_B:-198.18.0.2}
OUT=${SOFTROCE_OUT:-$PWD}/bench
W=${TMPDIR:-/tmp}/bench
mkdir -p "$OUT" "$W" || exit 1
COUNT4=$((COUNT / 2))
[ "$COUNT4" -ge 1 ] || COUNT4=1
# Per process: a stuck run is killed, recorded as failed, and the bench goes on.
LIMIT=${LIMIT:-300}

say() { echo "rdma-bench: $*"; }

# The guest's CPU (jiffies) and a run's directory.
n=0
R=""
newrun() { # VARIANT REP PAIRS BYTES_PER_PAIR COUNT
	n=$((n + 1))
	R=$W/$(printf %03d "$n")-$1-r$2
	mkdir -p "$R"
	port=$((20000 + n * 20))
	printf 'variant=%s\nrep=%s\npairs=%s\nbytes_per_pair=%s\nsize=%s\ncount=%s\nport=%s\n' \
		"$1" "$2" "$3" "$4" "$SIZE" "$5" "$port" >"$R/meta"
	t_run=$(date +%s.%N)
}
stat_cpu() { head -1 /proc/stat >"$R/$1"; }
endrun() {
	cp -r "$R" "$OUT/" 2>/dev/null
	say "$(basename "$R") done in $(awk -v a="$t_run" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
}

# Readiness: a TCP listener on PORT; an rdma_cm listener on PORT (rsocket's, the shim's, perftest's).
wait_tcp() {
	for _ in $(seq 1 400); do
		ss -ltnH | grep -q ":$1 " && return 0
		sleep 0.05
	done
	echo "nothing listens on TCP port $1" >&2
	return 1
}
wait_cm() {
	for _ in $(seq 1 400); do
		rdma resource show cm_id 2>/dev/null | grep -q "state LISTEN.*:$1 " && return 0
		sleep 0.05
	done
	echo "no rdma_cm listener on port $1" >&2
	return 1
}

# The words in front of a shimmed command of ROLE (srv, cli, src, dst).
shimmed() {
	echo "env LD_PRELOAD=$SHIM STREAMSHIM_STATS=$R/$1-%p.json STREAMSHIM_NEGOTIATE_MS=$NEGOTIATE_MS STREAMSHIM_LOG=info"
}

# run_bg NAME WORDS...: runs WORDS in the background under rdma_tool run (times, CPU), its
# output in $R/NAME.{ru,out,err}; servers (NAME srv*) go to srv_pids, the rest to cli_pids.
srv_pids=()
cli_pids=()
run_bg() {
	local name=$1
	shift
	# Unquoted on purpose: the shimmed words split into arguments (none has a space).
	# shellcheck disable=SC2068
	timeout -k 2 "$LIMIT" "$TOOL" run "$R/$name.ru" $@ >"$R/$name.out" 2>"$R/$name.err" &
	case $name in
	srv*) srv_pids+=("$!") ;;
	*) cli_pids+=("$!") ;;
	esac
}
# Sends SIG to PID and all its descendants.
kill_tree() { # PID SIG
	local c
	for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do kill_tree "$c" "$2"; done
	kill "-$2" "$1" 2>/dev/null
}
# Waits for the clients, then gives each server GRACE seconds to end by itself before SIGTERM
# (passed on by timeout and rdma_tool run), and 5 more before SIGKILL of its whole tree (what
# was still there is in $R/stuck).
finish() { # GRACE
	local pid t
	for pid in "${cli_pids[@]}"; do wait "$pid"; done
	for pid in "${srv_pids[@]}"; do
		for ((t = 0; t < $1 * 10; t++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			kill -TERM "$pid"
			for ((t = 0; t < 50; t++)); do
				kill -0 "$pid" 2>/dev/null || break
				sleep 0.1
			done
			if kill -0 "$pid" 2>/dev/null; then
				ps -eo pid,ppid,stat,wchan:32,args >>"$R/stuck"
				kill_tree "$pid" KILL
			fi
		fi
		wait "$pid"
	done
	srv_pids=()
	cli_pids=()
}

# ---------------------------------------------------------------------------------------------
# Throughput: PAIRS concurrent streams of one kind.
#   kind: tcp (rstream -T s), shim (rstream -T s, both ends shimmed), shimsmall (the same with
#         256 KiB rings: $SMALL), rsocket (rstream): PAIRS
#         pairs of processes, pair i on BASE+i; verbs (ib_write_bw -R): one pair of processes
#         with PAIRS queue pairs (-q): 4 perftest processes busy-polling on 2 vCPUs starve each
#         other and rxe, and their clock calibration fails (below)
# All rstream kinds use blocking calls (-T b): by default rstream spins on non-blocking calls.
pairs() { # KIND PAIRS COUNT BASE
	local kind=$1 np=$2 count=$3 base=$4 i p procs=$2
	local rflags="-S $SIZE -C $count -T b"
	local wflags="-R -s $SIZE -n $((2 * count)) -q $np"
	[ "$kind" = verbs ] && procs=1
	sed -i '/^procs=/d' "$R/meta" && echo "procs=$procs" >>"$R/meta"
	stat_cpu stat0
	for ((i = 0; i < procs; i++)); do
		p=$((base + i))
		case $kind in
		tcp) run_bg "srv$i" rstream -b "$A" -p "$p" $rflags -T s ;;
		shim) run_bg "srv$i" "$(shimmed srv)" rstream -b "$A" -p "$p" $rflags -T s ;;
		shimsmall) run_bg "srv$i" "$(shimmed srv) $SMALL" rstream -b "$A" -p "$p" $rflags -T s ;;
		rsocket) run_bg "srv$i" rstream -b "$A" -p "$p" $rflags ;;
		verbs) run_bg "srv$i" ib_write_bw -d rxea -p "$p" $wflags ;;
		esac
	done
	for ((i = 0; i < procs; i++)); do
		p=$((base + i))
		case $kind in
		tcp) wait_tcp "$p" ;;
		shim | shimsmall) wait_tcp "$p" && wait_cm "$p" ;;
		rsocket | verbs) wait_cm "$p" ;;
		esac
	done
	for ((i = 0; i < procs; i++)); do
		p=$((base + i))
		case $kind in
		tcp) run_bg "cli$i" rstream -s "$A" -b "$B" -p "$p" $rflags -T s ;;
		shim) run_bg "cli$i" "$(shimmed cli)" rstream -s "$A" -b "$B" -p "$p" $rflags -T s ;;
		shimsmall) run_bg "cli$i" "$(shimmed cli) $SMALL" rstream -s "$A" -b "$B" -p "$p" $rflags -T s ;;
		rsocket) run_bg "cli$i" rstream -s "$A" -b "$B" -p "$p" $rflags ;;
		verbs) run_bg "cli$i" ib_write_bw -d rxeb -p "$p" $wflags "$A" ;;
		esac
	done
	finish 30
	stat_cpu stat1
}

# pairs, and for perftest up to 3 attempts: it times itself with the TSC, calibrated against
# gettimeofday when it reports, and under TCG that calibration can fail ("Correlation
# coefficient r^2: ... < 0.9", "Can't produce a report"); each attempt on fresh ports.
throughput() { # KIND PAIRS COUNT
	local attempt
	for attempt in 1 2 3; do
		rm -f "$R"/srv* "$R"/cli*
		pairs "$1" "$2" "$3" $((port + (attempt - 1) * 4))
		[ "$1" = verbs ] || return
		grep -qs "Can't produce a report" "$R"/cli*.err || return
		echo "attempt $attempt: perftest could not calibrate its clock" >>"$R/retries"
		say "$(basename "$R"): perftest could not calibrate its clock (attempt $attempt of 3)"
	done
}

# iperf3 -P 4, plain or both ends shimmed.
iperf4() { # plain|shim
	local pre_s="" pre_c=""
	if [ "$1" = shim ]; then pre_s=$(shimmed srv) pre_c=$(shimmed cli); fi
	stat_cpu stat0
	run_bg srv0 "$pre_s" iperf3 -s -1 -B "$A" -p "$port"
	wait_tcp "$port" && { [ "$1" = plain ] || wait_cm "$port"; }
	run_bg cli0 "$pre_c" iperf3 -c "$A" -p "$port" -t "$IPERF_SECONDS" -P 4 -J
	finish 30
	stat_cpu stat1
}

# Connect latency: CONNECTS sequential connects, each with a 1-byte echo (after CONNECT_WARMUP),
# and 10 more round trips on the connection, to a server that echoes until an `x` and closes.
# kind: tcp, shim (both ends), shimsmall (both ends, 256 KiB rings), shimcold (both ends,
# STREAMSHIM_SPARE=0: every connect makes its RDMA connect), rsocket (both ends under
# librspreload)
connects() { # KIND
	local pre_s="" pre_c=""
	case $1 in
	shim) pre_s=$(shimmed srv) pre_c=$(shimmed cli) ;;
	shimsmall) pre_s="$(shimmed srv) $SMALL" pre_c="$(shimmed cli) $SMALL" ;;
	shimcold) pre_s=$(shimmed srv) pre_c="$(shimmed cli) STREAMSHIM_SPARE=0" ;;
	rsocket) pre_s="env LD_PRELOAD=$RSPRELOAD" pre_c="env LD_PRELOAD=$RSPRELOAD" ;;
	esac
	stat_cpu stat0
	run_bg srv0 "$pre_s" "$TOOL" server "$A" "$port"
	case $1 in
	tcp) wait_tcp "$port" ;;
	shim | shimsmall | shimcold) wait_tcp "$port" && wait_cm "$port" ;;
	rsocket) wait_cm "$port" ;;
	esac
	run_bg cli0 "$pre_c" "$TOOL" connlat "$A" "$port" "$CONNECTS" "$CONNECT_WARMUP"
	# The server runs until SIGTERM (then exit(0): the shim writes its stats).
	finish 0
	stat_cpu stat1
}

# Requests without keep-alive: nginx (master and 2 workers, as root; the workers run as
# nobody) serves a 1 KiB file; rdma_tool httpget makes HTTP_REQUESTS GETs (after 10 warm-up)
# one after the other, each on a new connection.
# kind: tcp, shim (nginx and the client shimmed), shimcold (the same, the client with
# STREAMSHIM_SPARE=0)
httpload() { # KIND
	local pre_s="" pre_c="" ngx=$R/ngx
	case $1 in
	shim) pre_s=$(shimmed srv) pre_c=$(shimmed cli) ;;
	shimcold) pre_s=$(shimmed srv) pre_c="$(shimmed cli) STREAMSHIM_SPARE=0" ;;
	esac
	mkdir -p "$ngx/www" && chmod 1777 "$R" && head -c 1024 /dev/urandom >"$ngx/www/k.bin"
	cat >"$ngx/nginx.conf" <<-EOF
		daemon off;
		master_process on;
		worker_processes 2;
		pid $ngx/nginx.pid;
		error_log $ngx/error.log info;
		events { worker_connections 256; }
		http {
		  access_log off;
		  client_body_temp_path $ngx/body;
		  proxy_temp_path $ngx/proxy;
		  fastcgi_temp_path $ngx/fastcgi;
		  uwsgi_temp_path $ngx/uwsgi;
		  scgi_temp_path $ngx/scgi;
		  server { listen $A:$port; root $ngx/www; }
		}
	EOF
	stat_cpu stat0
	run_bg srv0 "$pre_s" nginx -p "$ngx" -c "$ngx/nginx.conf" -e stderr
	wait_tcp "$port" && { [ "$1" = tcp ] || wait_cm "$port"; }
	run_bg cli0 "$pre_c" "$TOOL" httpget "$A" "$port" /k.bin "$HTTP_REQUESTS" 10
	# nginx runs until SIGTERM (its fast shutdown; the master's exit writes its stats, which
	# count its workers' upgraded connections).
	finish 0
	stat_cpu stat1
}

# A fresh connection's first FIRST_MIB MiB: rdma_tool first to rdma_tool sink, from socket()
# until the sink's byte count is back.
# kind: tcp, shim (both ends), rsocket (both ends under librspreload)
firstbytes() { # KIND
	local pre_s="" pre_c=""
	case $1 in
	shim) pre_s=$(shimmed srv) pre_c=$(shimmed cli) ;;
	rsocket) pre_s="env LD_PRELOAD=$RSPRELOAD" pre_c="env LD_PRELOAD=$RSPRELOAD" ;;
	esac
	stat_cpu stat0
	run_bg srv0 "$pre_s" "$TOOL" sink "$A" "$port"
	case $1 in
	tcp) wait_tcp "$port" ;;
	shim) wait_tcp "$port" && wait_cm "$port" ;;
	rsocket) wait_cm "$port" ;;
	esac
	run_bg cli0 "$pre_c" "$TOOL" first "$A" "$port" $((FIRST_MIB << 20))
	finish 0
	stat_cpu stat1
}

# A QEMU live migration of MIGRATION_MIB of random RAM (tests/tools/qemu_migrate.py, single
# stream, no RAM check: the scenarios check the bytes), plain or both QEMUs shimmed.
migrate() { # plain|shim
	local extra=()
	if [ "$1" = shim ]; then
		extra=(--env "LD_PRELOAD=$SHIM" --env "STREAMSHIM_NEGOTIATE_MS=$NEGOTIATE_MS"
			--src-env "STREAMSHIM_STATS=$R/src-%p.json" --dst-env "STREAMSHIM_STATS=$R/dst-%p.json")
	fi
	stat_cpu stat0
	timeout -k 2 "$LIMIT" "$TOOL" run "$R/cli0.ru" "$PY" "$MIGRATE" --workdir "$R/qemu" \
		--ram-file "$W/ram-${MIGRATION_MIB}M.bin" --ram-mib "$MIGRATION_MIB" --port "$port" \
		--listen "tcp:$A:$port" --timeout "$LIMIT" --no-verify "${extra[@]}" \
		>"$R/cli0.out" 2>"$R/cli0.err"
	rm -rf "$R/qemu"
	stat_cpu stat1
}

rotate() { # K WORDS...: WORDS rotated left by K
	local k=$1
	shift
	local a=("$@") i
	for ((i = 0; i < ${#a[@]}; i++)); do echo "${a[$(((i + k) % ${#a[@]}))]}"; done
}

say "start: $REPS repetitions, $SIZE-byte transfers, $COUNT each way (1 stream), $COUNT4 per pair (4 pairs), $CONNECTS connects, $HTTP_REQUESTS requests without keep-alive, a fresh connection's first $FIRST_MIB MiB, $MIGRATIONS migrations of $MIGRATION_MIB MiB; $(nproc) cpus"
for ((rep = 0; rep < REPS; rep++)); do
	for v in $(rotate "$rep" tcp1 shim1 shimsmall1 rsocket1 verbs1); do
		newrun "$v" "$rep" 1 $((2 * SIZE * COUNT)) "$COUNT"
		throughput "${v%1}" 1 "$COUNT"
		endrun
	done
	for v in $(rotate "$rep" tcp4 shim4 shimsmall4 rsocket4 verbs4 iperf4 iperf4shim); do
		case $v in
		iperf4) newrun "$v" "$rep" 1 0 0 && iperf4 plain ;;
		iperf4shim) newrun "$v" "$rep" 1 0 0 && iperf4 shim ;;
		*)
			newrun "$v" "$rep" 4 $((2 * SIZE * COUNT4)) "$COUNT4"
			throughput "${v%4}" 4 "$COUNT4"
			;;
		esac
		endrun
	done
	for v in $(rotate "$rep" conntcp connshim connshimsmall connshimcold connrsocket); do
		newrun "$v" "$rep" 1 0 0
		connects "${v#conn}"
		endrun
	done
	for v in $(rotate "$rep" httptcp httpshim httpshimcold); do
		newrun "$v" "$rep" 1 0 "$HTTP_REQUESTS"
		httpload "${v#http}"
		endrun
	done
	for v in $(rotate "$rep" firsttcp firstshim firstrsocket); do
		newrun "$v" "$rep" 1 $((FIRST_MIB << 20)) 1
		firstbytes "${v#first}"
		endrun
	done
	if [ "$rep" -lt "$MIGRATIONS" ]; then
		for v in $(rotate "$rep" migplain migshim); do
			newrun "$v" "$rep" 1 $((MIGRATION_MIB << 20)) 0
			migrate "${v#mig}"
			endrun
		done
	fi
done
say "done"
