#!/usr/bin/env python3
"""hashcli.py MIB HOST:PORT [HOST:PORT..]: one connection per address, all in parallel, each
sending MIB MiB of random bytes then EOF; prints "<addr> <server's peer ip> <match>" per
connection and "matched=N". IPv6: [ADDR]:PORT."""
import hashlib, os, socket, sys, threading

mib = int(sys.argv[1])
results = {}


def one(i, addr):
    host, port = addr.rsplit(":", 1)
    host = host.strip("[]")
    data = os.urandom(mib << 20)
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    r = b""
    while True:
        x = s.recv(256)
        if not x:
            break
        r += x
    peer, digest = r.decode().split()
    results[i] = (addr, peer, digest == hashlib.sha256(data).hexdigest())


threads = [threading.Thread(target=one, args=(i, a)) for i, a in enumerate(sys.argv[2:])]
for t in threads:
    t.start()
for t in threads:
    t.join()
for i in sorted(results):
    print(*results[i])
print(f"matched={sum(1 for r in results.values() if r[2])}")
