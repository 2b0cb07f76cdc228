import socketserver, sys, threading
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
class H(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            b = self.request.recv(65536)
            if not b:
                break
            self.request.sendall(b)
class S(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = False
with S((host, port), H) as s:
    for _ in range(n):
        s.handle_request()
    for t in threading.enumerate():
        if t is not threading.current_thread():
            t.join()
