# A pre-fork echo server: the parent listens, forked children accept (each until the file
# argv[6] exists: no idle timer, which a loaded guest's slow client start could outlast).
# Mode `shared`: one listening socket for both children (Apache prefork, gunicorn); `reuseport`:
# one SO_REUSEPORT socket per child, all opened in the parent (nginx's `reuseport`). Each child
# first makes a connection of its own to an echo backend (a worker's connection to its
# database) with the echo client (the path in argv[5], run in the child, without exec), then
# reports what it served and how many connections ended in a reset.
import os, runpy, socket, sys
host, port, mode, backend, client, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]


def listener():
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if mode == "reuseport":
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    ls.bind((host, port))
    ls.listen(64)
    ls.settimeout(0.2)
    return ls


shared = listener() if mode == "shared" else None
kids = []
for ls in [shared or listener() for _ in range(2)]:
    pid = os.fork()
    if pid == 0:
        sys.argv = [client, host, backend]
        runpy.run_path(client, run_name="__main__")
        sys.stdout.flush()
        served = resets = 0
        while not os.path.exists(stop):
            try:
                c, _ = ls.accept()
            except socket.timeout:
                continue
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
