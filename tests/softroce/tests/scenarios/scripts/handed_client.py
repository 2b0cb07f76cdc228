"""N HTTP/1.0 requests, one connection each; prints each connection's own address and the
answer's body: `ADDR:PORT BODY`. Then one request for /reset on a connection it resets 1 s
later (`SO_LINGER {1, 0}`).

    python3 handed_client.py HOST PORT N
"""

import socket
import struct
import sys
import time

host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for _ in range(n):
    with socket.create_connection((host, port), timeout=60) as s:
        me = s.getsockname()
        s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    body = data.split(b"\r\n\r\n", 1)[1].decode().strip()
    print(f"{me[0]}:{me[1]} {body}", flush=True)

with socket.create_connection((host, port), timeout=60) as s:
    s.sendall(b"GET /reset HTTP/1.0\r\nHost: x\r\n\r\n")
    time.sleep(1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
