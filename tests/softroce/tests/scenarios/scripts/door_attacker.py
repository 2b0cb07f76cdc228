"""Another user's process at the door of a shimmed SO_REUSEPORT listener (docs/security.md).
Started as root, it connects to the port over TCP, then becomes UID (no groups) and opens N
conversations at the door, each asking to be kept as a watcher (WATCH), and one more that
hands over its TCP connection with a reply pair (a CLAIM, as a process of the group would).
It prints how the holder treated them within 10 s (a request the holder closed the
conversation before counts as closed):

    closed C of N; claim answered ANSWER

(ANSWER: the reply pair's first message, b'' when the holder dropped the pair unanswered,
`none` when it neither answered nor dropped it.)

    python3 door_attacker.py HOST PORT N UID
"""

import array
import os
import socket
import struct
import sys
import time

WATCH, CLAIM = b"\x03", b"\x01"

host, port, n, uid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
tcp = socket.create_connection((host, port), timeout=30)
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
assert os.getuid() == uid and os.geteuid() == uid

door = b"\0rdma-streams/port/%s:%d" % (host.encode(), port)


def knock():
    """A conversation at the door: a blocking connect (waiting while the door's backlog is
    full, as a process of the group would), bounded by a 10 s SO_SNDTIMEO."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 10, 0))
    s.connect(door)
    return s


def ask(s, send):
    """Sends a request on `s`; False when the holder closed it already."""
    try:
        send(s)
        return True
    except (BrokenPipeError, ConnectionResetError):
        return False


watchers = []
for _ in range(n):
    s = knock()
    watchers.append((s, ask(s, lambda s: s.send(WATCH))))

claim = knock()
mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
fds = array.array("i", [tcp.fileno(), theirs.fileno()])
ask(claim, lambda s: s.sendmsg([CLAIM], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)]))
theirs.close()

deadline = time.monotonic() + 10


def ended(s):
    """Whether the holder closed `s` before the deadline (EOF or a reset)."""
    s.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        return s.recv(16) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


closed = sum(not sent or ended(s) for s, sent in watchers)
mine.settimeout(max(0.01, deadline - time.monotonic()))
try:
    answer = repr(mine.recv(16))
except socket.timeout:
    answer = "none"
print("closed %d of %d; claim answered %s" % (closed, n, answer), flush=True)
