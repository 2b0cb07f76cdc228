#!/usr/bin/env python3
"""hashsrv.py IP PORT [PORT..]: for each connection, read to EOF, answer
"<peer ip> <sha256 hex>" and close. Prints "ready" once listening. IP may be IPv6."""
import hashlib, socket, sys, threading


def serve(c):
    peer = c.getpeername()[0]
    h = hashlib.sha256()
    while True:
        d = c.recv(1 << 18)
        if not d:
            break
        h.update(d)
    c.sendall(f"{peer} {h.hexdigest()}".encode())
    c.close()


def loop(s):
    while True:
        c, _ = s.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


ip = sys.argv[1]
for port in sys.argv[2:]:
    s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ip, int(port)))
    s.listen(64)
    threading.Thread(target=loop, args=(s,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
