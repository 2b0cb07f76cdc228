"""N connections, one line each; prints each connection's own address and the answer:
`ADDR:PORT ANSWER`.

    python3 line_client.py HOST PORT N
"""

import socket
import sys

host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    with socket.create_connection((host, port), timeout=60) as s, s.makefile("rwb") as f:
        me = "%s:%d" % s.getsockname()[:2]
        f.write(b"hello %d\n" % i)
        f.flush()
        print(me, f.readline().decode().strip(), flush=True)
