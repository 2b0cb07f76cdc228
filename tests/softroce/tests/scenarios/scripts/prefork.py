import os, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((host, port))
ls.listen(64)
ls.settimeout(20.0)
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        served = 0
        while True:
            try:
                c, _ = ls.accept()
            except socket.timeout:
                break
            c.settimeout(None)
            with c:
                while True:
                    b = c.recv(65536)
                    if not b:
                        break
                    c.sendall(b)
            served += 1
        os.write(1, ("child served %d\n" % served).encode())
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print("parent done", flush=True)
