"""Who can reach the daemon: another uid cannot use the default ipc endpoint; TCP binds loopback.

Usage (from the repository root, as root)::

    .venv/bin/python -m bench.reliability.access [--quick] [--json]

Checks:

- the default endpoint (``$XDG_RUNTIME_DIR/ctxwin/ctxwind.sock``, and
  ``$TMPDIR/ctxwin-<uid>/ctxwind.sock`` when ``XDG_RUNTIME_DIR`` is unset)
  sits in a 0700 directory (tightened when it existed with wider bits) with a
  0600 socket; the owner's client gets ``ping`` answered; a client run as
  uid 65534 with ``setpriv`` gets EACCES from ``connect(2)`` and no reply over
  ZeroMQ;
- a default socket directory that another uid created first (mode 0777, as
  anyone can on a shared temp dir) is refused rather than used;
- an explicit ipc endpoint in a directory of the daemon's own uid that others
  can write (0777), where another uid could replace the socket, is refused;
  so is a config file another uid owns, or one others can write (0666);
- TCP endpoints on loopback names bind only loopback addresses (read back
  from ``/proc/net/tcp*`` for the daemon's own sockets), and endpoints on
  ``*``, ``0.0.0.0`` or ``[::]`` are refused at start without ``--allow-remote``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.reliability._harness import (
    NOBODY,
    REPO,
    Client,
    Daemon,
    arguments,
    as_uid,
    emit,
    machine,
    scratch,
)
from tests._daemon import DaemonProcess, free_port

# Run as the other uid: connect(2) to the socket, then a ZeroMQ ping with a short timeout.
_PROBE = r"""
import json, socket, sys, zmq
from ctxwin import proto
path = sys.argv[1]
result = {"uid": __import__("os").getuid()}
raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    raw.connect(path)
    result["connect"] = "connected"
except OSError as exc:
    result["connect"] = __import__("errno").errorcode.get(exc.errno, str(exc.errno))
finally:
    raw.close()
ctx = zmq.Context()
sock = ctx.socket(zmq.DEALER)
sock.setsockopt(zmq.LINGER, 0)
sock.connect("ipc://" + path)
sock.send(proto.encode_request(1, "ping", {}))
result["zmq"] = "reply" if sock.poll(int(float(sys.argv[2]) * 1000)) else "no reply"
sock.close(0)
ctx.term()
print(json.dumps(result))
"""


@dataclass
class IpcOutcome:
    """What the default ipc endpoint showed."""

    layout: str
    endpoint: str
    dir_mode: str
    socket_mode: str
    preexisting_dir_tightened: bool
    owner_ping: bool
    other_uid: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Whether the endpoint is private."""
        return (
            self.dir_mode == "0o700"
            and self.socket_mode == "0o600"
            and self.preexisting_dir_tightened
            and self.owner_ping
            and self.other_uid.get("uid") == NOBODY
            and self.other_uid.get("connect") == "EACCES"
            and self.other_uid.get("zmq") == "no reply"
        )


def check_default_ipc(root: Path, layout: str, wait: float = 1.0) -> IpcOutcome:
    """Start a daemon on its default endpoint under ``root`` and probe it as another uid.

    Args:
        root: a directory the other uid can traverse (0755 from ``/`` down).
        layout: ``xdg`` (``XDG_RUNTIME_DIR`` set) or ``tmpdir`` (only ``TMPDIR`` set).
        wait: how long the other uid waits for a ZeroMQ reply.
    """
    base = root / layout
    base.mkdir(mode=0o755)
    env: dict[str, str | None] = {"HOME": str(base), "XDG_CONFIG_HOME": str(base)}
    if layout == "xdg":
        env["XDG_RUNTIME_DIR"] = str(base)
    else:
        # Removed before the daemon's endpoint is worked out: never the caller's own dir.
        env["XDG_RUNTIME_DIR"] = None
        env["TMPDIR"] = str(base)
    daemon = Daemon(root, env=env, default_endpoint=True)
    # A directory left with wide bits must be tightened before the socket appears in it.
    daemon.runtime_dir.mkdir(mode=0o755)
    daemon.runtime_dir.chmod(0o755)
    socket_path = daemon.endpoint[len("ipc://") :]
    daemon.start()
    try:
        dir_mode = stat.S_IMODE(daemon.runtime_dir.stat().st_mode)
        sock_mode = stat.S_IMODE(os.stat(socket_path).st_mode)
        client = Client(daemon.endpoint)
        try:
            owner_ping = client.call("ping", timeout=5).ok
        finally:
            client.close()
        probe = subprocess.run(
            [*as_uid(NOBODY, root / "stage"), sys.executable, "-c", _PROBE, socket_path, str(wait)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            cwd=REPO,
            env={**daemon.env, "HOME": str(base)},
        )
        try:
            other = json.loads(probe.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            other = {"error": (probe.stderr or probe.stdout)[-500:]}
    finally:
        daemon.stop()
    return IpcOutcome(
        layout=layout,
        endpoint=daemon.endpoint,
        dir_mode=oct(dir_mode),
        socket_mode=oct(sock_mode),
        preexisting_dir_tightened=dir_mode == 0o700,
        owner_ping=owner_ping,
        other_uid=other,
    )


@dataclass
class ForeignDirOutcome:
    """What the daemon did with a default socket dir that another uid owns."""

    dir_owner: int
    dir_mode: str
    started: bool
    detail: str

    @property
    def passed(self) -> bool:
        """Whether the daemon refused to put its socket there."""
        return not self.started


def check_foreign_dir(root: Path) -> ForeignDirOutcome:
    """Pre-create ``$TMPDIR/ctxwin-<uid>`` owned by uid 65534, mode 0777, and start the daemon.

    On a shared temp dir anyone can create that directory first; a daemon that
    binds inside it lets its owner replace the socket and receive the clients.
    """
    base = root / "foreign"
    base.mkdir()
    base.chmod(0o1777)
    daemon = Daemon(
        root / "foreign-daemon",
        # Without XDG_RUNTIME_DIR (removed before the endpoint is worked out) the
        # default socket goes under TMPDIR.
        env={"TMPDIR": str(base), "XDG_CONFIG_HOME": str(root), "XDG_RUNTIME_DIR": None},
        default_endpoint=True,
    )
    (root / "foreign-daemon").mkdir()
    daemon.runtime_dir.mkdir()
    os.chown(daemon.runtime_dir, NOBODY, NOBODY)
    daemon.runtime_dir.chmod(0o777)
    try:
        daemon.start(timeout=10)
    except (RuntimeError, TimeoutError) as exc:
        return ForeignDirOutcome(NOBODY, "0o777", False, str(exc).strip()[-300:])
    info = daemon.runtime_dir.stat()
    daemon.stop()
    return ForeignDirOutcome(
        info.st_uid, oct(stat.S_IMODE(info.st_mode)), True, "bound its socket in that directory"
    )


@dataclass
class WritableOutcome:
    """What the daemon did with files and directories another uid can write."""

    refused: dict[str, str]

    @property
    def passed(self) -> bool:
        """Whether each start was refused."""
        return all(not reason.startswith("exit 0") for reason in self.refused.values())


def check_writable_by_others(root: Path) -> WritableOutcome:
    """Start the daemon with a socket dir of its uid that others can write, then with a
    config file of uid 65534, then with its own config file mode 0666; each must refuse."""
    base = root / "writable"
    base.mkdir()
    open_dir = base / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    foreign, loose = base / "foreign.toml", base / "loose.toml"
    for path in (foreign, loose):
        path.write_text("max_tasks = 1\n")
    os.chown(foreign, NOBODY, NOBODY)
    loose.chmod(0o666)
    cases = {
        "socket dir 0777 of the daemon's uid": ["--endpoint", f"ipc://{open_dir}/d.sock"],
        "config file of uid 65534": ["--config", str(foreign)],
        "config file 0666": ["--config", str(loose)],
    }
    refused: dict[str, str] = {}
    for name, argv in cases.items():
        endpoint = argv[1] if argv[0] == "--endpoint" else f"ipc://{base}/{len(refused)}.sock"
        command = [sys.executable, "-m", "ctxwin.daemon", *argv, "--state-dir", str(base / "s")]
        if argv[0] != "--endpoint":
            command += ["--endpoint", endpoint]
        try:
            result = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
                env={**os.environ, "XDG_CONFIG_HOME": str(base)},
            )
        except subprocess.TimeoutExpired:
            refused[name] = "exit 0: started and kept running"
            continue
        refused[name] = f"exit {result.returncode}: {result.stderr.strip()[-200:]}"
    return WritableOutcome(refused)


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    # /proc/net/tcp6: four 32-bit words, each in host (little-endian) order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return str(ipaddress.IPv6Address(words))


def listening_addresses(pid: int) -> list[str]:
    """``address:port`` of every TCP socket the process listens on."""
    inodes = _socket_inodes(pid)
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:
                address, port = local.split(":")
                found.append(f"{_address(address)}:{int(port, 16)}")
    return sorted(found)


@dataclass
class TcpOutcome:
    """Where TCP endpoints ended up."""

    endpoints: list[str]
    listening: list[str]
    refused: dict[str, str]

    @property
    def passed(self) -> bool:
        """Whether everything bound is loopback and every wildcard was refused."""
        loopback = all(
            ipaddress.ip_address(item.rpartition(":")[0]).is_loopback for item in self.listening
        )
        return (
            loopback
            and len(self.listening) == len(self.endpoints)
            and all(reason.startswith("exit 2") for reason in self.refused.values())
        )


def check_tcp(root: Path) -> TcpOutcome:
    """Bind loopback TCP endpoints, read back what is listening, and try wildcard ones."""
    endpoints = [f"tcp://localhost:{free_port()}", f"tcp://127.0.0.1:{free_port()}"]
    args = [part for endpoint in endpoints for part in ("--endpoint", endpoint)]
    daemon = Daemon(root / "tcp", *args, env={"XDG_CONFIG_HOME": str(root)})
    (root / "tcp").mkdir()
    daemon.start()
    try:
        listening = listening_addresses(daemon.pid)
        client = Client(endpoints[0])
        try:
            assert client.call("ping", timeout=5).ok
        finally:
            client.close()
    finally:
        daemon.stop()
    refused = {}
    for wildcard in (f"tcp://*:{free_port()}", f"tcp://0.0.0.0:{free_port()}", "tcp://[::]:0"):
        config = {"XDG_CONFIG_HOME": str(root)}
        result = DaemonProcess(root / "wild", endpoint=wildcard, env=config).run_to_exit()
        refused[wildcard] = f"exit {result.returncode}: {result.stderr.strip()[-160:]}"
    return TcpOutcome(endpoints, listening, refused)


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--quick", action="store_true", help="same checks (they are short)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("access.py needs root (setpriv to another uid)", file=sys.stderr)
        return 2
    with scratch("ctxwin-access-") as root:
        root.chmod(0o755)
        ipc = [check_default_ipc(root, layout) for layout in ("xdg", "tmpdir")]
        foreign = check_foreign_dir(root)
        writable = check_writable_by_others(root)
        tcp = check_tcp(root)
    summary = {
        "machine": machine(),
        "ipc": {o.layout: {**asdict(o), "passed": o.passed} for o in ipc},
        "foreign_owned_socket_dir": {**asdict(foreign), "passed": foreign.passed},
        "writable_by_others": {**asdict(writable), "passed": writable.passed},
        "tcp": {**asdict(tcp), "passed": tcp.passed},
    }
    emit("access", summary, args.json)
    passed = all(o.passed for o in ipc) and tcp.passed and foreign.passed and writable.passed
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
