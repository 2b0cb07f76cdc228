import os, selectors, socket, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sel = selectors.DefaultSelector()
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((host, port))
ls.listen(128)
ls.setblocking(False)
sel.register(ls, selectors.EVENT_READ)
done = 0
while done < n:
    for key, _ in sel.select():
        s = key.fileobj
        if s is ls:
            c, _ = ls.accept()
            c.setblocking(False)
            sel.register(c, selectors.EVENT_READ)
            continue
        try:
            b = s.recv(65536)
        except BlockingIOError:
            continue
        if b:
            s.setblocking(True)
            s.sendall(b)
            s.setblocking(False)
        else:
            sel.unregister(s)
            s.close()
            done += 1
