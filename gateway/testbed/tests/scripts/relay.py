#!/usr/bin/env python3
"""A relay that behaves like KubeVirt virt-handler's migration proxy (pkg/virt-handler/
migration-proxy): each accepted connection gets its own outgoing connection and two copy
threads; EOF half-closes the other side, an error closes both.

  relay.py unix-to-tcp LISTEN_PATH HOST:PORT   (source node: libvirt/QEMU -> target node)
  relay.py tcp-to-unix PORT PATH               (target node: random TCP port -> QEMU)
  relay.py tcp-to-tcp PORT HOST:PORT           (plain TCP hop, for benchmarks)

Prints "ready" on stdout once listening.
"""
import os, socket, sys, threading

BUF = 256 * 1024


def pipe(src, dst):
    try:
        while True:
            data = src.recv(BUF)
            if not data:
                break
            dst.sendall(data)
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    except OSError:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(client, connect):
    try:
        upstream = connect()
    except OSError as e:
        print(f"relay: connect failed: {e}", file=sys.stderr, flush=True)
        client.close()
        return
    t = threading.Thread(target=pipe, args=(upstream, client), daemon=True)
    t.start()
    pipe(client, upstream)
    t.join()
    client.close()
    upstream.close()


def tcp_connect(hostport):
    host, port = hostport.rsplit(":", 1)

    def connect():
        s = socket.create_connection((host, int(port)))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    return connect


def unix_connect(path):
    def connect():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        return s

    return connect


def main():
    mode, listen, target = sys.argv[1:4]
    if mode == "unix-to-tcp":
        try:
            os.unlink(listen)
        except FileNotFoundError:
            pass
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(listen)
        connect = tcp_connect(target)
    else:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("0.0.0.0", int(listen)))
        connect = unix_connect(target) if mode == "tcp-to-unix" else tcp_connect(target)
    srv.listen(64)
    print("ready", flush=True)
    while True:
        client, _ = srv.accept()
        threading.Thread(target=serve, args=(client, connect), daemon=True).start()


if __name__ == "__main__":
    main()
