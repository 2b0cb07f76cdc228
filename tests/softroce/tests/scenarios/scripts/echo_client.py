"""N connections (default 1) one after another, each echoing 256 KiB of random bytes (checked);
prints `echo ok connect_s T1 ...`, how long each connect() took.

    python3 echo_client.py HOST PORT [N]
"""

import os, socket, sys, time

host, port = sys.argv[1], int(sys.argv[2])
n = int(sys.argv[3]) if len(sys.argv) > 3 else 1
times = []
for _ in range(n):
    data = os.urandom(256 << 10)
    s = socket.socket()  # the shim's once-per-process decision happens here, not in connect()
    t0 = time.time()
    s.connect((host, port))
    times.append(time.time() - t0)
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    got = bytearray()
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
    s.close()
    assert bytes(got) == data, (len(got), len(data))
print("echo ok connect_s " + " ".join("%.3f" % t for t in times))
