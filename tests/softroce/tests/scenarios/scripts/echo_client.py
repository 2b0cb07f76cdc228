import os, socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
data = os.urandom(256 << 10)
s = socket.socket()  # the shim's once-per-process decision happens here, not in connect()
t0 = time.time()
s.connect((host, port))
connect = time.time() - t0
s.sendall(data)
s.shutdown(socket.SHUT_WR)
got = bytearray()
while True:
    b = s.recv(65536)
    if not b:
        break
    got += b
assert bytes(got) == data, (len(got), len(data))
print("echo ok connect_s %.3f" % connect)
