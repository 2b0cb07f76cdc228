# A shimmed client's connections to one server over time, each a line echoed back byte for
# byte: one, another after 6 s (its spare has expired), one more at once (it takes the spare),
# then, once the file GO exists (the harness replaced the shimmed server by a plain one, whose
# going took the spare's RDMA connection with it), a last one. Prints each connect's time and
# the process's open fds at the start and the end, as JSON.
import json, os, socket, sys, time
host, port, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def fds():
    return len(os.listdir("/proc/self/fd"))

def one(i):
    msg = (b"spare %d;" % i) * 300
    t0 = time.monotonic()
    s = socket.create_connection((host, port))
    took = time.monotonic() - t0
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
    return took

start = fds()
times = [one(1)]
time.sleep(6)
times.append(one(2))
times.append(one(3))
print("ready", flush=True)
end = time.monotonic() + 60
while not os.path.exists(go):
    assert time.monotonic() < end, "no go"
    time.sleep(0.05)
time.sleep(1)
times.append(one(4))
print(json.dumps({"connect_seconds": times, "fds_start": start, "fds_end": fds()}))
