import http.server, sys
d, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
class H(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *a, **k):
        super().__init__(*a, directory=d, **k)
    def log_message(self, *a):
        pass
http.server.HTTPServer((host, port), H).handle_request()
