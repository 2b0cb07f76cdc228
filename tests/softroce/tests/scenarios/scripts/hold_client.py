# Connects, checks a 1000-byte echo, says `flowing`, then holds the connection (to be killed).
import os, socket, sys, time
s = socket.socket()
s.connect((sys.argv[1], int(sys.argv[2])))
data = os.urandom(1000)
s.sendall(data)
got = b""
while len(got) < len(data):
    got += s.recv(len(data) - len(got))
assert got == data
print("flowing", flush=True)
time.sleep(120)
