"""The differential probe of docs/shim-conformance.md: each row makes the same socket calls on
a fresh TCP connection and prints one line, `<row> <result>`; the suite runs it on plain TCP,
under the shim with the connection upgraded, and under the shim with it fallen back, and
compares the lines.

Usage: conformance.py HOST FIRST_PORT MODE [ROW ...]
  MODE upgraded: the server accepts in a thread before the client connects (the shim upgrades),
                 and the row starts MOVE_WAIT later, once the connection moved to its stream
                 (before, its first bytes go over TCP: an app cannot tell when it moves);
  MODE fallback: the client connects, and the server accepts FALLBACK_ACCEPT_AFTER later, in
                 one thread; under a negotiation bound shorter than that the shim's client
                 gets no CLAIM in time and the connection stays TCP (relayed by the client's
                 engine; the server's registration is gone when it accepts).
  Without the shim both modes are plain TCP. Each row listens on its own port (FIRST_PORT + i),
  so no row's fallback puts the next row's destination in the shim's negative cache.

A row is a function of (client, server) sockets, connected to each other, that returns a short
text: what the calls answered. A new row is one function in ROWS. A row may set up the client
socket and the listener before the connection exists (its `before_client` and `before_listener`
attributes, functions of the socket), and ask for the connect before the accept in both modes
(its `connect_first` attribute). A row whose connection the shim keeps on TCP by design
is listed, with its reason, in `STAYS_TCP` of the scenario (conformance.rs).
"""

import ctypes
import errno
import fcntl
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time

WAIT = 2.0  # seconds a row waits for bytes that should arrive
# Seconds between the connect and the accept in fallback mode (the host's own check of the
# probe, on plain TCP, shortens it).
FALLBACK_ACCEPT_AFTER = float(os.environ.get("CONFORMANCE_ACCEPT_AFTER", "1.0"))
# Seconds an upgraded pair waits for its move to the stream before its row runs.
MOVE_WAIT = 0.3
# How long the last pair's connect() took.
CONNECTED_IN = [0.0]


def err(e):
    return errno.errorcode.get(e.errno, str(e.errno))


def call(f):
    """f()'s result, or the errno name it raised."""
    try:
        return f()
    except OSError as e:
        return err(e)


def readable(s, timeout=WAIT):
    r, _, _ = select.select([s], [], [], timeout)
    return bool(r)


def exceptional(s, timeout=WAIT):
    _, _, x = select.select([], [], [s], timeout)
    return bool(x)


def recv_exact(s, n):
    got = b""
    s.settimeout(WAIT)
    try:
        while len(got) < n:
            b = s.recv(n - len(got))
            if not b:
                break
            got += b
    finally:
        s.settimeout(None)
    return got


def settle():
    """Lets bytes in flight arrive (a stream's engine, a kernel's loopback)."""
    time.sleep(0.3)


# === rows ===


def sendto_with_address(c, s):
    n = call(lambda: c.sendto(b"abc", s.getsockname()))
    return "%s %r" % (n, recv_exact(s, 3))


def sendmsg_with_address(c, s):
    n = call(lambda: c.sendmsg([b"abc"], [], 0, s.getsockname()))
    return "%s %r" % (n, recv_exact(s, 3))


def send_plain(c, s):
    n = call(lambda: c.send(b"abc"))
    return "%s %r" % (n, recv_exact(s, 3))


def sendmsg_scm_rights(c, s):
    r, w = os.pipe()
    try:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", r))]
        n = call(lambda: c.sendmsg([b"abc"], rights))
    finally:
        os.close(r)
        os.close(w)
    return "%s %r" % (n, recv_exact(s, 3))


def recv_peek(c, s):
    c.sendall(b"hello")
    settle()
    s.settimeout(WAIT)
    peek = s.recv(5, socket.MSG_PEEK)
    s.settimeout(None)
    return "%r %r" % (peek, recv_exact(s, 5))


def rcvtimeo(s, seconds):
    """A kernel receive timeout (a blocking socket stays blocking, unlike settimeout)."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", seconds, 0))


def recv_waitall(c, s):
    def later():
        time.sleep(0.2)
        c.sendall(b"world")

    t = threading.Thread(target=later)
    c.sendall(b"hello ")
    t.start()
    rcvtimeo(s, 4)
    got = call(lambda: s.recv(11, socket.MSG_WAITALL))
    t.join()
    return repr(got)


def recv_dontwait_empty(c, s):
    return call(lambda: s.recv(10, socket.MSG_DONTWAIT))


def recv_trunc(c, s):
    c.sendall(b"abcdef")
    settle()
    rcvtimeo(s, 2)
    b = bytearray(3)
    n = call(lambda: s.recv_into(b, 3, socket.MSG_TRUNC))
    return "%s %r %r" % (n, bytes(b), recv_exact(s, 3))


def recvmsg_and_readv(c, s):
    c.sendall(b"abcdef")
    settle()
    s.settimeout(WAIT)
    data, anc, flags, addr = s.recvmsg(3)
    s.settimeout(None)
    b = bytearray(3)
    n = os.readv(s.fileno(), [b])
    return "%r %r %d %r %d %r" % (data, anc, flags, addr, n, bytes(b))


def fionread(c, s):
    c.sendall(b"12345")
    settle()
    n = fcntl.ioctl(s.fileno(), termios.FIONREAD, b"\0\0\0\0")
    return str(struct.unpack("i", n)[0])


def rcvlowat_readiness(c, s):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 4)
    c.sendall(b"ab")
    settle()
    early = readable(s, 0.5)
    c.sendall(b"cd")
    settle()
    return "%s %s" % (early, readable(s))


def blocking_reads_wait(c, s):
    """Blocking `recv` and `read` on an empty connection while bytes arrive, a receive timeout
    with nothing sent, then EOF."""
    data = bytes(range(256)) * 12

    def later():
        time.sleep(0.3)
        c.sendall(data[:1000])
        time.sleep(0.3)
        c.sendall(data[1000:])

    t = threading.Thread(target=later)
    t.start()
    rcvtimeo(s, 4)
    got = call(lambda: s.recv(65536))
    first = isinstance(got, bytes) and 0 < len(got) and got == data[: len(got)]
    rest = b""
    while isinstance(got, bytes) and len(got) + len(rest) < len(data):
        b = call(lambda: os.read(s.fileno(), 65536))
        if not isinstance(b, bytes) or not b:
            break
        rest += b
    t.join()
    whole = isinstance(got, bytes) and got + rest == data
    rcvtimeo(s, 1)
    timeout = call(lambda: s.recv(10))
    c.shutdown(socket.SHUT_WR)
    eof = call(lambda: os.read(s.fileno(), 10))
    return "%s %s %s %r" % (first, whole, timeout, eof)


def rcvlowat_blocking_reads(c, s):
    """Blocking reads under a low-water mark: of bytes queued at the mark, then `MSG_WAITALL`
    while bytes arrive below the mark and then past it (and whether it returned before its
    receive timeout)."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 4)
    c.sendall(b"ab")
    c.sendall(b"cd")
    settle()
    rcvtimeo(s, 20)
    first = call(lambda: s.recv(10))

    def later():
        time.sleep(0.3)
        c.sendall(b"ef")
        time.sleep(0.3)
        c.sendall(b"ghijkl")

    t = threading.Thread(target=later)
    t.start()
    start = time.monotonic()
    rest = call(lambda: s.recv(6, socket.MSG_WAITALL))
    t.join()
    return "%r %r %s" % (first, rest, time.monotonic() - start < 20)


def urgent_byte(c, s):
    n = call(lambda: c.send(b"!", socket.MSG_OOB))
    settle()
    x = exceptional(s)
    rcvtimeo(s, 2)
    oob = call(lambda: s.recv(1, socket.MSG_OOB | socket.MSG_DONTWAIT))
    return "%s %s %r" % (n, x, oob)


def urgent_mark_and_fionread(c, s):
    c.send(b"!", socket.MSG_OOB)
    c.sendall(b"12345")
    settle()
    n = fcntl.ioctl(s.fileno(), termios.FIONREAD, b"\0\0\0\0")
    return str(struct.unpack("i", n)[0])


def shutdown_write(c, s):
    c.sendall(b"bye")
    c.shutdown(socket.SHUT_WR)
    got = recv_exact(s, 3)
    s.settimeout(WAIT)
    eof = s.recv(10)
    s.settimeout(None)
    s.sendall(b"back")
    return "%r %r %r" % (got, eof, recv_exact(c, 4))


def shutdown_read(c, s):
    c.shutdown(socket.SHUT_RD)
    c.settimeout(WAIT)
    got = call(lambda: c.recv(10))
    c.settimeout(None)
    return repr(got)


def close_then_peer_reads_eof(c, s):
    c.sendall(b"last")
    c.close()
    got = recv_exact(s, 4)
    s.settimeout(WAIT)
    eof = call(lambda: s.recv(10))
    s.settimeout(None)
    return "%r %r" % (got, eof)


def close_with_reset(c, s):
    c.sendall(b"last")
    settle()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
    settle()
    s.settimeout(WAIT)
    first = call(lambda: s.recv(10))
    then = call(lambda: s.recv(10))
    s.settimeout(None)
    return "%r %r" % (first, then)


def getpeername_after_reset(c, s):
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
    settle()
    return str(call(lambda: s.getpeername() and "ok"))


def write_after_peer_closed(c, s):
    s.close()
    settle()
    first = call(lambda: c.send(b"x"))
    settle()
    second = call(lambda: c.send(b"x", socket.MSG_NOSIGNAL))
    return "%s %s" % (first, second)


def socket_identity(c, s):
    opts = [socket.SO_DOMAIN, socket.SO_TYPE, socket.SO_PROTOCOL, socket.SO_ACCEPTCONN]
    return " ".join(str(c.getsockopt(socket.SOL_SOCKET, o)) for o in opts)


def so_error_and_keepalive(c, s):
    c.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    return "%d %d" % (
        c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR),
        c.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
    )


def tcp_options(c, s):
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 5000)
    info = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    return "%d %d state=%d" % (
        c.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY),
        c.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
        info[0],
    )


def names(c, s):
    return "%s %s" % (c.getpeername() == s.getsockname(), s.getpeername() == c.getsockname())


def poll_rdhup(c, s):
    p = select.poll()
    p.register(s, select.POLLIN | select.POLLRDHUP)
    c.shutdown(socket.SHUT_WR)
    settle()
    events = p.poll(int(WAIT * 1000))
    return str(sorted(ev for _, ev in events))


def epoll_edge_triggered(c, s):
    ep = select.epoll()
    try:
        ep.register(s, select.EPOLLIN | select.EPOLLET)
        c.sendall(b"one")
        first = ep.poll(WAIT)
        again = ep.poll(0.3)
        c.sendall(b"two")
        third = ep.poll(WAIT)
        return "%d %d %d %r" % (len(first), len(again), len(third), recv_exact(s, 6))
    finally:
        ep.close()


def nonblocking_empty(c, s):
    s.setblocking(False)
    got = call(lambda: s.recv(10))
    s.setblocking(True)
    return str(got)


def send_more_and_nosignal(c, s):
    a = c.send(b"ab", socket.MSG_MORE)
    b = c.send(b"cd", socket.MSG_NOSIGNAL)
    return "%d %d %r" % (a, b, recv_exact(s, 4))


def sendmsg_iov_and_writev(c, s):
    a = c.sendmsg([b"ab", b"cd"])
    b = os.writev(c.fileno(), [b"ef", b"gh"])
    return "%d %d %r" % (a, b, recv_exact(s, 8))


def sendfile_to_socket(c, s):
    r, w = os.pipe()
    path = "/tmp/conformance-sendfile-%d" % os.getpid()
    with open(path, "wb") as f:
        f.write(b"0123456789")
    try:
        with open(path, "rb") as f:
            n = call(lambda: os.sendfile(c.fileno(), f.fileno(), 2, 5))
    finally:
        os.unlink(path)
        os.close(r)
        os.close(w)
    return "%s %r" % (n, recv_exact(s, 5))


def splice_from_socket(c, s):
    c.sendall(b"spliced")
    settle()
    r, w = os.pipe()
    try:
        n = call(lambda: os.splice(s.fileno(), w, 7))
        got = os.read(r, 7) if isinstance(n, int) and n > 0 else b""
    finally:
        os.close(r)
        os.close(w)
    return "%s %r" % (n, got)


def copy_file_range_from_socket(c, s):
    c.sendall(b"abc")
    settle()
    path = "/tmp/conformance-cfr-%d" % os.getpid()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        n = call(lambda: os.copy_file_range(s.fileno(), fd, 3))
    finally:
        os.close(fd)
        os.unlink(path)
    return "%s %r" % (n, recv_exact(s, 3))


def shutdown_both(c, s):
    c.shutdown(socket.SHUT_RDWR)
    s.settimeout(WAIT)
    eof = call(lambda: s.recv(10))
    s.settimeout(None)
    after = call(lambda: c.send(b"x", socket.MSG_NOSIGNAL))
    return "%r %s" % (eof, after)


def close_with_linger_timeout(c, s):
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 1))
    c.sendall(b"last")
    c.close()
    got = recv_exact(s, 4)
    s.settimeout(WAIT)
    eof = call(lambda: s.recv(10))
    s.settimeout(None)
    return "%r %r" % (got, eof)


def buffer_sizes(c, s):
    c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    return "%d %d" % (
        c.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
        s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
    )


def sndlowat(c, s):
    got = c.getsockopt(socket.SOL_SOCKET, socket.SO_SNDLOWAT)
    set_ = call(lambda: c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDLOWAT, 10) or "ok")
    return "%d %s" % (got, set_)


def siocoutq(c, s):
    c.sendall(b"abc")
    settle()
    n = fcntl.ioctl(c.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    return "%d %r" % (struct.unpack("i", n)[0], recv_exact(s, 3))


def fionbio(c, s):
    fcntl.ioctl(s.fileno(), termios.FIONBIO, struct.pack("i", 1))
    got = call(lambda: os.read(s.fileno(), 10))
    fcntl.ioctl(s.fileno(), termios.FIONBIO, struct.pack("i", 0))
    return str(got)


def sigio_to_owner(c, s):
    seen = []
    old = signal.signal(signal.SIGIO, lambda *_: seen.append(1))
    try:
        fcntl.fcntl(s.fileno(), fcntl.F_SETOWN, os.getpid())
        flags = fcntl.fcntl(s.fileno(), fcntl.F_GETFL)
        fcntl.fcntl(s.fileno(), fcntl.F_SETFL, flags | os.O_ASYNC)
        c.sendall(b"io")
        readable(s)
        settle()
        fcntl.fcntl(s.fileno(), fcntl.F_SETFL, flags)
    finally:
        signal.signal(signal.SIGIO, old)
    return "%s %r" % (bool(seen), recv_exact(s, 2))


def sigurg_to_owner(c, s):
    seen = []
    old = signal.signal(signal.SIGURG, lambda *_: seen.append(1))
    try:
        fcntl.fcntl(s.fileno(), fcntl.F_SETOWN, os.getpid())
        c.send(b"!", socket.MSG_OOB)
        settle()
        settle()
    finally:
        signal.signal(signal.SIGURG, old)
    return str(bool(seen))


def oob_inline(c, s):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_OOBINLINE, 1)
    c.sendall(b"ab")
    c.send(b"!", socket.MSG_OOB)
    c.sendall(b"cd")
    settle()
    return repr(recv_exact(s, 5))


def connect_before_accept(c, s):
    """`connect()` before the peer's app calls `accept()`: TCP completes it from the backlog,
    without the app (the pair connected first and timed it); bytes then go both ways."""
    c.sendall(b"early")
    s.settimeout(WAIT)
    got = call(lambda: s.recv(10))
    s.settimeout(None)
    return "%s %r" % (CONNECTED_IN[0] < WAIT, got)


connect_before_accept.connect_first = True


def siocatmark(c, s):
    c.sendall(b"ab")
    c.send(b"!", socket.MSG_OOB)
    settle()
    SIOCATMARK = 0x8905
    marks = []
    for _ in range(2):
        m = fcntl.ioctl(s.fileno(), SIOCATMARK, b"\0\0\0\0")
        marks.append(struct.unpack("i", m)[0])
        s.settimeout(WAIT)
        call(lambda: s.recv(1))
        s.settimeout(None)
    m = fcntl.ioctl(s.fileno(), SIOCATMARK, b"\0\0\0\0")
    marks.append(struct.unpack("i", m)[0])
    return str(marks)


def epoll_oneshot(c, s):
    ep = select.epoll()
    try:
        ep.register(s, select.EPOLLIN | select.EPOLLONESHOT)
        c.sendall(b"one")
        first = ep.poll(WAIT)
        c.sendall(b"two")
        settle()
        disarmed = ep.poll(0.3)
        ep.modify(s, select.EPOLLIN | select.EPOLLONESHOT)
        rearmed = ep.poll(WAIT)
        return "%d %d %d %r" % (len(first), len(disarmed), len(rearmed), recv_exact(s, 6))
    finally:
        ep.close()


def epoll_exclusive(c, s):
    ep = select.epoll()
    try:
        ep.register(s, select.EPOLLIN | select.EPOLLEXCLUSIVE)
        c.sendall(b"x")
        return "%d %r" % (len(ep.poll(WAIT)), recv_exact(s, 1))
    finally:
        ep.close()


def getsockname_after_reset(c, s):
    mine = s.getsockname()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
    settle()
    return str(call(lambda: s.getsockname() == mine))


def reset_seen_by_poll(c, s):
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
    settle()
    mask = events_once_down(s)
    err_ = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    return "%d %s" % (mask, errno.errorcode.get(err_, err_))


def events_once_down(s):
    """poll's events (POLLIN | POLLRDHUP asked) once the connection is down (POLLHUP or
    POLLERR), or after WAIT."""
    p = select.poll()
    p.register(s, select.POLLIN | select.POLLRDHUP)
    deadline = time.monotonic() + WAIT
    while True:
        mask = 0
        for _, ev in p.poll(int(WAIT * 1000)):
            mask |= ev
        if mask & (select.POLLHUP | select.POLLERR) or time.monotonic() > deadline:
            return mask
        time.sleep(0.05)


def _after_reset(c, s, send):
    """Two sends by `send(s)` after the peer's reset, each with the SIGPIPEs counted so far."""
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
    settle()
    raised = []
    old = signal.signal(signal.SIGPIPE, lambda *_: raised.append(1))
    try:
        first = call(lambda: send(s))
        after_first = len(raised)
        second = call(lambda: send(s))
    finally:
        signal.signal(signal.SIGPIPE, old)
    return "%s %d %s %d" % (first, after_first, second, len(raised))


def write_after_reset(c, s):
    return _after_reset(c, s, lambda s: s.send(b"x"))


def writev_after_reset(c, s):
    return _after_reset(c, s, lambda s: os.writev(s.fileno(), [b"x", b"y"]))


def sendfile_after_reset(c, s):
    path = "/tmp/conformance-sendfile-reset-%d" % os.getpid()
    with open(path, "wb") as f:
        f.write(b"0123456789")
    try:
        with open(path, "rb") as f:
            return _after_reset(c, s, lambda s: os.sendfile(s.fileno(), f.fileno(), 0, 4))
    finally:
        os.unlink(path)


def splice_after_reset(c, s):
    r, w = os.pipe()
    try:
        os.write(w, b"spliced")
        return _after_reset(c, s, lambda s: os.splice(r, s.fileno(), 2))
    finally:
        os.close(r)
        os.close(w)


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_void_p),
        ("namelen", ctypes.c_uint32),
        ("iov", ctypes.POINTER(_Iovec)),
        ("iovlen", ctypes.c_size_t),
        ("control", ctypes.c_void_p),
        ("controllen", ctypes.c_size_t),
        ("flags", ctypes.c_int),
    ]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("hdr", _Msghdr), ("len", ctypes.c_uint)]


def sendmmsg_with_address(c, s):
    """libc's sendmmsg (Python has none) of two messages, each naming the peer's address."""
    libc = ctypes.CDLL(None, use_errno=True)
    host, port = s.getsockname()[:2]
    # struct sockaddr_in: the family in host order, the port and address in network order.
    addr = struct.pack("=H", socket.AF_INET) + struct.pack("!H4s8x", port, socket.inet_aton(host))
    name = ctypes.create_string_buffer(addr, len(addr))
    bufs = [ctypes.create_string_buffer(b, len(b)) for b in (b"mm", b"sg")]
    iovs = [_Iovec(ctypes.cast(b, ctypes.c_void_p), 2) for b in bufs]
    msgs = (_Mmsghdr * 2)()
    for m, iov in zip(msgs, iovs):
        m.hdr.name = ctypes.cast(name, ctypes.c_void_p)
        m.hdr.namelen = len(addr)
        m.hdr.iov = ctypes.pointer(iov)
        m.hdr.iovlen = 1
    n = libc.sendmmsg(c.fileno(), msgs, 2, 0)
    sent = errno.errorcode.get(ctypes.get_errno(), "?") if n < 0 else str(n)
    return "%s %s %r" % (sent, [m.len for m in msgs], recv_exact(s, 4) if n > 0 else b"")


def server_speaks_first(c, s):
    t0 = time.monotonic()
    s.sendall(b"220 ready")
    got = recv_exact(c, 9)
    return "%r %s" % (got, time.monotonic() - t0 < 1.0)


SO_ZEROCOPY = 60  # <asm-generic/socket.h>; Python names neither
MSG_ZEROCOPY = 0x4000000


def zerocopy_send(c, s):
    """SO_ZEROCOPY turned on after the connect, then a MSG_ZEROCOPY send and its completion."""
    on = call(lambda: c.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1) or "ok")
    if on != "ok":
        n = call(lambda: c.send(b"zc", MSG_ZEROCOPY))
        return "%s %s %r" % (on, n, recv_exact(s, 2))
    return "%s %d %s" % (on, c.getsockopt(socket.SOL_SOCKET, SO_ZEROCOPY), zero_copy_completion(c, s))


# A client connection that holds a listener's one-place accept queue, made by a process
# without the shim (so it is neither counted nor upgraded): SYNs after it are dropped.
_FILLER = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
print("up", flush=True)
sys.stdin.read()
"""


def read_while_connect_fails(c, s):
    """Another thread's read on a socket whose blocking connect then fails: the connect's SYNs
    are dropped (the listener's accept queue is full), the read starts 0.4 s in, and the
    listener closes at 0.7 s, so the next SYN is refused. Both calls' answers, folded over
    TCP's race between the two threads (which one takes the pending error)."""
    host = s.getsockname()[0]
    ls = socket.socket()
    ls.bind((host, 0))
    ls.listen(0)
    port = ls.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    filler = subprocess.Popen(
        [sys.executable, "-c", _FILLER, host, str(port)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        filler.stdout.readline()
        settle()  # its last ACK lands: the queue is full
        c2 = socket.socket()
        got = {}

        def connect():
            got["connect"] = call(lambda: c2.connect((host, port)) or "connected")

        def read():
            got["read"] = call(lambda: c2.recv(16))

        threads = [threading.Thread(target=connect), threading.Thread(target=read)]
        threads[0].start()
        time.sleep(0.4)
        threads[1].start()
        time.sleep(0.3)
        ls.close()
        for t in threads:
            t.join(10 * WAIT)
        c2.close()
    finally:
        filler.stdin.close()
        filler.wait()
    # TCP's two outcomes: the read takes the connect's error (the connect then answers
    # ECONNABORTED), or the connect does (the read, woken by the disconnect, EPIPE).
    both = {("ECONNABORTED", "ECONNREFUSED"), ("ECONNREFUSED", "EPIPE")}
    answer = (got.get("connect", "(blocked)"), got.get("read", "(blocked)"))
    return "refused, the read fails" if answer in both else "%s %r" % answer


def zerocopy_sends_merge(c, s):
    """Three MSG_ZEROCOPY sends before the error queue is read: their completions (one range
    when merged), then an empty queue and no POLLERR."""
    c.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
    # The buffers stay alive until the completions are read: the kernel sends from their
    # pages, and a temporary's memory, freed after its send, may hold the next one's bytes.
    bufs = [b"z%d" % i for i in range(3)]
    sent = [c.send(b, MSG_ZEROCOPY) for b in bufs]
    got = recv_exact(s, 6)
    p = select.poll()
    p.register(c, 0)
    ranges = []
    while p.poll(int(WAIT * 1000)):
        try:
            _, anc, flags, _ = c.recvmsg(0, 256, socket.MSG_ERRQUEUE)
        except OSError as e:
            ranges.append(err(e))
            break
        for level, kind, d in anc:
            _, origin, _, _, _, lo, hi = struct.unpack("IBBBBII", d[:16])
            ranges.append("%d/%d origin %d %d-%d" % (level, kind, origin, lo, hi))
        if len(ranges) > 3:
            break
    return "%s %r %s then %s %s" % (
        sent,
        got,
        ranges,
        call(lambda: c.recvmsg(0, 256, socket.MSG_ERRQUEUE)),
        p.poll(0),
    )


def zerocopy_wakes_a_waiting_thread(c, s):
    """SO_ZEROCOPY on; a thread waits (poll, then epoll) for the socket's POLLERR alone while
    this one sends with MSG_ZEROCOPY 0.3 s later: the events each wait ended with, whether it
    ended within a second of the send, and the completion's range."""
    c.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
    out = []
    for kind in ("poll", "epoll"):
        got = {}

        def wait():
            if kind == "poll":
                p = select.poll()
                p.register(c, 0)
                got["events"] = [ev for _, ev in p.poll(int(4 * WAIT * 1000))]
            else:
                ep = select.epoll()
                ep.register(c, 0)
                got["events"] = [ev for _, ev in ep.poll(4 * WAIT)]
                ep.close()
            got["at"] = time.monotonic()

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.3)
        c.send(b"zc", MSG_ZEROCOPY)
        sent = time.monotonic()
        t.join(8 * WAIT)
        recv_exact(s, 2)
        _, anc, _, _ = c.recvmsg(0, 256, socket.MSG_ERRQUEUE)
        lo, hi = struct.unpack("II", anc[0][2][8:16]) if anc else (-1, -1)
        in_time = got.get("at", sent + 10) - sent < 1.0
        out.append("%s %s %s %d-%d" % (kind, got.get("events"), in_time, lo, hi))
    return "; ".join(out)


def errqueue_keeps_bytes(c, s):
    """recvmsg(MSG_ERRQUEUE) while bytes wait to be read: an empty error queue, and the bytes
    are still there."""
    s.sendall(b"data")
    settle()
    queue = call(lambda: c.recvmsg(16, 256, socket.MSG_ERRQUEUE))
    plain = call(lambda: c.recv(16, socket.MSG_ERRQUEUE))
    return "%s %s %r" % (queue, plain, recv_exact(c, 4))


def reset_after_own_shutdown(c, s):
    """The peer's reset after this side shut its writing: poll's and epoll's events (until
    POLLHUP or POLLERR), SO_ERROR, then a read."""
    s.shutdown(socket.SHUT_WR)
    eof = recv_exact(c, 1)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
    settle()
    mask = events_once_down(s)
    ep = select.epoll()
    ep.register(s, select.EPOLLIN | select.EPOLLRDHUP)
    emask = 0
    for _, ev in ep.poll(WAIT):
        emask |= ev
    ep.close()
    err_ = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    return "%r %d %d %s %r" % (eof, mask, emask, errno.errorcode.get(err_, err_), call(lambda: s.recv(1)))


def zero_copy_completion(sender, receiver):
    """A MSG_ZEROCOPY send of 2 bytes, what the peer reads, and the send's completion on the
    error queue (its origin and range; whether the kernel copied varies with the path)."""
    n = sender.send(b"zc", MSG_ZEROCOPY)
    got = recv_exact(receiver, 2)
    p = select.poll()
    p.register(sender, 0)  # POLLERR is always reported
    if not p.poll(WAIT * 1000):
        return "%s %r no completion" % (n, got)
    _, anc, _, _ = sender.recvmsg(0, 256, socket.MSG_ERRQUEUE)
    for _, _, d in anc:
        _, origin, _, _, _, lo, hi = struct.unpack("IBBBBII", d[:16])
        return "%s %r origin %d range %d-%d" % (n, got, origin, lo, hi)
    return "%s %r empty error queue" % (n, got)


def zerocopy_before_connect(c, s):
    return zero_copy_completion(c, s)


zerocopy_before_connect.before_client = lambda c: c.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)


def zerocopy_listener(c, s):
    return zero_copy_completion(s, c)


zerocopy_listener.before_listener = lambda ls: ls.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)


def tcp_cork(c, s):
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
    c.sendall(b"co")
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
    return "%d %r" % (c.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK), recv_exact(s, 2))


def options_survive_the_connection(c, s):
    def get(x, name, size=0):
        if size:
            return x.getsockopt(socket.SOL_SOCKET, name, size)
        return x.getsockopt(socket.SOL_SOCKET, name)

    timeo = struct.unpack("ll", get(c, socket.SO_RCVTIMEO, 16))
    linger = struct.unpack("ii", get(c, socket.SO_LINGER, 8))
    owner = fcntl.fcntl(c, fcntl.F_GETOWN) == os.getpid()
    is_async = bool(fcntl.fcntl(c, fcntl.F_GETFL) & os.O_ASYNC)
    client = [timeo, linger] + [get(c, o) for o in (socket.SO_KEEPALIVE, socket.SO_OOBINLINE, socket.SO_RCVLOWAT)]
    server = [get(s, o) for o in (socket.SO_KEEPALIVE, socket.SO_OOBINLINE, socket.SO_RCVLOWAT)]
    return "%s %s %s %s" % (client, owner, is_async, server)


def _options_client(c):
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 7, 500000))
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 3))
    for o, v in ((socket.SO_KEEPALIVE, 1), (socket.SO_OOBINLINE, 1), (socket.SO_RCVLOWAT, 3)):
        c.setsockopt(socket.SOL_SOCKET, o, v)
    signal.signal(signal.SIGIO, signal.SIG_IGN)  # the SIGIOs O_ASYNC raises from now on
    fcntl.fcntl(c, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(c, fcntl.F_SETFL, fcntl.fcntl(c, fcntl.F_GETFL) | os.O_ASYNC)


def _options_listener(ls):
    for o, v in ((socket.SO_KEEPALIVE, 1), (socket.SO_OOBINLINE, 1), (socket.SO_RCVLOWAT, 2)):
        ls.setsockopt(socket.SOL_SOCKET, o, v)


options_survive_the_connection.before_client = _options_client
options_survive_the_connection.before_listener = _options_listener


def tcp_info_counts_bytes(c, s):
    c.sendall(b"x" * 1000)
    recv_exact(s, 1000)
    settle()

    def field(x, at):
        # struct tcp_info: tcpi_bytes_acked, tcpi_bytes_received and tcpi_bytes_sent are the
        # u64s at 120, 128 (Linux 4.1 and later) and 200 (4.19).
        info = x.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
        return struct.unpack_from("Q", info, at)[0] if len(info) >= at + 8 else -1

    sent, acked, received = field(c, 200), field(c, 120), field(s, 128)
    return "%s %s %s" % (sent >= 1000, acked >= 1000, received >= 1000)


ROWS = [
    connect_before_accept,
    sendto_with_address,
    sendmsg_with_address,
    send_plain,
    sendmsg_scm_rights,
    recv_peek,
    recv_waitall,
    recv_dontwait_empty,
    recv_trunc,
    recvmsg_and_readv,
    fionread,
    rcvlowat_readiness,
    blocking_reads_wait,
    rcvlowat_blocking_reads,
    urgent_byte,
    urgent_mark_and_fionread,
    shutdown_write,
    shutdown_read,
    close_then_peer_reads_eof,
    close_with_reset,
    getpeername_after_reset,
    write_after_peer_closed,
    socket_identity,
    so_error_and_keepalive,
    tcp_options,
    names,
    poll_rdhup,
    epoll_edge_triggered,
    nonblocking_empty,
    send_more_and_nosignal,
    sendmsg_iov_and_writev,
    sendfile_to_socket,
    splice_from_socket,
    copy_file_range_from_socket,
    shutdown_both,
    close_with_linger_timeout,
    buffer_sizes,
    sndlowat,
    siocoutq,
    fionbio,
    sigio_to_owner,
    sigurg_to_owner,
    oob_inline,
    siocatmark,
    epoll_oneshot,
    epoll_exclusive,
    getsockname_after_reset,
    reset_seen_by_poll,
    write_after_reset,
    writev_after_reset,
    sendfile_after_reset,
    splice_after_reset,
    sendmmsg_with_address,
    server_speaks_first,
    zerocopy_send,
    zerocopy_sends_merge,
    zerocopy_wakes_a_waiting_thread,
    errqueue_keeps_bytes,
    reset_after_own_shutdown,
    read_while_connect_fails,
    zerocopy_before_connect,
    zerocopy_listener,
    tcp_cork,
    tcp_info_counts_bytes,
    options_survive_the_connection,
]


def pair(host, port, mode, row):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        ls.bind((host, port))
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
        ls.bind((host, 0))  # taken by another program: any other port is as fresh
        port = ls.getsockname()[1]
    getattr(row, "before_listener", lambda _: None)(ls)
    ls.listen(4)
    c = socket.socket()
    getattr(row, "before_client", lambda _: None)(c)
    try:
        if mode == "upgraded" and not getattr(row, "connect_first", False):
            got = []
            t = threading.Thread(target=lambda: got.append(ls.accept()[0]))
            t.start()
            time.sleep(0.05)
            c.connect((host, port))
            t.join(WAIT * 5)
            s = got[0]
        else:
            t = time.monotonic()
            c.connect((host, port))
            CONNECTED_IN[0] = time.monotonic() - t
            if mode != "upgraded":
                time.sleep(FALLBACK_ACCEPT_AFTER)
            s, _ = ls.accept()
    finally:
        ls.close()
    if mode == "upgraded":
        time.sleep(MOVE_WAIT)
    return c, s


def main():
    host, first, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    only = set(sys.argv[4:])
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    for i, row in enumerate(ROWS):
        if only and row.__name__ not in only:
            continue
        c, s = pair(host, first + i, mode, row)
        try:
            result = row(c, s)
        except Exception as e:  # a row that raised answers with what it raised
            result = "raised %s: %s" % (type(e).__name__, e)
        finally:
            for x in (c, s):
                try:
                    x.close()
                except OSError:
                    pass
        print("%s %s" % (row.__name__, result), flush=True)


if __name__ == "__main__":
    main()
