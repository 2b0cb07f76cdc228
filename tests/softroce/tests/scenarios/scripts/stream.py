import os, socket, sys, time
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
chunk = os.urandom(1 << 16)
if mode in ("server-write", "server-read"):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((host, port))
    ls.listen(1)
    c, _ = ls.accept()
    s = c
else:
    s = socket.create_connection((host, port))
if mode in ("server-write", "client-write"):
    while True:
        s.sendall(chunk)
total = 0
marked = False
while True:
    try:
        b = s.recv(1 << 16)
    except OSError as e:
        print("ended", repr(e), time.time(), total, flush=True)
        break
    if not b:
        print("ended EOF", time.time(), total, flush=True)
        break
    total += len(b)
    if total >= (8 << 20) and not marked:
        print("flowing", time.time(), flush=True)
        marked = True
