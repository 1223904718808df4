"""Start and stop a real ctxwind subprocess for end-to-end tests."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import zmq

from ctxwin import proto

_ids = itertools.count(1)


def call(
    endpoint: str, op: str, args: dict[str, Any] | None = None, timeout: float = 10.0
) -> proto.Reply:
    """One request over a fresh DEALER socket; returns the decoded reply."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        request_id = next(_ids)
        sock.send(proto.encode_request(request_id, op, args or {}))
        if not sock.poll(int(timeout * 1000)):
            raise TimeoutError(f"no reply to {op} from {endpoint} within {timeout}s")
        return proto.decode_reply(sock.recv())
    finally:
        sock.close(linger=0)


class DaemonProcess:
    """A ctxwind subprocess with its own ipc endpoint and state dir under ``root``."""

    def __init__(
        self,
        root: Path,
        *extra_args: str,
        env: dict[str, str] | None = None,
        preexec_fn: Callable[[], None] | None = None,
        endpoint: str | None = None,
    ) -> None:
        self.root = root
        self.runtime_dir = root / "run"
        self.state_dir = root / "state"
        self.endpoint = endpoint or f"ipc://{self.runtime_dir / 'ctxwind.sock'}"
        self.log_path = root / "ctxwind.log"
        self.extra_args = list(extra_args)
        self.env = dict(os.environ)
        self.env.pop("NOTIFY_SOCKET", None)
        self.env.pop("WATCHDOG_USEC", None)
        self.env.update(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.preexec_fn = preexec_fn

    def __enter__(self) -> DaemonProcess:
        """Start (see :meth:`start`); on leaving, stop and require exit 0 unless already failing."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        code = self.stop()
        if exc_type is None:
            assert code == 0, f"ctxwind exited with {code}:\n{self.log()}"

    @property
    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "ctxwin.daemon",
            "--endpoint",
            self.endpoint,
            "--state-dir",
            str(self.state_dir),
            "--log-format",
            "json",
            *self.extra_args,
        ]

    def task_dir(self, task: str) -> Path:
        return self.state_dir / "tasks" / task

    def tasks_left(self) -> list[str]:
        """The tasks the daemon would keep on disk: all loaded tasks are written first."""
        reply = call(self.endpoint, "flush", {})
        assert reply.ok, reply
        tasks = self.state_dir / "tasks"
        return sorted(path.name for path in tasks.iterdir()) if tasks.is_dir() else []

    def start(self, timeout: float = 20.0) -> None:
        """Start the daemon and wait until it answers ``ping``."""
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            preexec_fn=self.preexec_fn,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ctxwind exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if call(self.endpoint, "ping", timeout=0.5).ok:
                    return
            except TimeoutError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"ctxwind did not answer ping:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait, and return the exit code (kills after ``timeout``)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code

    def kill(self) -> None:
        """SIGKILL: no flush, no clean-up."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def call(
        self, op: str, args: dict[str, Any] | None = None, timeout: float = 10.0
    ) -> proto.Reply:
        return call(self.endpoint, op, args, timeout)


def wait_until(
    predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.01
) -> None:
    """Poll ``predicate`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting until {what}")
        time.sleep(interval)
