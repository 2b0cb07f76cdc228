# 64 connections carried at once, 2 MiB each way, checked by sha256 (the scenario's programs;
# concurrent_loop.sh runs them in a loop). server HOST PORT N [waitall] | client HOST PORT N
# [vectored]: with `vectored` each client thread connects and at once sends its bytes with
# sendmsg and writev of three buffers each, in turn (its first bytes go before the move).
import hashlib, os, socket, socketserver, sys, threading
mode, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
flags = socket.MSG_WAITALL if sys.argv[5:] == ["waitall"] else 0
vectored = sys.argv[5:] == ["vectored"]
SIZE = 2 << 20

if mode == "server":
    class H(socketserver.BaseRequestHandler):
        def handle(self):
            h = hashlib.sha256()
            while True:
                b = self.request.recv(65536, flags)
                if not b:
                    break
                h.update(b)
                self.request.sendall(b)
    class S(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = False
        request_queue_size = 128
    with S((host, port), H) as s:
        for _ in range(n):
            s.handle_request()
        s.server_close()
        for t in threading.enumerate():
            if t is not threading.current_thread():
                t.join()
    sys.exit(0)

errors = []
# Connected one after another, then all carried at once: 64 connects in the same instant make
# the engines set up 64 RDMA connections back to back, which on a loaded TCG host can outlast
# the negotiation bound (a timing limit, not what this test is about).
socks = [] if vectored else [socket.create_connection((host, port)) for _ in range(n)]

def send_vectored(s, data):
    view, turn = memoryview(data), 0
    while view:
        third = max(1, len(view) // 3)
        bufs = [view[:third], view[third:2 * third], view[2 * third:]]
        if turn % 2 == 0:
            sent = s.sendmsg(bufs)
        else:
            sent = os.writev(s.fileno(), bufs)
        view, turn = view[sent:], turn + 1

def one(i):
    try:
        data = os.urandom(SIZE)
        s = socket.create_connection((host, port)) if vectored else socks[i]
        def send():
            if vectored:
                send_vectored(s, data)
            else:
                s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        t = threading.Thread(target=send)
        t.start()
        h = hashlib.sha256()
        got = 0
        while True:
            b = s.recv(65536)
            if not b:
                break
            h.update(b)
            got += len(b)
        t.join()
        s.close()
        if h.digest() != hashlib.sha256(data).digest():
            errors.append(f"connection {i}: {got} bytes, sha256 differs")
    except Exception as e:
        errors.append(f"connection {i}: {e!r}")
threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("errors", len(errors), errors[:5])
sys.exit(1 if errors else 0)
