import socket, sys, time
host, port, n, delay = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((host, port))
ls.listen(16)
time.sleep(delay)
for _ in range(n):
    c, _ = ls.accept()
    with c:
        while True:
            b = c.recv(65536)
            if not b:
                break
            c.sendall(b)
