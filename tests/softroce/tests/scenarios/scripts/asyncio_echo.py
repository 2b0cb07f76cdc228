import asyncio, hashlib, os, sys

HOST, PORT = sys.argv[2], int(sys.argv[3])

async def server():
    done = asyncio.get_running_loop().create_future()
    async def handle(r, w):
        while True:
            chunk = await r.read(65536)
            if not chunk:
                break
            w.write(chunk)
            await w.drain()
        w.close()
        await w.wait_closed()
        done.set_result(None)
    srv = await asyncio.start_server(handle, HOST, PORT)
    async with srv:
        await done

async def client():
    data = os.urandom(16 << 20)
    r, w = await asyncio.open_connection(HOST, PORT)
    peer = w.get_extra_info("peername")
    assert peer == (HOST, PORT), peer
    async def send():
        for i in range(0, len(data), 100000):
            w.write(data[i:i + 100000])
            await w.drain()
        w.write_eof()
    t = asyncio.create_task(send())
    got = await r.read(-1)
    await t
    w.close()
    assert got == data, (len(got), len(data))
    print("echo ok", hashlib.sha256(got).hexdigest())

asyncio.run(server() if sys.argv[1] == "server" else client())
