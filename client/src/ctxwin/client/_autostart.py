"""Start ``ctxwind`` when nothing answers (``autostart=True``; off by default).

Two clients that race here end with one daemon: they serialise on a lock file
next to the socket, and the second one finds the first one's daemon answering.
Should a daemon be started by someone else at the same moment anyway, the
daemon's own lock makes the late one exit non-zero, which is harmless here:
success is "something answers ping", whoever started it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import zmq

from ctxwin import proto

from ._errors import DaemonUnavailableError

AUTOSTART_TIMEOUT = 20.0
"""Seconds to wait for a started daemon to answer ``ping``."""

_PROBE_TIMEOUT = 0.5
_LOCK_NAME = "autostart.lock"
_LOG_NAME = "ctxwind-autostart.log"

# Runs in a short-lived intermediate interpreter so that the daemon is not our
# child: it is reparented at once and never becomes a zombie of the caller.
_SPAWN = (
    "import subprocess, sys\n"
    "log = open(sys.argv[1], 'ab')\n"
    "subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=log, stderr=log,"
    " start_new_session=True, close_fds=True)\n"
)


def socket_missing(endpoint: str) -> str | None:
    """Why nothing can answer at an ipc endpoint (no socket file, no access), or None."""
    path = proto.ipc_path(endpoint)
    if path is None:
        return None
    try:
        if path.exists():
            return None
    except PermissionError:
        return f"permission denied on the way to {path}"
    return f"no socket at {path}"


def runtime_dir_for(endpoint: str) -> Path:
    """Where the lock and log of an autostart for ``endpoint`` live."""
    path = proto.ipc_path(endpoint)
    return path.parent if path is not None else proto.default_runtime_dir()


def ping(endpoint: str, timeout: float) -> bool:
    """Whether something answers ``ping`` at ``endpoint`` within ``timeout`` seconds."""
    if socket_missing(endpoint) is not None:
        return False
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send(proto.encode_request(0, "ping", {}))
        if not sock.poll(max(1, int(timeout * 1000))):
            return False
        reply = proto.decode_reply(sock.recv_multipart()[-1])
        return reply.ok
    except (zmq.ZMQError, proto.ProtocolError):
        return False
    finally:
        sock.close(linger=0)


def daemon_command(endpoint: str) -> list[str]:
    """The command line that starts ``ctxwind`` on ``endpoint``.

    Raises:
        DaemonUnavailableError: no ``ctxwind`` next to this interpreter nor on PATH.
    """
    sibling = Path(sys.executable).with_name("ctxwind")
    found = str(sibling) if sibling.exists() else shutil.which("ctxwind")
    if found is None:
        raise DaemonUnavailableError(
            "cannot autostart: ctxwind is not installed next to this Python nor on PATH",
            endpoint=endpoint,
        )
    return [found, "--endpoint", endpoint]


@contextlib.contextmanager
def _locked(path: Path, deadline: float) -> Iterator[None]:
    import fcntl  # POSIX only, like the ipc endpoints this serves

    with path.open("a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise DaemonUnavailableError(
                        f"cannot autostart: {path} stays locked by another client"
                    ) from None
                time.sleep(0.02)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _spawn(command: list[str], log: Path) -> None:
    env = dict(os.environ)
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID"):
        env.pop(name, None)
    subprocess.run(
        [sys.executable, "-c", _SPAWN, str(log), *command],
        env=env,
        check=True,
        stdin=subprocess.DEVNULL,
        timeout=30,
    )


def ensure_daemon(endpoint: str, timeout: float = AUTOSTART_TIMEOUT) -> bool:
    """Make sure a daemon answers at ``endpoint``, starting ``ctxwind`` if none does.

    Blocking; the asyncio client runs it in a worker thread.

    Args:
        endpoint: where the daemon should answer.
        timeout: seconds to wait, lock and start-up included.

    Returns:
        True when this call started the daemon, False when one already answered.

    Raises:
        DaemonUnavailableError: nothing answers by the deadline (the message
            holds the end of the daemon's log).
    """
    if ping(endpoint, _PROBE_TIMEOUT):
        return False
    deadline = time.monotonic() + timeout
    directory = runtime_dir_for(endpoint)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    log = directory / _LOG_NAME
    with _locked(directory / _LOCK_NAME, deadline):
        if ping(endpoint, _PROBE_TIMEOUT):
            return False
        _spawn(daemon_command(endpoint), log)
        while time.monotonic() < deadline:
            if socket_missing(endpoint) is not None:
                time.sleep(0.02)
            elif ping(endpoint, _PROBE_TIMEOUT):
                return True
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise DaemonUnavailableError(
        f"started ctxwind but nothing answered within {timeout:g}s; its log ends:\n{tail}",
        endpoint=endpoint,
    )
