# A pre-fork echo server: the parent listens, forked children accept (each until no connection
# comes for 10 s). Mode `shared`: one listening socket for both children (Apache prefork,
# gunicorn); `reuseport`: one SO_REUSEPORT socket per child, all opened in the parent (nginx's
# `reuseport`). Each child first makes a connection of its own to an echo backend (a worker's
# connection to its database) and checks 256 KiB come back exactly, then reports what it
# served and how many connections ended in a reset.
import os, socket, sys
host, port, mode, backend = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])


def backend_echo():
    data = os.urandom(256 << 10)
    s = socket.create_connection((host, backend))
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
    print("child backend ok", flush=True)


def listener():
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if mode == "reuseport":
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    ls.bind((host, port))
    ls.listen(64)
    ls.settimeout(10.0)
    return ls


shared = listener() if mode == "shared" else None
kids = []
for ls in [shared or listener() for _ in range(2)]:
    pid = os.fork()
    if pid == 0:
        backend_echo()
        served = resets = 0
        while True:
            try:
                c, _ = ls.accept()
            except socket.timeout:
                break
            c.settimeout(None)
            with c:
                try:
                    while True:
                        b = c.recv(65536)
                        if not b:
                            break
                        c.sendall(b)
                except ConnectionResetError:
                    resets += 1
            served += 1
        print("child served %d resets %d" % (served, resets), flush=True)
        sys.exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print("parent done", flush=True)
