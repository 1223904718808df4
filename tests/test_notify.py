"""The sd_notify client, tested against a real datagram socket in a temp dir."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from ctxwin.daemon._notify import Notifier, running_under_systemd

_NOTIFY_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class Receiver:
    """A bound AF_UNIX datagram socket playing the service manager's side."""

    def __init__(self, sock: socket.socket, notify_socket: str) -> None:
        self.sock = sock
        self.notify_socket = notify_socket

    def recv(self, timeout: float = 5.0) -> str:
        """The next datagram, decoded; raises TimeoutError when none arrives in time."""
        self.sock.settimeout(timeout)
        return self.sock.recv(4096).decode()

    def pending(self) -> list[str]:
        """Every datagram already queued, without waiting."""
        messages: list[str] = []
        self.sock.setblocking(False)
        try:
            while True:
                messages.append(self.sock.recv(4096).decode())
        except BlockingIOError:
            return messages


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    """A datagram socket bound at ``tmp_path/notify.sock``."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(str(path))
        yield Receiver(sock, str(path))
    finally:
        sock.close()


@pytest.fixture
def abstract_receiver() -> Iterator[Receiver]:
    """A datagram socket bound to a unique abstract-namespace name."""
    name = f"ctxwin-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind("\0" + name)
        yield Receiver(sock, "@" + name)
    finally:
        sock.close()


@pytest.fixture(autouse=True)
def _clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start every test without the notification variables of the runner itself."""
    for name in _NOTIFY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_without_notify_socket_the_notifier_is_disabled_and_silent() -> None:
    """Outside systemd the notifier is disabled, has no watchdog and sends nothing."""
    notifier = Notifier.from_environ({"WATCHDOG_USEC": "1000000"})

    assert notifier.enabled is False
    assert notifier.watchdog_interval is None
    with capture_logs() as logs:
        notifier.ready()
        notifier.status("serving")
        notifier.watchdog()
        notifier.stopping()
        notifier.notify("X=1")
    assert logs == []


@pytest.mark.parametrize("value", ["", "relative/path.sock", "vsock:2:1234", "@"])
def test_notify_socket_that_is_not_a_unix_address_disables_the_notifier(value: str) -> None:
    """An empty, relative or non-AF_UNIX ``NOTIFY_SOCKET`` disables the notifier."""
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": value})

    assert notifier.enabled is False
    notifier.ready()


def test_messages_reach_a_socket_bound_at_a_path(receiver: Receiver) -> None:
    """READY, STATUS, STOPPING and multi-field messages arrive as sent, in order."""
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": receiver.notify_socket})

    assert notifier.enabled is True
    notifier.ready()
    notifier.status("tasks=2 requests=7")
    notifier.notify("STATUS=flushing", "EXTEND_TIMEOUT_USEC=5000000")
    notifier.stopping()

    assert receiver.recv() == "READY=1"
    assert receiver.recv() == "STATUS=tasks=2 requests=7"
    assert receiver.recv() == "STATUS=flushing\nEXTEND_TIMEOUT_USEC=5000000"
    assert receiver.recv() == "STOPPING=1"


def test_messages_reach_an_abstract_namespace_socket(abstract_receiver: Receiver) -> None:
    """A ``NOTIFY_SOCKET`` starting with ``@`` names an abstract-namespace socket."""
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": abstract_receiver.notify_socket})

    notifier.ready()

    assert abstract_receiver.recv() == "READY=1"


def test_status_text_is_sent_on_one_line(receiver: Receiver) -> None:
    """Line breaks in a status text become spaces, so it stays one protocol field."""
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": receiver.notify_socket})

    notifier.status("tasks=1\nrequests=2\r\n")

    assert receiver.recv() == "STATUS=tasks=1 requests=2"


def test_watchdog_interval_is_half_of_watchdog_usec(receiver: Receiver) -> None:
    """With ``WATCHDOG_USEC`` and no ``WATCHDOG_PID`` the ping interval is half the period."""
    notifier = Notifier.from_environ(
        {"NOTIFY_SOCKET": receiver.notify_socket, "WATCHDOG_USEC": "3000000"}
    )

    assert notifier.watchdog_interval == 1.5
    notifier.watchdog()
    assert receiver.recv() == "WATCHDOG=1"


def test_watchdog_for_this_pid_is_honoured(receiver: Receiver) -> None:
    """A ``WATCHDOG_PID`` equal to our pid keeps the watchdog on."""
    notifier = Notifier.from_environ(
        {
            "NOTIFY_SOCKET": receiver.notify_socket,
            "WATCHDOG_USEC": "1000000",
            "WATCHDOG_PID": str(os.getpid()),
        }
    )

    assert notifier.watchdog_interval == 0.5
    notifier.watchdog()
    assert receiver.recv() == "WATCHDOG=1"


@pytest.mark.parametrize(
    "pid", [str(os.getpid() + 1), "0", "not-a-pid"], ids=["next-pid", "zero", "not-a-pid"]
)
def test_watchdog_for_another_pid_is_ignored(receiver: Receiver, pid: str) -> None:
    """A ``WATCHDOG_PID`` naming another process turns the watchdog off but not the rest."""
    notifier = Notifier.from_environ(
        {"NOTIFY_SOCKET": receiver.notify_socket, "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": pid}
    )

    assert notifier.watchdog_interval is None
    notifier.watchdog()
    notifier.notify("MARK=1")
    assert receiver.recv() == "MARK=1"
    assert receiver.pending() == []


@pytest.mark.parametrize("usec", ["0", "-5", "soon", ""])
def test_invalid_watchdog_usec_means_no_watchdog(receiver: Receiver, usec: str) -> None:
    """A ``WATCHDOG_USEC`` that is not a positive integer means no watchdog."""
    notifier = Notifier.from_environ(
        {"NOTIFY_SOCKET": receiver.notify_socket, "WATCHDOG_USEC": usec}
    )

    assert notifier.enabled is True
    assert notifier.watchdog_interval is None


def test_variables_are_removed_from_os_environ_for_children(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading ``os.environ`` removes the variables, so a child process does not see them."""
    monkeypatch.setenv("NOTIFY_SOCKET", receiver.notify_socket)
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))

    notifier = Notifier.from_environ()

    assert notifier.enabled is True
    assert notifier.watchdog_interval == 0.5
    assert [name for name in _NOTIFY_VARIABLES if name in os.environ] == []
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os; print(sorted(k for k in os.environ if "
            "k in ('NOTIFY_SOCKET', 'WATCHDOG_USEC', 'WATCHDOG_PID')))",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert child.stdout.strip() == "[]"


def test_a_given_mapping_is_read_and_left_alone(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mapping other than ``os.environ`` is only read; ``os.environ`` is not touched."""
    monkeypatch.setenv("NOTIFY_SOCKET", "/elsewhere.sock")
    environ = {"NOTIFY_SOCKET": receiver.notify_socket, "WATCHDOG_USEC": "1000000"}

    Notifier.from_environ(environ)

    assert environ == {"NOTIFY_SOCKET": receiver.notify_socket, "WATCHDOG_USEC": "1000000"}
    assert os.environ["NOTIFY_SOCKET"] == "/elsewhere.sock"


def test_a_send_failure_is_logged_at_debug_and_swallowed(tmp_path: Path) -> None:
    """Sending to a socket that is gone raises nothing and logs one debug event."""
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": str(tmp_path / "missing.sock")})

    with capture_logs() as logs:
        notifier.ready()

    assert [(entry["event"], entry["log_level"]) for entry in logs] == [("notify_failed", "debug")]
    assert logs[0]["fields"] == ["READY"]


def test_a_send_to_a_non_socket_path_is_swallowed(tmp_path: Path) -> None:
    """A ``NOTIFY_SOCKET`` naming a regular file makes sends fail quietly."""
    path = tmp_path / "not-a-socket"
    path.write_text("")
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": str(path)})

    notifier.ready()
    notifier.stopping()


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, False),
        ({"INVOCATION_ID": ""}, False),
        ({"INVOCATION_ID": "0d6c3c0e6f0b4f0e9a4a8d3b7f1e2c11"}, True),
        ({"JOURNAL_STREAM": "8:12345"}, True),
        ({"NOTIFY_SOCKET": "/run/systemd/notify"}, False),
    ],
)
def test_running_under_systemd_looks_at_invocation_id_and_journal_stream(
    environ: dict[str, str], expected: bool
) -> None:
    """``INVOCATION_ID`` or ``JOURNAL_STREAM`` mean a systemd unit; nothing else does."""
    assert running_under_systemd(environ) is expected


def test_running_under_systemd_reads_os_environ_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without an argument ``running_under_systemd`` reads ``os.environ``."""
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    assert running_under_systemd() is False
    monkeypatch.setenv("JOURNAL_STREAM", "8:1")
    assert running_under_systemd() is True
