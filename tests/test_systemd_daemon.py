"""The real ctxwind under a stand-in service manager: a datagram socket as ``NOTIFY_SOCKET``."""

from __future__ import annotations

import itertools
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests._daemon import DaemonProcess, call

WATCHDOG_USEC = 1_000_000
WATCHDOG_INTERVAL_S = WATCHDOG_USEC / 2_000_000
STATUS_REFRESH_S = 10.0
FIRST_USER = {"role": "user", "content": [{"type": "text", "text": "Add a --verbose flag."}]}
FIRST_ASSISTANT = {"role": "assistant", "content": [{"type": "text", "text": "On it."}]}


@dataclass(frozen=True)
class Notification:
    """One sd_notify datagram as received."""

    at: float
    fields: tuple[str, ...]

    def has(self, field: str) -> bool:
        return field in self.fields

    def value(self, key: str) -> str | None:
        prefix = key + "="
        return next((f[len(prefix) :] for f in self.fields if f.startswith(prefix)), None)


@dataclass(frozen=True)
class ReadySnapshot:
    """What was true at the moment READY=1 was received."""

    socket_file_existed: bool
    state_dir_existed: bool
    ping_ok: bool


class NotifyListener:
    """The service manager's end of ``NOTIFY_SOCKET``, read on a thread.

    At READY=1 it checks, before reading anything else, that the daemon's ipc
    socket file exists, its state dir exists, and the endpoint answers ``ping``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.notifications: list[Notification] = []
        self.ready: ReadySnapshot | None = None
        self.daemon: DaemonProcess | None = None
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        self._sock.settimeout(0.05)
        self._thread = threading.Thread(target=self._run, name="notify-listener", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            note = Notification(time.monotonic(), tuple(data.decode().split("\n")))
            if note.has("READY=1") and self.ready is None and self.daemon is not None:
                self.ready = self._snapshot(self.daemon)
            with self._changed:
                self.notifications.append(note)
                self._changed.notify_all()

    @staticmethod
    def _snapshot(daemon: DaemonProcess) -> ReadySnapshot:
        socket_file = daemon.runtime_dir / "ctxwind.sock"
        existed = socket_file.exists()
        state_existed = daemon.state_dir.is_dir()
        try:
            ping_ok = call(daemon.endpoint, "ping", timeout=5.0).ok
        except TimeoutError:
            ping_ok = False
        return ReadySnapshot(existed, state_existed, ping_ok)

    def wait_until(self, predicate: Callable[[list[Notification]], bool], timeout: float) -> bool:
        """Block until ``predicate`` holds for the notifications so far, or ``timeout`` passes."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self.notifications), timeout)

    def wait_for(
        self, predicate: Callable[[list[Notification]], bool], timeout: float, what: str
    ) -> list[Notification]:
        """Like :meth:`wait_until`, but fail the test after ``timeout``; returns what arrived."""
        if not self.wait_until(predicate, timeout):
            log = self.daemon.log() if self.daemon is not None else ""
            pytest.fail(f"no {what} within {timeout}s; got {self.snapshot()!r}\n{log}")
        return self.snapshot()

    def snapshot(self) -> list[Notification]:
        with self._changed:
            return list(self.notifications)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


def _with(field: str) -> Callable[[list[Notification]], bool]:
    return lambda notes: any(note.has(field) for note in notes)


def _count(field: str, notes: list[Notification]) -> int:
    return sum(note.has(field) for note in notes)


def _counts(status: str) -> dict[str, int]:
    """``{"tasks": n, "requests": m}`` from a STATUS text like ``"2 active tasks, 7 requests"``."""
    found: dict[str, int] = {}
    pattern = r"(\d+)\s+(?:[a-z]+\s+)?(task|request)s?\b"
    for number, word in re.findall(pattern, status, re.IGNORECASE):
        found.setdefault(word.lower() + "s", int(number))
    for word, number in re.findall(r"\b(task|request)s?\s*[=:]\s*(\d+)", status, re.IGNORECASE):
        found.setdefault(word.lower() + "s", int(number))
    return found


def _statuses(notes: list[Notification]) -> list[str]:
    return [status for note in notes if (status := note.value("STATUS")) is not None]


def _statuses_at_least(tasks: int, requests: int) -> Callable[[list[Notification]], bool]:
    """A predicate: some STATUS line counts at least ``tasks`` tasks and ``requests`` requests."""

    def holds(notes: list[Notification]) -> bool:
        for status in _statuses(notes):
            counts = _counts(status)
            if counts.get("tasks", -1) >= tasks and counts.get("requests", -1) >= requests:
                return True
        return False

    return holds


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[NotifyListener]:
    """A datagram socket bound at ``tmp_path/notify.sock``, read on a thread."""
    notify = NotifyListener(tmp_path / "notify.sock")
    try:
        yield notify
    finally:
        notify.close()


def _start(
    tmp_path: Path,
    listener: NotifyListener,
    stop_after: list[DaemonProcess],
    *extra_args: str,
    **env: str,
) -> DaemonProcess:
    """Start ctxwind with ``NOTIFY_SOCKET`` and ``WATCHDOG_USEC`` pointing at ``listener``.

    The daemon joins ``stop_after`` before it starts, so it is stopped even if
    its start fails half-way.
    """
    daemon = DaemonProcess(
        tmp_path,
        *extra_args,
        env={"NOTIFY_SOCKET": str(listener.path), "WATCHDOG_USEC": str(WATCHDOG_USEC), **env},
    )
    # Variables of a runner that itself runs under systemd must not leak in.
    for name in ("WATCHDOG_PID", "INVOCATION_ID", "JOURNAL_STREAM", "LISTEN_FDS", "LISTEN_PID"):
        if name not in env:
            daemon.env.pop(name, None)
    listener.daemon = daemon
    stop_after.append(daemon)
    daemon.start()
    return daemon


@pytest.fixture
def stop_after() -> Iterator[list[DaemonProcess]]:
    """Daemons to stop at the end of the test, whatever happened."""
    daemons: list[DaemonProcess] = []
    yield daemons
    for daemon in daemons:
        daemon.stop()


def test_ready_is_sent_once_the_endpoint_is_bound_and_answers(
    tmp_path: Path, listener: NotifyListener, stop_after: list[DaemonProcess]
) -> None:
    """READY=1 arrives once, when the ipc socket exists, the state dir exists and ping answers."""
    _start(tmp_path, listener, stop_after)

    notes = listener.wait_for(_with("READY=1"), 10, "READY=1")

    assert listener.ready == ReadySnapshot(
        socket_file_existed=True, state_dir_existed=True, ping_ok=True
    )
    assert _count("READY=1", notes) == 1
    assert not any(note.has("STOPPING=1") for note in notes)


def test_watchdog_pings_arrive_at_half_the_watchdog_period(
    tmp_path: Path, listener: NotifyListener, stop_after: list[DaemonProcess]
) -> None:
    """With WATCHDOG_USEC=1s, WATCHDOG=1 comes about every 0.5 s, and only after READY=1."""
    _start(tmp_path, listener, stop_after)

    pings = 7
    notes = listener.wait_for(lambda n: _count("WATCHDOG=1", n) >= pings, 15, f"{pings} pings")

    ready_at = next(note.at for note in notes if note.has("READY=1"))
    times = [note.at for note in notes if note.has("WATCHDOG=1")]
    assert times[0] >= ready_at
    # The first interval may be short (a ping right at start-up); judge the rest.
    mean = (times[-1] - times[1]) / (len(times) - 2)
    assert 0.5 * WATCHDOG_INTERVAL_S <= mean <= 1.6 * WATCHDOG_INTERVAL_S, times
    assert max(b - a for a, b in itertools.pairwise(times[1:])) < WATCHDOG_USEC / 1e6


def test_a_watchdog_for_another_pid_sends_no_pings(
    tmp_path: Path, listener: NotifyListener, stop_after: list[DaemonProcess]
) -> None:
    """With WATCHDOG_PID naming another process, READY=1 comes but WATCHDOG=1 never does."""
    _start(tmp_path, listener, stop_after, WATCHDOG_PID="1")
    listener.wait_for(_with("READY=1"), 10, "READY=1")

    # Watch for three would-be ping intervals; a ping ends the wait early (and fails).
    saw_ping = listener.wait_until(_with("WATCHDOG=1"), 3 * WATCHDOG_INTERVAL_S)

    assert saw_ping is False


def test_status_lines_carry_task_and_request_counts(
    tmp_path: Path, listener: NotifyListener, stop_after: list[DaemonProcess]
) -> None:
    """STATUS= lines report task and request counts, and the counts follow the traffic."""
    daemon = _start(tmp_path, listener, stop_after)
    notes = listener.wait_for(_statuses_at_least(0, 0), 10, "a STATUS line with counts")
    first = next(_counts(status) for status in _statuses(notes) if _counts(status))
    assert sorted(first) == ["requests", "tasks"]

    messages = [FIRST_USER, FIRST_ASSISTANT]
    for task in ("alpha", "beta"):
        reply = daemon.call(
            "apply_truncation_notice", {"task": task, "ts": 1, "messages": messages}
        )
        assert reply.ok, reply
    requests = [daemon.call("ping") for _ in range(3)]
    assert all(reply.ok for reply in requests)

    # ctxwind refreshes its status line every 10 s; allow one refresh and some slack.
    notes = listener.wait_for(
        _statuses_at_least(2, 5), STATUS_REFRESH_S + 5, "a STATUS line with 2 tasks, 5 requests"
    )
    assert all(_statuses(notes)), _statuses(notes)


def test_sigterm_sends_stopping_flushes_state_and_exits_zero(
    tmp_path: Path, listener: NotifyListener, stop_after: list[DaemonProcess]
) -> None:
    """On SIGTERM ctxwind sends STOPPING=1, writes the pending task state and exits 0."""
    # Writes are held back for a minute, so only the shutdown flush can write the task.
    daemon = _start(
        tmp_path, listener, stop_after, "--debounce-ms", "60000", "--debounce-max-ms", "60000"
    )
    listener.wait_for(_with("READY=1"), 10, "READY=1")
    reply = daemon.call(
        "apply_truncation_notice",
        {"task": "gamma", "ts": 1, "messages": [FIRST_USER, FIRST_ASSISTANT]},
    )
    assert reply.ok, reply
    history = daemon.task_dir("gamma") / "context_history.json"
    written_before_stop = history.exists()

    code = daemon.stop()

    notes = listener.wait_for(_with("STOPPING=1"), 5, "STOPPING=1")
    assert code == 0, daemon.log()
    assert written_before_stop is False
    stopping_at = next(note.at for note in notes if note.has("STOPPING=1"))
    ready_at = next(note.at for note in notes if note.has("READY=1"))
    assert ready_at < stopping_at
    assert not any(note.has("READY=1") for note in notes if note.at > stopping_at)
    on_disk: list[Any] = json.loads(history.read_text())
    assert sorted(entry[0] for entry in on_disk) == [0, 1]
