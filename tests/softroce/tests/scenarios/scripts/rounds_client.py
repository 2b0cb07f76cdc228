"""N connections (default 1) one after another, each exchanging 64 KiB requests of random bytes
with an echo server for SECONDS (default 1), each echo checked, then ending its side and reading
to EOF; prints `connected PORT` once each is connected (its local port), and at the end
`rounds ok connect_s T1 ... rounds R1 ...`, how long each connect() took and how many requests
each connection made.

    python3 rounds_client.py HOST PORT [N [SECONDS]]
"""

import os, socket, sys, time

host, port = sys.argv[1], int(sys.argv[2])
n = int(sys.argv[3]) if len(sys.argv) > 3 else 1
seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
times, rounds = [], []
for _ in range(n):
    s = socket.socket()  # the shim's once-per-process decision happens here, not in connect()
    t0 = time.time()
    s.connect((host, port))
    times.append(time.time() - t0)
    print("connected %d" % s.getsockname()[1], flush=True)
    count = 0
    while count == 0 or time.time() - t0 < seconds:
        data = os.urandom(64 << 10)
        s.sendall(data)
        got = bytearray()
        while len(got) < len(data):
            b = s.recv(len(data) - len(got))
            assert b, "EOF in the middle of an echo"
            got += b
        assert bytes(got) == data, "a wrong echo"
        count += 1
    rounds.append(count)
    s.shutdown(socket.SHUT_WR)
    assert s.recv(1) == b"", "bytes after the last echo"
    s.close()
print("rounds ok connect_s " + " ".join("%.3f" % t for t in times)
      + " rounds " + " ".join(str(r) for r in rounds))
