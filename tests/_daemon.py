"""Start and stop a real ctxwind subprocess for end-to-end tests."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import zmq

from ctxwin import proto
from tests._service import Service, terminate

_ids = itertools.count(1)


class WirePeer:
    """A raw ZeroMQ socket (DEALER unless ``kind``) connected to a daemon, closed with linger 0.

    For the tests that speak the wire themselves: frames, envelopes, request ids. Replies
    are awaited ``timeout`` seconds unless a call says otherwise.
    """

    def __init__(self, endpoint: str, kind: int = zmq.DEALER, timeout: float = 10.0) -> None:
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.sock = context.socket(kind)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.kind = kind
        self.endpoint = endpoint
        self.timeout = timeout

    def __enter__(self) -> WirePeer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def send(self, request_id: int, op: str, args: dict[str, Any] | None = None) -> None:
        self.sock.send(proto.encode_request(request_id, op, args or {}))

    def send_frames(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def recv(self, timeout: float | None = None) -> proto.Reply:
        return proto.decode_reply(self.recv_frames(timeout)[-1])

    def recv_frames(self, timeout: float | None = None) -> list[bytes]:
        wait = self.timeout if timeout is None else timeout
        if not self.sock.poll(int(wait * 1000)):
            raise TimeoutError(f"no reply from {self.endpoint} within {wait}s")
        return self.sock.recv_multipart()

    def call(
        self, op: str, args: dict[str, Any] | None = None, timeout: float | None = None
    ) -> proto.Reply:
        """One request with a fresh id; its reply, which must carry that id."""
        request_id = next(_ids)
        self.send(request_id, op, args)
        reply = self.recv(timeout)
        assert reply.id == request_id, (reply.id, request_id)
        return reply

    def result(
        self, op: str, args: dict[str, Any] | None = None, timeout: float | None = None
    ) -> dict[str, Any]:
        """The result of a request that must succeed."""
        reply = self.call(op, args, timeout)
        assert reply.ok, f"{op}: {reply.code}: {reply.message}"
        assert reply.result is not None
        return reply.result

    def close(self) -> None:
        self.sock.close(linger=0)


class Connect(Protocol):
    """The ``wire_peer`` fixture: open a :class:`WirePeer` that is closed when the test ends."""

    def __call__(self, endpoint: str, kind: int = zmq.DEALER) -> WirePeer: ...


def call(
    endpoint: str, op: str, args: dict[str, Any] | None = None, timeout: float = 10.0
) -> proto.Reply:
    """One request over a fresh DEALER socket; returns the decoded reply."""
    with WirePeer(endpoint) as peer:
        return peer.call(op, args, timeout)


def _count_start() -> None:
    """Append the starting test's id to the file named by ``$CTXWIN_TEST_DAEMON_COUNT``.

    One line per daemon start, so a run's number of daemons (and who starts them)
    can be counted: ``CTXWIN_TEST_DAEMON_COUNT=/tmp/starts python3 dev.py test``.
    """
    path = os.environ.get("CTXWIN_TEST_DAEMON_COUNT")
    if path:
        with open(path, "a") as out:  # a line under PIPE_BUF: appends never interleave
            out.write(os.environ.get("PYTEST_CURRENT_TEST", "?") + "\n")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class DaemonProcess(Service):
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

    def leave(self, failing: bool) -> None:
        """Stop; unless the block raised already, require exit 0."""
        code = self.stop()
        if not failing:
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
        _count_start()
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
                self.kill()  # a daemon that never answered is not left running
                raise TimeoutError(f"ctxwind did not answer ping:\n{self.log()}")

    def run_to_exit(self, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run the daemon in the foreground until it exits, as one that refuses to start does;
        its exit code and output."""
        return subprocess.run(
            self.argv,
            env=self.env,
            preexec_fn=self.preexec_fn,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait, and return the exit code (kills after ``timeout``)."""
        if self.proc is None:
            return 0
        code = terminate(self.proc, timeout)
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


class DaemonFactory:
    """Daemons shared by every test that asks for the same configuration.

    A daemon is started on the first request of its arguments, environment and
    config file text, answers every later one, and stops (exit 0 required) at
    :meth:`close`. Tests that share one use task ids of their own and never stop,
    kill or corrupt it; those that do start a :class:`DaemonProcess` of their own.
    """

    def __init__(self, make_root: Callable[[str], Path]) -> None:
        self._make_root = make_root
        self._read: dict[Path, int] = {}  # how far each daemon's log is read
        self._owners: dict[tuple[Path, str], str] = {}  # (daemon, task) -> the test using it
        self._daemons: dict[
            tuple[tuple[str, ...], tuple[tuple[str, str], ...], str | None, str], DaemonProcess
        ] = {}

    def __call__(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        config: str | None = None,
        group: str = "",
    ) -> DaemonProcess:
        """The running daemon of this configuration (``config``: a ``--config`` file's text).

        ``group`` names a daemon of its own for tests that must use the same task ids as
        others of their configuration (both wire modules replay the conformance scenarios).
        """
        key = (args, tuple(sorted((env or {}).items())), config, group)
        daemon = self._daemons.get(key)
        if daemon is None:
            root = self._make_root("shared")
            if config is not None:
                (root / "ctxwind.toml").write_text(config)
                args = (*args, "--config", str(root / "ctxwind.toml"))
            daemon = self._daemons[key] = DaemonProcess(root, *args, env=env)
            daemon.start()
        if daemon.proc is None or daemon.proc.poll() is not None:
            raise AssertionError(f"a shared daemon was stopped:\n{daemon.log()}")
        return daemon

    def claim(self, test: str) -> list[str]:
        """Give ``test`` the tasks the shared daemons started since the last claim, and close
        them; return those an earlier test had used. A task closed after each test starts
        again in any later test that uses it, so the reuse shows in the log."""
        taken: list[str] = []
        for daemon in self._daemons.values():
            for task in self._started(daemon):
                owner = self._owners.setdefault((daemon.root, task), test)
                if owner != test:
                    taken.append(f"task {task!r} of a shared daemon was {owner}'s")
                reply = daemon.call("close", {"task": task})
                assert reply.ok, (task, reply)
            self._started(daemon)  # the actors the closes stopped
        return taken

    def _started(self, daemon: DaemonProcess) -> set[str]:
        """The tasks whose actors ``daemon`` logged starting since the last read."""
        with daemon.log_path.open("rb") as log:
            log.seek(self._read.get(daemon.root, 0))
            lines = log.readlines()
        if lines and not lines[-1].endswith(b"\n"):
            lines.pop()  # a line still being written: read it next time
        self._read[daemon.root] = self._read.get(daemon.root, 0) + sum(map(len, lines))
        events = [json.loads(line) for line in lines if line.startswith(b"{")]
        return {e["task"] for e in events if e.get("event") == "actor_started"}

    def close(self) -> None:
        """Stop every daemon; each must exit 0."""
        codes = {daemon.root: daemon.stop() for daemon in self._daemons.values()}
        self._daemons.clear()
        assert dict.fromkeys(codes, 0) == codes


def wait_until(
    predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.01
) -> None:
    """Poll ``predicate`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting until {what}")
        time.sleep(interval)
