"""An echo server that listens at once and accepts its one connection only once GATE exists
(a cue from the scenario): a server that accepts late, for as long as the scenario needs.

    python3 gated_echo.py HOST PORT GATE
"""

import os, socket, sys, time

host, port, gate = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((host, port))
ls.listen(16)
deadline = time.time() + 120
while not os.path.exists(gate):
    assert time.time() < deadline, "no gate within 120 s"
    time.sleep(0.05)
c, _ = ls.accept()
with c:
    while True:
        b = c.recv(65536)
        if not b:
            break
        c.sendall(b)
