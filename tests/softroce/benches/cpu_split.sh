#!/bin/bash
# Where the CPU goes with four rstream pairs at once, shim against rsocket, alternated in one
# Soft-RoCE guest: the whole guest's user, system and softirq time (/proc/stat: rxe's work that
# no process is charged for shows as softirq) and the rstream processes' time per thread kind
# (the app's main thread, the shim's engine thread `streamshim-io`, rsocket's CM service
# thread), user and system, each per GB moved (both ways, all pairs). A thread's last 0.2 s
# before it exits are not counted (it is sampled, not waited for).
# Run it with
#   cargo build --release -p rdma-streams-shim
#   cargo run -p rdma-streams-softroce --example guest -- -- bash "$PWD/tests/softroce/benches/cpu_split.sh"
# SHIM: the shim to use (default: target/release/libstreamshim.so of this checkout); REPS
# (default 2); COUNT transfers of 1 MiB each way per pair (default 32); SHIM_ENV: more
# variables for every shimmed run; KINDS: the runs of each rep, in turn (default
# "shim rsocket"; `shim/VAR=VALUE[,VAR=VALUE]` is a shimmed run with those variables too, for
# example KINDS="shim shim/STREAMSHIM_DIRECT_WRITE=0 rsocket"; `shim@PATH` a shimmed run with
# the library at PATH, for example another build's). Shimmed runs also print the share of the
# bytes read straight from the receive rings and written straight into the send rings. Every run
# prints what rxe's retry and error counters (`rdma statistic`) moved during it, and the other
# threads that took the most CPU per GB meanwhile (`ksoftirqd/N`: rxe's deferred work).
set -u
A=198.18.0.1
SHIM=${SHIM:-$(cd "$(dirname "$0")/../../.." && pwd)/target/release/libstreamshim.so}
REPS=${REPS:-2} COUNT=${COUNT:-32}
export STREAMSHIM_NEGOTIATE_MS=5000
ST=$(mktemp -d)
. "$(dirname "$0")/listening.sh"
wait_cm() { for _ in $(seq 1 100); do rdma resource show cm_id 2>/dev/null | grep -q "state LISTEN.*:$1 " && return 0; sleep 0.1; done; return 1; }

# The sampler: every 0.2 s the CPU ticks of every thread of every rstream process, the last
# reading of each thread kept; on SIGTERM the sums per thread kind, and /proc/stat's deltas.
cat >"$ST/sample.py" <<'EOF'
import os, re, signal, sys, time
def stat():
    f = open('/proc/stat').readline().split()[1:]
    return [int(x) for x in f]
s0 = stat()
last = {}
other = {}
stop = False
def term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, term)
while not stop:
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        try:
            if open(f'/proc/{pid}/comm').read().strip() != 'rstream':
                continue
            for tid in os.listdir(f'/proc/{pid}/task'):
                t = open(f'/proc/{pid}/task/{tid}/stat').read()
                name = t[t.index('(') + 1:t.rindex(')')]
                f = t[t.rindex(')') + 2:].split()
                kind = 'main' if tid == pid else name
                last[(pid, tid)] = (kind, int(f[11]), int(f[12]))
        except (OSError, ValueError):
            pass
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        try:
            if open(f'/proc/{pid}/comm').read().strip() == 'rstream':
                continue
            for tid in os.listdir(f'/proc/{pid}/task'):
                t = open(f'/proc/{pid}/task/{tid}/stat').read()
                f = t[t.rindex(')') + 2:].split()
                v = (t[t.index('(') + 1:t.rindex(')')], int(f[11]) + int(f[12]))
                other.setdefault((pid, tid), [v, v])[1] = v
        except (OSError, ValueError):
            pass
    time.sleep(0.2)
s1 = stat()
d = [b - a for a, b in zip(s0, s1)]
hz = os.sysconf('SC_CLK_TCK')
gb = float(sys.argv[1])
kinds = {}
for kind, u, s in last.values():
    k = kinds.setdefault(kind, [0, 0, 0])
    k[0] += u; k[1] += s; k[2] += 1
parts = [f'guest user {d[0]/hz/gb:.2f} sys {d[2]/hz/gb:.2f} irq {d[5]/hz/gb:.2f} softirq {d[6]/hz/gb:.2f} idle {d[3]/hz/gb:.2f}']
for kind, (u, s, n) in sorted(kinds.items()):
    parts.append(f'{kind} x{n} user {u/hz/gb:.2f} sys {s/hz/gb:.2f}')
others = {}
for (name, t0), (_, t1) in other.values():
    name = re.sub('[0-9]+', 'N', name)
    others[name] = others.get(name, 0) + t1 - t0
top = sorted(others.items(), key=lambda kv: -kv[1])[:3]
parts.append('others ' + ', '.join(f'{n} {t/hz/gb:.2f}' for n, t in top))
print('cpu-s/GB: ' + '; '.join(parts))
EOF

# share: "direct reads R, writes W" over the stats files in $ST/stats.
share() {
	python3 -c "import json,glob,sys
v=[json.load(open(f))['rdma_bytes'] for f in glob.glob(sys.argv[1]+'/*.json')]
t=lambda k: sum(x.get(k,0) for x in v)
print('direct reads %.3f, writes %.3f' % (t('direct')/max(1,t('received')), t('direct_written')/max(1,t('sent'))))" "$ST/stats"
}

# rxe's error and retry counters, summed over every link: "name value" lines.
counters() {
	rdma statistic show 2>/dev/null | tr ' ' '\n' | paste - - |
		awk '$1 ~ /^(duplicate_request|out_of_seq_request|rcvd_seq_err|completer_retry_err|retry_exceeded_err|rcvd_rnr_err|send_err)$/ { n[$1] += $2 } END { for (k in n) print k, n[k] }' | sort
}

# What the counters moved since $1 (a file of `counters` output): the nonzero ones.
moved() {
	counters | join -a 1 - "$1" | awk '{ d = $2 - ($3 == "" ? 0 : $3); if (d) printf "%s%s %d", (c++ ? ", " : ""), $1, d } END { if (!c) printf "none" }'
}

run4() { # KIND: shim, shim/VAR=VALUE[,VAR=VALUE], shim@PATH or rsocket
	local kind=$1 p port sps=() cps=() pre="" shim=0
	case $kind in
	shim) shim=1 ;;
	shim/* | shim@*) shim=1 ;;
	esac
	rm -rf "$ST/stats" && mkdir -p "$ST/stats"
	if [ $shim = 1 ]; then
		local so=$SHIM
		case $kind in shim@*) so=${kind#shim@} ;; esac
		pre="env LD_PRELOAD=$so STREAMSHIM_STATS=$ST/stats/ ${SHIM_ENV:-}"
		case $kind in shim/*) pre="$pre $(echo "${kind#shim/}" | tr , ' ')" ;; esac
	fi
	local flags="-S 1048576 -C $COUNT -T b"
	[ $shim = 1 ] && flags="$flags -T s"
	for p in 1 2 3 4; do
		port=$((base + p))
		$pre rstream -p $port $flags >/dev/null 2>&1 &
		sps+=($!)
		if [ $shim = 1 ]; then wait_port $port; else wait_cm $port; fi
	done
	gb=$(python3 -c "print(4*2*$COUNT*1048576/1e9)")
	counters >"$ST/counters"
	python3 "$ST/sample.py" "$gb" >"$ST/cpu" &
	local sampler=$!
	t0=$(date +%s.%N)
	for p in 1 2 3 4; do
		timeout 600 $pre rstream -s $A -p $((base + p)) $flags >/dev/null 2>&1 &
		cps+=($!)
	done
	wait "${cps[@]}"
	t1=$(date +%s.%N)
	kill -TERM $sampler
	wait $sampler
	wait "${sps[@]}"
	local shares=""
	[ $shim = 1 ] && shares="; $(share)"
	echo "$kind rep $rep: $(python3 -c "import sys;print('%.3f' % (float(sys.argv[3])*8/(float(sys.argv[2])-float(sys.argv[1]))))" "$t0" "$t1" "$gb") Gbit/s; $(cat "$ST/cpu")$shares; rxe counters moved: $(moved "$ST/counters")"
	base=$((base + 10))
}

base=5600
for rep in $(seq 1 "$REPS"); do
	for kind in ${KINDS:-shim rsocket}; do
		run4 "$kind"
	done
done
rm -rf "$ST"
