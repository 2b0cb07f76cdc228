"""One of an SO_REUSEPORT group of separately started echo servers: answers each line with
`PID PEER LINE` (the peer as its socket names it) until the file STOP exists (no idle timer:
under a loaded TCG guest a client may start long after the server); then closes its listener,
writes `served N` to STOP.served and stdout, and exits once STOP.exit exists (the old instance
of a seamless reload lives on without its listener for a while).

    python3 reuseport_server.py HOST PORT STOP
"""

import os
import socket
import sys
import time

host, port, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
ls.bind((host, port))
ls.listen(64)
ls.settimeout(0.2)
served = 0
while not os.path.exists(stop):
    try:
        c, _ = ls.accept()
    except socket.timeout:
        continue
    c.settimeout(30)
    with c, c.makefile("rwb") as f:
        peer = "%s:%d" % c.getpeername()[:2]
        for line in f:
            f.write(b"%d %s %s" % (os.getpid(), peer.encode(), line))
            f.flush()
    served += 1
ls.close()
with open(stop + ".served", "w") as f:
    f.write("served %d\n" % served)
print("served %d" % served, flush=True)
deadline = time.monotonic() + 120
while not os.path.exists(stop + ".exit") and time.monotonic() < deadline:
    time.sleep(0.1)
