# One connection, busy, idle, busy again, idle again: 16 MiB each way in each busy phase
# (sha256-checked), 8 s without a byte in each idle one. Prints this process's and the echo
# server's (argv[3]: its pid) VmPin in KiB: the largest while busy, the value after idling.
import hashlib, os, socket, sys, threading, time

host, port, server = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
me = os.getpid()


def pin(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmPin:"):
                return int(line.split()[1])
    return -1


s = socket.create_connection((host, port))


def busy(n):
    data = os.urandom(n)
    peak = [0, 0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], pin(me))
            peak[1] = max(peak[1], pin(server))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    writer = threading.Thread(target=s.sendall, args=(data,))
    writer.start()
    got = bytearray()
    while len(got) < n:
        b = s.recv(1 << 20)
        assert b, "EOF after %d of %d bytes" % (len(got), n)
        got += b
    writer.join()
    done.set()
    sampler.join()
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest(), "bytes differ"
    return peak


for phase in range(2):
    client, srv = busy(16 << 20)
    print(f"busy {phase} client {client} server {srv}", flush=True)
    time.sleep(8)
    print(f"idle {phase} client {pin(me)} server {pin(server)}", flush=True)
s.shutdown(socket.SHUT_WR)
assert s.recv(1) == b""
print("phases ok", flush=True)
