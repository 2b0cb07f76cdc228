import os, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
conns = [socket.create_connection((host, port)) for _ in range(3)]
for i, s in enumerate(conns):
    data = os.urandom(100000) + bytes([i])
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    got = bytearray()
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
    assert bytes(got) == data, i
print("three ok")
