"""Start and stop a real redis-server child process for the Redis store's tests.

The server listens on a unix socket only (``--port 0``), keeps an append-only
file fsynced on every write, and no RDB snapshots, in its own directory.
Readiness is read from its log ("Ready to accept connections"), not polled.
Without ``redis-server`` on PATH the tests that need it skip, except in CI
(``CTXWIN_CI`` or ``CI`` set), where they fail.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from tests._service import Service, terminate

__all__ = ["REDIS_SERVER", "RedisServer", "require_redis_server"]

REDIS_SERVER = shutil.which("redis-server")
_CI = bool(os.environ.get("CI") or os.environ.get("CTXWIN_CI"))
_READY = b"ready to accept connections"  # 7.0: "...at <path>"; 7.2+: "Ready ... unix"


def require_redis_server() -> str:
    """The path of ``redis-server``; skips the test without it, fails in CI."""
    if REDIS_SERVER is None:
        reason = "redis-server is not installed (Debian: apt-get install redis-server)"
        if _CI:
            pytest.fail(f"{reason}; CI must have it (.ci/run installs it)")
        pytest.skip(reason)
    return REDIS_SERVER


class RedisServer(Service):
    """A redis-server in ``root`` on ``root/redis.sock``; start, kill -9, restart, stop.

    Args:
        root: an empty directory of its own (AOF and log live there).
        extra: more ``redis-server`` arguments (``--maxmemory 1mb``, say).
    """

    def __init__(self, root: Path, *extra: str) -> None:
        self.root = root
        self.socket = root / "redis.sock"
        self.url = f"unix://{self.socket}"
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = root / "redis.log"
        self._reader: threading.Thread | None = None

    @property
    def argv(self) -> list[str]:
        return [
            require_redis_server(),
            "--port",
            "0",
            "--unixsocket",
            str(self.socket),
            "--unixsocketperm",
            "700",
            "--dir",
            str(self.root),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            "",
            *self.extra,
        ]

    def start(self, timeout: float = 20.0) -> None:
        """Start the server and return once its log says it accepts connections."""
        self.root.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=self.root
        )
        self.proc = proc
        ready = threading.Event()
        assert proc.stdout is not None
        stdout = proc.stdout

        def read() -> None:
            # Copies the log to a file and signals readiness; ends at EOF (the server exited).
            with self.log_path.open("ab") as log:
                for line in stdout:
                    log.write(line)
                    log.flush()
                    if _READY in line.lower():
                        ready.set()
            ready.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if not ready.wait(timeout) or proc.poll() is not None:
            self.kill()
            raise RuntimeError(f"redis-server did not start:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _reap(self) -> None:
        # The reader first: it ends at the log's EOF, and a pipe closed under it
        # would raise in its thread.
        if self.proc is not None:
            self.proc.wait()
        if self._reader is not None:
            self._reader.join(5)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None
        self._reader = None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (the server finishes its AOF), wait; kill after ``timeout``."""
        if self.proc is not None:
            terminate(self.proc, timeout)
            self._reap()

    def kill(self) -> None:
        """SIGKILL: what the AOF holds is what survives."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self._reap()

    def pause(self) -> None:
        """SIGSTOP: the socket stays, nothing answers (an unreachable server)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
