import socket, sys, time
host, port, out, delay = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((host, port))
ls.listen(1)
c, _ = ls.accept()
time.sleep(delay)
with open(out, "wb") as f:
    while True:
        b = c.recv(16384)
        if not b:
            break
        f.write(b)
        time.sleep(0.002)
