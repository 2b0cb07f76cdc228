import http.server, os, sys
d, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

class H(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def __init__(self, *a, **k):
        super().__init__(*a, directory=d, **k)
    def do_PUT(self):
        left = int(self.headers["Content-Length"])
        with open(os.path.join(d, self.path.lstrip("/")), "wb") as f:
            while left:
                b = self.rfile.read(min(left, 1 << 20))
                if not b:
                    break
                f.write(b)
                left -= len(b)
        self.send_response(201 if left == 0 else 400)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass

srv = http.server.HTTPServer((host, port), H)
for _ in range(n):
    srv.handle_request()
