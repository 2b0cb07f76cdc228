#!/usr/bin/env python3
"""Live-migrate a stopped TCG QEMU guest with preallocated random RAM and check the bytes.

Starts a destination QEMU (`-incoming defer`) and a source QEMU (CPUs stopped with -S, so the
guest never changes its RAM), each optionally behind a command prefix (`--src-wrap`,
`--dst-wrap`) and with extra environment (`--src-env`, `--dst-env`, `--env`), drives both over
QMP (unix sockets in the work dir), runs `migrate-incoming` on the listen URI and `migrate` on
the source to the target URI (the two may differ when relays sit in between), optionally with
multifd, and waits for both sides to report `completed` within an overall timeout.

RAM: the source's RAM is a private mapping of a file of random bytes (`memory-backend-file`,
`share=off`, `prealloc=on`), created once and reused (`--ram-file`); the destination's is
anonymous (`memory-backend-ram`, all zero at start; preallocated too, so page faults stay out of
the timed migration), so any byte the destination holds came over the migration stream.

Verification: `pmemsave` of guest-physical [0, size) on the source before the migration and on
the destination after it must hash (sha256) the same, and the source dump must equal the random
file everywhere except the PAM window 0xC0000-0xFFFFF, where the pc machine's guest-physical
view shows the BIOS ROM instead of RAM. Those 256 KiB of RAM are checked directly instead: read
from each QEMU's RAM block through /proc/PID/mem (host address from HMP `gpa2hva`), source
against the file, destination against the source; where ptrace rights are missing this part is
reported as `"ram_pam_window": "unchecked (...)"`. `--corrupt-dst` proves the check works.

Two machines (`--role source` on one, `--role destination` on the other; default `--role
both`, the two QEMUs here): the destination starts its QEMU, runs `migrate-incoming` on the
listen URI, creates `--ready-file` (if given), waits for the incoming migration to complete and
dumps its RAM; the source dumps its RAM (checked against the random file as above) and migrates
to the target URI. Each hashes its RAM: `ram_sha256` of the `pmemsave` dump and
`ram_pam_window_sha256` of the PAM window read from the RAM block, in its JSON line and, with
`--sha-file`, as one line `<ram_sha256> <pam window sha256 or "unchecked">` in that file: the
migration was byte-exact when the two sides' lines are equal. `ram_match` stays null there (one
side cannot tell).

Prints one JSON line on stdout (status, seconds, bytes, ram_match, qemu_version,
multifd_channels, ...); exits 0 when the migration completed and the RAM matched (or was not
verified with --no-verify; with --role source or destination: completed and hashed), 1
otherwise, 2 on usage errors. Both QEMUs are stopped on every
exit path (QMP `quit`, then SIGTERM, then SIGKILL of their process groups), timeouts and
signals included; they also get SIGTERM if this script dies (PR_SET_PDEATHSIG).

Python 3 standard library only.
"""

import argparse
import ctypes
import fcntl
import hashlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

# The pc machine's PAM window: guest-physical reads there show the BIOS ROM, not RAM.
PAM_WINDOW = (0xC0000, 0x100000)
CHUNK = 4 << 20


class Failure(Exception):
    """A failed run: reported in the JSON line as status/error."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class Deadline:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds
        self.seconds = seconds

    def left(self):
        return self.end - time.monotonic()

    def check(self, what):
        if self.left() <= 0:
            raise Failure("timeout", f"overall timeout ({self.seconds:g} s) while {what}")


class Qmp:
    """A minimal QMP client on a unix socket: commands in order, events kept aside."""

    def __init__(self, path, deadline, name):
        self.name = name
        self.deadline = deadline
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(max(0.1, deadline.left()))
        self.sock.connect(path)
        self.buf = b""
        self.events = []
        greeting = self._read()
        if "QMP" not in greeting:
            raise Failure("error", f"{name}: no QMP greeting: {greeting}")
        self.greeting = greeting["QMP"]
        self.cmd("qmp_capabilities")

    def _read(self):
        while b"\n" not in self.buf:
            left = self.deadline.left()
            if left <= 0:
                raise Failure("timeout", f"overall timeout waiting for {self.name} QMP")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                raise Failure("timeout", f"overall timeout waiting for {self.name} QMP") from None
            if not data:
                raise Failure("error", f"{self.name}: QMP connection closed (QEMU died?)")
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def cmd(self, execute, **arguments):
        msg = {"execute": execute}
        if arguments:
            msg["arguments"] = arguments
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        while True:
            reply = self._read()
            if "event" in reply:
                self.events.append(reply)
                continue
            if "error" in reply:
                raise Failure("error", f"{self.name}: {execute} failed: {reply['error']}")
            return reply.get("return")

    def hmp(self, line):
        return self.cmd("human-monitor-command", **{"command-line": line})

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def set_pdeathsig():
    """In the child before exec: SIGTERM when this script dies, and a process group of its own."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Vm:
    def __init__(self, name, argv, env, workdir):
        self.name = name
        self.argv = argv
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.qmp_path = os.path.join(workdir, f"{name}.qmp")
        self.qmp = None
        try:
            os.unlink(self.qmp_path)
        except FileNotFoundError:
            pass
        full_env = dict(os.environ)
        full_env.update(env)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv + ["-qmp", f"unix:{self.qmp_path},server=on,wait=off"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
                preexec_fn=set_pdeathsig,
            )

    def log_tail(self, n=2000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode(errors="replace").strip()
        except OSError:
            return ""

    def connect(self, deadline):
        while True:
            if self.proc.poll() is not None:
                raise Failure(
                    "error",
                    f"{self.name} QEMU exited with {self.proc.returncode} before QMP: "
                    f"{self.log_tail()}",
                )
            if os.path.exists(self.qmp_path):
                try:
                    self.qmp = Qmp(self.qmp_path, deadline, self.name)
                    return self.qmp
                except (ConnectionRefusedError, FileNotFoundError):
                    pass
            deadline.check(f"waiting for {self.name} QMP socket")
            time.sleep(0.01)

    def stop(self):
        """QMP quit (a clean exit, so preloaded libraries' exit hooks run), then signals."""
        if self.proc.poll() is None and self.qmp is not None:
            try:
                self.qmp.deadline = Deadline(2)
                self.qmp.cmd("quit")
            except (Failure, OSError, ValueError):
                pass
        if self.qmp is not None:
            self.qmp.close()
        for sig, wait in ((None, 3), (signal.SIGTERM, 3), (signal.SIGKILL, 5)):
            if sig is not None:
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    pass
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # Anything the wrapper left behind in the group.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def qemu_version(qemu):
    out = subprocess.run([qemu, "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"version (\d+)\.(\d+)\.(\d+)", out)
    if not m:
        raise Failure("error", f"cannot parse `{qemu} --version`: {out!r}")
    return tuple(int(x) for x in m.groups())


def ensure_ram_file(path, size):
    """A file of `size` random bytes, reused when it already has that size (an exclusive lock
    on PATH.lock keeps concurrent runs from replacing it under each other)."""
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if os.path.getsize(path) == size:
                return
        except OSError:
            pass
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            left = size
            while left:
                n = min(CHUNK, left)
                f.write(os.urandom(n))
                left -= n
        os.replace(tmp, path)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(CHUNK)
            if not b:
                return h.hexdigest()
            h.update(b)


def xor_bytes(x, y):
    """Bytewise x ^ y of two equal-length byte strings (zero bytes where they agree)."""
    n = len(x)
    return (int.from_bytes(x, "little") ^ int.from_bytes(y, "little")).to_bytes(n, "little")


def first_difference(a_path, b_path):
    """(offset of the first differing byte or None, number of differing bytes) of two files."""
    first, count, off = None, 0, 0
    with open(a_path, "rb") as a, open(b_path, "rb") as b:
        while True:
            x, y = a.read(CHUNK), b.read(CHUNK)
            if not x and not y:
                return first, count
            n = min(len(x), len(y))
            count += abs(len(x) - len(y))
            if x[:n] != y[:n]:
                d = xor_bytes(x[:n], y[:n])
                count += n - d.count(0)
                if first is None:
                    first = off + n - len(d.lstrip(b"\0"))
            elif len(x) != len(y) and first is None:
                first = off + n
            off += max(len(x), len(y))


def check_source_holds_file(dump, ram_file, size):
    """The source dump equals the random file outside the PAM window."""
    lo, hi = PAM_WINDOW
    off = 0
    with open(dump, "rb") as d, open(ram_file, "rb") as r:
        while off < size:
            x, y = d.read(CHUNK), r.read(CHUNK)
            if len(x) != len(y) or not x:
                raise Failure("error", f"source dump is short at {off:#x}")
            # Blank out the window (in this chunk's coordinates) on both sides.
            a, b = max(lo - off, 0), min(hi - off, len(x))
            if a < b:
                x = x[:a] + bytes(b - a) + x[b:]
                y = y[:a] + bytes(b - a) + y[b:]
            if x != y:
                d = xor_bytes(x, y)
                at = off + len(d) - len(d.lstrip(b"\0"))
                raise Failure(
                    "error",
                    f"source RAM differs from the random file at {at:#x}: the memory backend "
                    "does not hold the file's bytes",
                )
            off += len(x)


def qemu_pid(vm):
    """QEMU's pid: the QMP peer (the wrapper may have exec'd into QEMU or forked it)."""
    creds = vm.qmp.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return int.from_bytes(creds[:4], sys.byteorder)


def cpu_seconds(pid):
    """utime + stime of a process (its exited threads included), in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # Fields 14 and 15 of stat(5); fields[0] here is field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_address(vm, gpa):
    out = vm.qmp.hmp(f"gpa2hva {gpa:#x}")
    m = re.search(r"0x[0-9a-fA-F]+$", out.strip())
    if not m:
        raise Failure("error", f"{vm.name}: gpa2hva {gpa:#x}: {out!r}")
    return int(m.group(0), 16)


def read_ram_block(vm, offset, length):
    """`length` bytes of the RAM block at `offset` (guest RAM starts at guest-physical 0 and is
    one RAM block of the pc machine below 4 GiB), through /proc/PID/mem."""
    base = host_address(vm, 0)
    with open(f"/proc/{qemu_pid(vm)}/mem", "rb", buffering=0) as mem:
        mem.seek(base + offset)
        return mem.read(length)


def poke_destination(vm, offset):
    """Self-check of the verification: flips the destination's RAM byte at `offset` of the guest
    RAM block (the guest-physical address, except in the PAM window where the guest sees ROM)."""
    base = host_address(vm, 0)
    with open(f"/proc/{qemu_pid(vm)}/mem", "r+b", buffering=0) as mem:
        mem.seek(base + offset)
        old = mem.read(1)
        mem.seek(base + offset)
        mem.write(bytes([old[0] ^ 0xFF]))


def env_pairs(items, what):
    out = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"{what}: expected KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k] = v
    return out


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=(
            "Example: %(prog)s --src-env LD_PRELOAD=/path/libstreamshim.so "
            "--dst-env LD_PRELOAD=/path/libstreamshim.so --multifd 4"
        ),
    )
    p.add_argument("--qemu", default="qemu-system-x86_64", help="QEMU binary (default %(default)s)")
    p.add_argument("--workdir", help="QMP sockets, logs, RAM dumps (default: a new temp dir, removed)")
    p.add_argument("--ram-mib", type=int, default=256, help="guest RAM in MiB (default %(default)s)")
    p.add_argument(
        "--ram-file",
        help="random RAM image, created if missing or of another size (default WORKDIR/ram-<N>M.bin)",
    )
    p.add_argument("--port", type=int, help="port of the default URIs (default: a free one)")
    p.add_argument("--listen", help="migrate-incoming URI on the destination (default tcp:127.0.0.1:PORT)")
    p.add_argument("--target", help="migrate URI on the source (default: the listen URI)")
    p.add_argument("--multifd", type=int, default=0, metavar="N", help="multifd with N channels (0: single stream)")
    p.add_argument(
        "--cap",
        action="append",
        metavar="NAME",
        help="also enable migration capability NAME on both sides (repeatable)",
    )
    p.add_argument("--src-wrap", default="", help="shell words put in front of the source QEMU command")
    p.add_argument("--dst-wrap", default="", help="shell words put in front of the destination QEMU command")
    p.add_argument("--env", action="append", metavar="K=V", help="extra environment for both QEMUs")
    p.add_argument("--src-env", action="append", metavar="K=V", help="extra environment for the source")
    p.add_argument("--dst-env", action="append", metavar="K=V", help="extra environment for the destination")
    p.add_argument("--timeout", type=float, default=60, help="overall bound in seconds (default %(default)s)")
    p.add_argument(
        "--max-bandwidth",
        type=int,
        default=1 << 40,
        help="migration max-bandwidth in bytes/s (default %(default)s, i.e. unthrottled)",
    )
    p.add_argument("--no-verify", action="store_true", help="skip the RAM dumps and comparison")
    p.add_argument("--keep-dumps", action="store_true", help="keep src.ram/dst.ram in the work dir")
    p.add_argument(
        "--corrupt-dst",
        type=lambda s: int(s, 0),
        action="append",
        metavar="OFFSET",
        help="self-check: flip the destination's guest RAM byte at OFFSET after the migration "
        "(through /proc/PID/mem, so it needs ptrace rights on QEMU; repeatable); the run must "
        "then report ram_match false and exit 1",
    )
    p.add_argument(
        "--role",
        choices=("both", "source", "destination"),
        default="both",
        help="both QEMUs here (default), or only one side of a migration between two machines",
    )
    p.add_argument(
        "--ready-file",
        help="--role destination: created once migrate-incoming listens on the listen URI",
    )
    p.add_argument(
        "--sha-file",
        help="--role source or destination: write '<ram sha256> <PAM window sha256>' there",
    )
    p.add_argument("--print-version", action="store_true", help="print the QEMU version as JSON and exit")
    return p.parse_args(argv)


class Setup:
    """What both roles derive from the arguments: sizes, files, URIs, QEMU command lines."""

    def __init__(self, args, result):
        version = qemu_version(args.qemu)
        result["qemu_version"] = ".".join(map(str, version))
        self.size = args.ram_mib << 20
        result["ram_bytes"] = self.size
        self.workdir = args.workdir
        os.makedirs(self.workdir, exist_ok=True)
        self.ram_file = args.ram_file or os.path.join(self.workdir, f"ram-{args.ram_mib}M.bin")
        if args.role != "destination":
            ensure_ram_file(self.ram_file, self.size)
        port = args.port or free_port()
        self.listen = args.listen or f"tcp:127.0.0.1:{port}"
        self.target = args.target or self.listen
        result.update(listen=self.listen, target=self.target)

        common = [
            args.qemu,
            "-machine", "pc,accel=tcg,memory-backend=ram0",
            "-cpu", "qemu64",
            "-smp", "1",
            "-m", f"{args.ram_mib}M",
            "-nodefaults", "-no-user-config", "-display", "none", "-vga", "none",
            "-S",
        ]  # fmt: skip
        self.dst_argv = shlex.split(args.dst_wrap) + common + [
            "-object", f"memory-backend-ram,id=ram0,size={args.ram_mib}M,prealloc=on",
            "-incoming", "defer",
        ]  # fmt: skip
        self.src_argv = shlex.split(args.src_wrap) + common + [
            "-object",
            f"memory-backend-file,id=ram0,size={args.ram_mib}M,mem-path={self.ram_file},share=off,prealloc=on",
        ]  # fmt: skip
        both = env_pairs(args.env, "--env")
        self.dst_env = {**both, **env_pairs(args.dst_env, "--dst-env")}
        self.src_env = {**both, **env_pairs(args.src_env, "--src-env")}
        names = (["multifd"] if args.multifd else []) + (args.cap or [])
        self.caps = [{"capability": c, "state": True} for c in names]

    def configure(self, args, q):
        """The migration capabilities and parameters of one side."""
        if self.caps:
            q.cmd("migrate-set-capabilities", capabilities=self.caps)
        if args.multifd:
            q.cmd("migrate-set-parameters", **{"multifd-channels": args.multifd})


def check_source(args, setup, src, result, deadline):
    """The source's RAM dump equals the random file (the PAM window read from the RAM block);
    returns (dump path, PAM window bytes or None)."""
    size, ram_file = setup.size, setup.ram_file
    src_dump = os.path.join(setup.workdir, "src.ram")
    src.qmp.cmd("pmemsave", val=0, size=size, filename=src_dump)
    check_source_holds_file(src_dump, ram_file, size)
    result["ram_sha256_src"] = sha256_file(src_dump)
    lo, hi = PAM_WINDOW
    try:
        src_window = read_ram_block(src, lo, hi - lo)
    except OSError as e:
        src_window = None
        result["ram_pam_window"] = f"unchecked ({e})"
    if src_window is not None:
        with open(ram_file, "rb") as f:
            f.seek(lo)
            if f.read(hi - lo) != src_window:
                raise Failure("error", "source RAM block differs from the random file in "
                              "the PAM window")
    deadline.check("hashing the source RAM")
    return src_dump, src_window


def finish_stats(src_info, result, pids, cpu0, size):
    cpu1 = {k: cpu_seconds(p) for k, p in pids.items()}
    if None not in cpu0.values() and None not in cpu1.values():
        result["cpu_seconds"] = {k: round(cpu1[k] - cpu0[k], 3) for k in pids}
    result["qemu_total_time_ms"] = src_info.get("total-time")
    result["qemu_setup_time_ms"] = src_info.get("setup-time")
    result["qemu_downtime_ms"] = src_info.get("downtime")
    ram = src_info.get("ram", {})
    result["bytes"] = ram.get("transferred")
    result["ram_pages_normal"] = ram.get("normal")
    result["ram_dirty_sync_count"] = ram.get("dirty-sync-count")
    if result["seconds"]:
        result["mib_per_s"] = round(size / (1 << 20) / result["seconds"], 1)


def stop_all(vms, result):
    # No signal may cut the cleanup short.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    for vm in reversed(vms):
        vm.stop()
    result["exit_codes"] = {vm.name: vm.proc.returncode for vm in vms}


def write_sha(args, result, window):
    """--role source/destination: the RAM's hashes in the JSON line and the --sha-file."""
    pam = hashlib.sha256(window).hexdigest() if window is not None else None
    result["ram_pam_window_sha256"] = pam
    if args.sha_file:
        with open(args.sha_file, "w") as f:
            f.write(f"{result['ram_sha256']} {pam or 'unchecked'}\n")


def run_source(args, result):
    """--role source: dump and check the RAM, migrate to the target URI, wait for completion."""
    deadline = Deadline(args.timeout)
    setup = Setup(args, result)
    vms = []
    try:
        src = Vm("src", setup.src_argv, setup.src_env, setup.workdir)
        vms.append(src)
        sq = src.connect(deadline)
        window = None
        if not args.no_verify:
            dump, window = check_source(args, setup, src, result, deadline)
            result["ram_sha256"] = result.pop("ram_sha256_src")
            if not args.keep_dumps:
                os.unlink(dump)
        setup.configure(args, sq)
        sq.cmd("migrate-set-parameters", **{"max-bandwidth": args.max_bandwidth})
        pids = {"src": qemu_pid(src)}
        cpu0 = {"src": cpu_seconds(pids["src"])}
        t0 = time.monotonic()
        sq.cmd("migrate", uri=setup.target)
        while True:
            info = sq.cmd("query-migrate")
            if info.get("status") in ("completed", "failed", "cancelled"):
                break
            if deadline.left() <= 0:
                result["src_status"] = info.get("status")
                raise Failure("timeout", f"overall timeout ({args.timeout:g} s) during migration")
            time.sleep(0.02)
        result["src_status"] = info.get("status")
        if info.get("status") != "completed":
            msg = info.get("error-desc") or "migration did not complete"
            raise Failure("failed", f"{msg} (source {info.get('status')})")
        result["seconds"] = round(time.monotonic() - t0, 4)
        finish_stats(info, result, pids, cpu0, setup.size)
        if not args.no_verify:
            write_sha(args, result, window)
        result["status"] = "completed"
    finally:
        stop_all(vms, result)


def run_destination(args, result):
    """--role destination: listen, wait for the incoming migration to complete, dump the RAM."""
    deadline = Deadline(args.timeout)
    setup = Setup(args, result)
    vms = []
    try:
        dst = Vm("dst", setup.dst_argv, setup.dst_env, setup.workdir)
        vms.append(dst)
        dq = dst.connect(deadline)
        setup.configure(args, dq)
        dq.cmd("migrate-incoming", uri=setup.listen)
        if args.ready_file:
            with open(args.ready_file, "w") as f:
                f.write(f"{setup.listen}\n")
        t0 = time.monotonic()
        active = None
        while True:
            info = dq.cmd("query-migrate")
            status = info.get("status")
            if active is None and status not in (None, "none", "setup"):
                active = time.monotonic()
            if status in ("completed", "failed", "cancelled"):
                break
            if deadline.left() <= 0:
                result["dst_status"] = status
                raise Failure("timeout", f"overall timeout ({args.timeout:g} s) waiting for "
                              "the incoming migration")
            time.sleep(0.02)
        result["dst_status"] = status
        if status != "completed":
            msg = info.get("error-desc") or "migration did not complete"
            raise Failure("failed", f"{msg} (destination {status})")
        end = time.monotonic()
        result["waited_seconds"] = round(end - t0, 4)
        result["seconds"] = round(end - active, 4) if active is not None else None
        for offset in args.corrupt_dst or []:
            poke_destination(dst, offset)
            result.setdefault("corrupted_dst_at", []).append(offset)
        if not args.no_verify:
            deadline.check("dumping the destination RAM")
            dump = os.path.join(setup.workdir, "dst.ram")
            dq.cmd("pmemsave", val=0, size=setup.size, filename=dump)
            result["ram_sha256"] = sha256_file(dump)
            lo, hi = PAM_WINDOW
            try:
                window = read_ram_block(dst, lo, hi - lo)
            except OSError as e:
                window = None
                result["ram_pam_window"] = f"unchecked ({e})"
            write_sha(args, result, window)
            if not args.keep_dumps:
                os.unlink(dump)
        result["status"] = "completed"
    finally:
        stop_all(vms, result)


def run(args, result):
    if args.role == "source":
        return run_source(args, result)
    if args.role == "destination":
        return run_destination(args, result)
    deadline = Deadline(args.timeout)
    setup = Setup(args, result)
    size, workdir = setup.size, setup.workdir
    vms = []
    try:
        dst = Vm("dst", setup.dst_argv, setup.dst_env, workdir)
        vms.append(dst)
        src = Vm("src", setup.src_argv, setup.src_env, workdir)
        vms.append(src)
        dq = dst.connect(deadline)
        sq = src.connect(deadline)

        dst_dump = os.path.join(workdir, "dst.ram")
        if not args.no_verify:
            src_dump, src_window = check_source(args, setup, src, result, deadline)

        for q in (dq, sq):
            setup.configure(args, q)
        sq.cmd("migrate-set-parameters", **{"max-bandwidth": args.max_bandwidth})
        dq.cmd("migrate-incoming", uri=setup.listen)
        pids = {"src": qemu_pid(src), "dst": qemu_pid(dst)}
        cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
        t0 = time.monotonic()
        sq.cmd("migrate", uri=setup.target)
        src_info = dst_info = {}
        src_done = dst_done = None
        while src_done is None or dst_done is None:
            if src_done is None:
                src_info = sq.cmd("query-migrate")
                if src_info.get("status") in ("completed", "failed", "cancelled"):
                    src_done = time.monotonic() - t0
            if dst_done is None:
                dst_info = dq.cmd("query-migrate")
                if dst_info.get("status") in ("completed", "failed", "cancelled"):
                    dst_done = time.monotonic() - t0
            if "failed" in (src_info.get("status"), dst_info.get("status")):
                break
            if deadline.left() <= 0:
                result["src_status"] = src_info.get("status")
                result["dst_status"] = dst_info.get("status")
                raise Failure("timeout", f"overall timeout ({args.timeout:g} s) during migration")
            time.sleep(0.005)
        if dst_done is None:
            dst_info = dq.cmd("query-migrate")
        result["src_status"] = src_info.get("status")
        result["dst_status"] = dst_info.get("status")
        if src_info.get("status") != "completed" or dst_info.get("status") != "completed":
            msg = src_info.get("error-desc") or dst_info.get("error-desc") or "migration did not complete"
            raise Failure("failed", f"{msg} (source {src_info.get('status')}, destination "
                          f"{dst_info.get('status')})")
        result["seconds"] = round(max(src_done, dst_done), 4)
        finish_stats(src_info, result, pids, cpu0, size)

        for offset in args.corrupt_dst or []:
            poke_destination(dst, offset)
            result.setdefault("corrupted_dst_at", []).append(offset)
        if not args.no_verify:
            deadline.check("dumping the destination RAM")
            dq.cmd("pmemsave", val=0, size=size, filename=dst_dump)
            result["ram_sha256_dst"] = sha256_file(dst_dump)
            same = result["ram_sha256_dst"] == result["ram_sha256_src"]
            if not same:
                first, count = first_difference(src_dump, dst_dump)
                result["ram_first_difference"] = first
                result["ram_differing_bytes"] = count
            if src_window is not None:
                lo, hi = PAM_WINDOW
                window_ok = read_ram_block(dst, lo, hi - lo) == src_window
                result["ram_pam_window"] = "match" if window_ok else "differs"
                same = same and window_ok
            result["ram_match"] = same
            if not args.keep_dumps:
                for f in (src_dump, dst_dump):
                    os.unlink(f)
        result["status"] = "completed"
    finally:
        stop_all(vms, result)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.print_version:
        v = qemu_version(args.qemu)
        print(json.dumps({"qemu_version": ".".join(map(str, v)), "multifd_by_magic": v >= (8, 0, 0)}))
        return 0
    if args.multifd < 0 or not 2 <= args.ram_mib <= 3072:
        # Above 3 GiB the pc machine splits RAM around the PCI hole below 4 GiB.
        print("--multifd must be >= 0 and --ram-mib between 2 and 3072", file=sys.stderr)
        return 2

    if args.role == "both" and (args.ready_file or args.sha_file):
        print("--ready-file and --sha-file need --role source or destination", file=sys.stderr)
        return 2

    def on_signal(signum, _frame):
        raise Failure("killed", f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)

    result = {
        "status": "error",
        "seconds": None,
        "bytes": None,
        "ram_match": None,
        "qemu_version": None,
        "multifd_channels": args.multifd,
    }
    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="qemu-migrate-")
        args.workdir = tmp.name
    result["workdir"] = None if tmp else args.workdir
    try:
        run(args, result)
    except Failure as e:
        result["status"] = e.status
        result["error"] = str(e)
    except Exception as e:  # noqa: BLE001 - every failure ends as one JSON line
        result["status"] = "error"
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        if tmp is not None:
            tmp.cleanup()
    print(json.dumps(result), flush=True)
    if args.role == "both":
        verified = result["ram_match"] is True or (args.no_verify and result["ram_match"] is None)
    else:
        verified = args.no_verify or result.get("ram_sha256") is not None
    return 0 if result["status"] == "completed" and verified else 1


if __name__ == "__main__":
    sys.exit(main())
