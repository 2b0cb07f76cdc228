# The attack scenarios' apps (tests/softroce/tests/scenarios/attacks.rs): a server and its
# clients, unmodified Python sockets, run with or without the shim. Every result is one line.
#
#   server HOST PORT MODE N   accepts N connections one after another; MODE:
#       echo    reads what comes (to EOF, or 2 s quiet), answers b"reply-to:" + it
#       banner  sends b"220 banner\r\n" first, then as echo (30 s quiet)
#       sink    reads to the end (EOF or an error) and reports the bytes' sha256
#       line    reads a line, answers b"reply-to:" + it at once, then reads to the end
#     and prints per connection: "peer IP:PORT", then "read N SHA256 FIRST64" and "end eof" or
#     "end error ERRNO_NAME"
#   client HOST PORT BIND_IP BIND_PORT MODE   connects from BIND_IP:BIND_PORT (0: any port);
#       echo    sends b"VICTIM-DATA", prints "got " + the answer
#       banner  waits for the banner first ("banner after S s"), then as echo
#       line    sends b"VICTIM-DATA\n", prints "reply after S s: " + the answer's line
#       stream  sends SIZE bytes of a seeded pattern (env SIZE, default 8 MiB), SHUT_WR, reads the
#               echo, prints "sent SHA" and "echoed SHA N END"; env PAUSE_FILE: after half the
#               bytes, creates that file and waits PAUSE seconds (default 5); env PACE: sends
#               in 1 MiB pieces PACE seconds apart
#   stream-server HOST PORT N  echoes N concurrent connections back (threads), "closed" each
import errno, hashlib, os, socket, sys, threading, time


def pattern(n, seed=7):
    out = bytearray()
    block = hashlib.sha256(str(seed).encode()).digest() * 2048
    while len(out) < n:
        out += block
    return bytes(out[:n])


def say(*a):
    print(*a, flush=True)


def read_all(c, quiet=None):
    h = hashlib.sha256()
    got = b""
    total = 0
    c.settimeout(quiet)
    end = "eof"
    while True:
        try:
            b = c.recv(65536)
        except socket.timeout:
            end = "quiet"
            break
        except OSError as e:
            end = "error " + errno.errorcode.get(e.errno, str(e.errno))
            break
        if not b:
            break
        h.update(b)
        if len(got) < 64:
            got += b[: 64 - len(got)]
        total += len(b)
    return total, h.hexdigest(), got, end


def read_line(c, chunk):
    """Reads to a newline (or EOF), `chunk` bytes at most per recv (1: nothing past it)."""
    got = b""
    while not got.endswith(b"\n"):
        b = c.recv(chunk)
        if not b:
            break
        got += b
    return got


def server(host, port, mode, n):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((host, port))
    ls.listen(16)
    say("listening")
    for _ in range(n):
        c, peer = ls.accept()
        say("peer %s:%d" % peer[:2])
        if mode == "banner":
            c.sendall(b"220 banner\r\n")
        if mode == "line":
            c.sendall(b"reply-to:" + read_line(c, 1))
        quiet = {"sink": None, "echo": 2.0, "banner": 30.0, "line": 30.0}[mode]
        total, sha, first, end = read_all(c, quiet)
        say("read %d %s %r" % (total, sha, first))
        say("end " + end)
        if mode in ("echo", "banner"):
            try:
                c.sendall(b"reply-to:" + first)
            except OSError as e:
                say("answer error " + errno.errorcode.get(e.errno, str(e.errno)))
        c.close()


def stream_server(host, port, n):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((host, port))
    ls.listen(64)
    say("listening")

    def one(c):
        try:
            while True:
                b = c.recv(65536)
                if not b:
                    break
                c.sendall(b)
            c.shutdown(socket.SHUT_WR)
        except OSError as e:
            say("stream error " + errno.errorcode.get(e.errno, str(e.errno)))
        c.close()
        say("closed")

    threads = []
    for _ in range(n):
        c, _ = ls.accept()
        t = threading.Thread(target=one, args=(c,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()


def client(host, port, bind_ip, bind_port, mode):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((bind_ip, bind_port))
    t0 = time.time()
    s.connect((host, port))
    say("connected in %.3f s from %s:%d" % ((time.time() - t0,) + s.getsockname()[:2]))
    if mode == "banner":
        s.settimeout(60)
        b = s.recv(64)
        say("banner after %.2f s: %r" % (time.time() - t0, b))
    if mode == "line":
        s.sendall(b"VICTIM-DATA\n")
        s.settimeout(60)
        got = read_line(s, 4096)
        say("reply after %.3f s: %r" % (time.time() - t0, got))
    if mode in ("echo", "banner"):
        s.sendall(b"VICTIM-DATA")
        s.shutdown(socket.SHUT_WR)
        s.settimeout(60)
        got = b""
        while True:
            b = s.recv(4096)
            if not b:
                break
            got += b
        say("got %r" % got)
    elif mode == "stream":
        data = pattern(int(os.environ.get("SIZE", 8 << 20)))
        say("sent " + hashlib.sha256(data).hexdigest())

        pause_file = os.environ.get("PAUSE_FILE")
        pace = float(os.environ.get("PACE", "0"))

        def send():
            if pause_file:
                half = len(data) // 2
                s.sendall(data[:half])
                open(pause_file, "w").close()
                time.sleep(float(os.environ.get("PAUSE", "5")))
                s.sendall(data[half:])
            elif pace:
                for i in range(0, len(data), 1 << 20):
                    s.sendall(data[i : i + (1 << 20)])
                    time.sleep(pace)
            else:
                s.sendall(data)
            s.shutdown(socket.SHUT_WR)

        t = threading.Thread(target=send)
        t.start()
        total, sha, _, end = read_all(s)
        t.join()
        say("echoed %s %d %s" % (sha, total, end))


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "server":
        server(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
    elif mode == "stream-server":
        stream_server(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        client(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6])
