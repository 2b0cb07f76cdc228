import json, os, socket, sys, time
host, port, n, server = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def res(pid):
    st = open(f"/proc/{pid}/status").read()
    field = lambda k: int(next(l.split()[1] for l in st.splitlines() if l.startswith(k + ":")))
    return {"fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": field("Threads"),
            "vmpin_kib": field("VmPin")}

def one(i):
    msg = (b"%d:" % i) * 40
    s = socket.create_connection((host, port))
    s.sendall(msg)
    s.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
    s.close()
    assert got == msg, (i, len(got), len(msg))

def settle(pid_list, target=None):
    # The engines finish each stream's teardown (FIN both ways, then a CM disconnect) a
    # little after the app's close: wait (at most 30 s) until nothing is pinned and the counts
    # are back at `target`, or, without one, hold still for a second.
    last, still = None, 0
    for _ in range(150):
        now = [res(p) for p in pid_list]
        if all(r["vmpin_kib"] == 0 for r in now):
            if target is not None and now == target:
                return
            still = still + 1 if now == last else 0
            if target is None and still >= 5:
                return
        last = now
        time.sleep(0.2)

def fds_of(pid):
    out = []
    for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
        try:
            out.append("%s -> %s" % (fd, os.readlink(f"/proc/{pid}/fd/{fd}")))
        except OSError:
            pass
    return out

me = os.getpid()
start = {"client": res(me), "server": res(server)}
one(0)
settle([me, server])
before = {"client": res(me), "server": res(server)}
t0 = time.time()
for i in range(1, n + 1):
    one(i)
elapsed = time.time() - t0
settle([me, server], [before["client"], before["server"]])
after = {"client": res(me), "server": res(server)}
if after != before:
    print("fds of the server:", fds_of(server), file=sys.stderr)
    print("fds of the client:", fds_of(me), file=sys.stderr)
one(n + 1)  # the last one lets the server finish (and write its stats) after the measurement
print(json.dumps({"start": start, "before": before, "after": after, "seconds": elapsed}))
