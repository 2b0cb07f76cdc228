"""A client that forks: the parent makes one connection with CLIENT (its shim's engine starts
then), then a forked child (no exec) makes N more with the same program, as a pre-fork
server's worker connects to its backends. Prints both outputs, the child's first.

    python3 forked_client.py CLIENT HOST PORT N [ARGS...]
"""

import os, runpy, sys

client, host, port, n, rest = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]


def run(count):
    sys.argv = [client, host, port, str(count)] + rest
    runpy.run_path(client, run_name="__main__")
    sys.stdout.flush()


run(1)
pid = os.fork()
if pid == 0:
    try:
        run(int(n))
    except BaseException as e:
        print("child failed:", repr(e), flush=True)
        os._exit(1)
    os._exit(0)
_, status = os.waitpid(pid, 0)
assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
print("forked ok", flush=True)
