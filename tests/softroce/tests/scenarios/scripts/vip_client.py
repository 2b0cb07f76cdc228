"""N connections one after another, each echoing 64 KiB of random bytes (checked); prints how
long each connect() took: `connect_s T1 T2 ...`.

    python3 vip_client.py HOST PORT N
"""

import os
import socket
import sys
import time

host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
times = []
for _ in range(n):
    s = socket.socket()
    t0 = time.monotonic()
    s.connect((host, port))
    times.append(time.monotonic() - t0)
    data = os.urandom(64 << 10)
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
print("connect_s " + " ".join("%.3f" % t for t in times), flush=True)
