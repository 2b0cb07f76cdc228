#!/usr/bin/env python3
"""Prints one connection of a `timeline.sh` trace: every system call (with its duration and
result), scheduler switch and wake-up of the client's and the server's threads, from the
client's `socket()` before its K-th kernel connect of a kept socket (a shim-owned fd, 512 or
above) to the read that returns its echo; times in ms from that `socket()`.

    python3 timeline.py TRACE [K]
"""
import re
import sys

# x86-64 system call numbers of the calls the shim and rdma_tool make.
NAMES = {
    0: "read", 1: "write", 3: "close", 7: "poll", 16: "ioctl", 20: "writev", 24: "sched_yield",
    33: "dup2", 39: "getpid", 41: "socket", 42: "connect", 43: "accept", 44: "sendto",
    45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 48: "shutdown", 49: "bind",
    51: "getsockname", 52: "getpeername", 53: "socketpair", 54: "setsockopt",
    55: "getsockopt", 72: "fcntl", 202: "futex", 228: "clock_gettime", 230: "clock_nanosleep",
    232: "epoll_wait", 233: "epoll_ctl", 262: "newfstatat", 271: "ppoll", 281: "epoll_pwait",
    288: "accept4", 290: "eventfd2", 292: "dup3", 318: "getrandom",
}
LINE = re.compile(r"^\s*(.+)-(\d+)\s+\[(\d+)\]\s+\S+\s+([\d.]+): (\S+): (.*)$")
SWITCH = re.compile(r"prev_comm=(\S+) prev_pid=(\d+) .*prev_state=(\S+) ==> next_comm=(\S+) next_pid=(\d+)")
WAKEUP = re.compile(r"comm=(\S+) pid=(\d+) .*target_cpu=(\d+)")


def main():
    path = sys.argv[1]
    k = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    events = []
    for line in open(path, encoding="utf-8", errors="replace"):
        m = LINE.match(line)
        if m:
            comm, pid, cpu, ts, kind, rest = m.groups()
            events.append((float(ts), comm, int(pid), int(cpu), kind, rest))
    # The client's kernel connects on its kept sockets: `connect(2xx, ...)` (hex fd >= 0x200).
    kept = [e for e in events if e[4] == "sys_enter" and re.match(r"NR 42 \(2[0-9a-f]{2},", e[5])]
    if len(kept) <= k:
        sys.exit(f"only {len(kept)} connects of a kept socket in the trace")
    at = kept[k][0]
    client = kept[k][2]
    start = max(e[0] for e in events
                if e[2] == client and e[4] == "sys_enter" and e[5].startswith("NR 41 ") and e[0] < at)
    end = next(e[0] for e in events
               if e[2] == client and e[0] > at and e[4] == "sys_exit"
               and re.match(r"NR (0|45) = 1$", e[5]))
    print(f"client thread {client}, connect {k}: socket() to echo {1000 * (end - start):.3f} ms, "
          f"kernel connect to echo {1000 * (end - at):.3f} ms")
    entered = {}
    for ts, comm, pid, cpu, kind, rest in events:
        if kind == "sys_enter":
            entered[pid] = (ts, rest)
        if not start <= ts <= end:
            continue
        t = 1000 * (ts - start)
        who = f"{comm[-14:]:>14}-{pid:<5}"
        if kind == "sys_exit":
            nr = int(rest.split()[1])
            began, args = entered.pop(pid, (None, ""))
            took = f"{1000 * (ts - began):7.3f}" if began is not None else "      ?"
            args = args.split("(", 1)[1][:36] if "(" in args else ""
            print(f"{t:8.3f} cpu{cpu} {who} {NAMES.get(nr, nr):>13} {took} ms ({args}) = {rest.rsplit('=', 1)[-1].strip()}")
        elif kind == "sched_switch" and (m := SWITCH.search(rest)):
            print(f"{t:8.3f} cpu{cpu} switch {m[1]}-{m[2]} ({m[3]}) -> {m[4]}-{m[5]}")
        elif kind == "sched_wakeup" and (m := WAKEUP.search(rest)):
            print(f"{t:8.3f} cpu{cpu} {who} wakes {m[1]}-{m[2]} on cpu{m[3]}")


if __name__ == "__main__":
    main()
