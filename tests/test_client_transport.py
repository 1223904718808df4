"""The connection under both clients: fail at once when nothing answers, notice a dropped one."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

from ctxwin.client import AsyncClient, Client, DaemonUnavailableError
from ctxwin.client._link import SAFE_TO_REPEAT, close_dealer, open_dealer
from tests._daemon import DaemonProcess, free_port, wait_until

KINDS = ("sync", "async")
MODEL = {"id": "m", "context_window": 100_000}
MESSAGES = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "ok"}]


def _unread_bytes(port: int) -> int:
    """Bytes waiting in the receive queues of established TCP connections to ``port``."""
    total = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, queues = fields[1], fields[3], fields[4]
        if state == "01" and int(local.split(":")[1], 16) == port:
            total += int(queues.split(":")[1], 16)
    return total


def _stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (state ``T``)."""
    states = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
        except OSError:
            continue  # a thread that just ended
    return bool(states) and all(state in ("T", "t") for state in states)


def _session(
    kind: str, endpoint: str, op: str, args: tuple[Any, ...], connected: threading.Event
) -> Callable[[threading.Event], object]:
    """A call that first connects (``connected`` is set), then sends ``op`` once told to go."""

    def run_sync(go: threading.Event) -> object:
        with Client(endpoint, timeout=30) as client:
            client.ping()
            connected.set()
            go.wait()
            return getattr(client, op)(*args)

    def run_async(go: threading.Event) -> object:
        async def main() -> object:
            async with AsyncClient(endpoint, timeout=30) as client:
                await client.ping()
                connected.set()
                await asyncio.to_thread(go.wait)
                return await getattr(client, op)(*args)

        return asyncio.run(main())

    return run_sync if kind == "sync" else run_async


class InFlight:
    """``op`` sent to a stopped daemon from another thread; its outcome and when it came."""

    def __init__(self, kind: str, daemon: DaemonProcess, port: int, op: str, *args: Any) -> None:
        connected, go = threading.Event(), threading.Event()
        self.outcome: object = None
        self.at = 0.0
        run = _session(kind, daemon.endpoint, op, args, connected)

        def target() -> None:
            try:
                self.outcome = run(go)
            except Exception as exc:
                self.outcome = exc
            self.at = time.monotonic()

        self.thread = threading.Thread(target=target)
        self.thread.start()
        assert connected.wait(10)
        assert daemon.proc is not None
        pid = daemon.proc.pid
        os.kill(pid, signal.SIGSTOP)
        # The signal stops each thread in turn: until all are, one of them may still read.
        wait_until(lambda: _stopped(pid), 10, "the daemon stops")
        go.set()
        wait_until(lambda: _unread_bytes(port) > 0, 10, f"{op} waits in the daemon's socket")

    def result(self) -> object:
        self.thread.join(20)
        assert not self.thread.is_alive()
        return self.outcome


@pytest.fixture
def tcp_daemon(tmp_path: Path) -> Any:
    port = free_port()
    with DaemonProcess(tmp_path, endpoint=f"tcp://127.0.0.1:{port}") as daemon:
        yield daemon, port


def _ping(kind: str, endpoint: str) -> None:
    if kind == "sync":
        with Client(endpoint, timeout=30) as client:
            client.ping()
        return

    async def main() -> None:
        async with AsyncClient(endpoint, timeout=30) as client:
            await client.ping()

    asyncio.run(main())


def _call_with_no_daemon(kind: str, endpoint: str) -> tuple[BaseException, float]:
    started = time.monotonic()
    with pytest.raises(DaemonUnavailableError) as caught:
        _ping(kind, endpoint)
    return caught.value, time.monotonic() - started


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("where", ["no socket file", "refused port"])
def test_a_call_with_no_daemon_fails_at_once_saying_how_to_start_one(
    kind: str, where: str, tmp_path: Path
) -> None:
    """No ipc socket file, or a refused TCP port: the call fails at once, naming the endpoint."""
    endpoint = (
        f"ipc://{tmp_path / 'nobody.sock'}"
        if where == "no socket file"
        else f"tcp://127.0.0.1:{free_port()}"
    )
    error, took = _call_with_no_daemon(kind, endpoint)
    assert took < 1.0
    assert endpoint in str(error)
    assert "ctxwind" in str(error)
    assert "autostart=True" in str(error)


@pytest.mark.parametrize("kind", KINDS)
def test_the_socket_file_a_killed_daemon_left_fails_at_once(kind: str, tmp_path: Path) -> None:
    """After ``kill -9`` the ipc file stays with nobody behind it: refused at once, no timeout."""
    daemon = DaemonProcess(tmp_path)
    daemon.start()
    daemon.kill()
    assert (daemon.runtime_dir / "ctxwind.sock").exists()
    error, took = _call_with_no_daemon(kind, daemon.endpoint)
    assert took < 1.0
    assert "nothing answers at" in str(error)


@pytest.mark.parametrize("kind", KINDS)
def test_a_change_in_flight_when_the_daemon_dies_fails_within_a_second(
    kind: str, tcp_daemon: tuple[DaemonProcess, int]
) -> None:
    """``prepare_request`` in flight at ``kill -9`` is not resent: a clear error, not a timeout."""
    daemon, port = tcp_daemon
    assert "prepare_request" not in SAFE_TO_REPEAT
    call = InFlight(kind, daemon, port, "prepare_request", "t1", MESSAGES, MODEL)
    killed = time.monotonic()
    daemon.kill()
    error = call.result()
    assert isinstance(error, DaemonUnavailableError), error
    assert call.at - killed < 1.0
    assert "prepare_request" in str(error)
    assert "may or may not have been applied" in str(error)


@pytest.mark.parametrize("kind", KINDS)
def test_a_read_in_flight_when_the_daemon_restarts_is_sent_again(
    kind: str, tcp_daemon: tuple[DaemonProcess, int]
) -> None:
    """``count_tokens`` in flight at ``kill -9`` is sent again and answered by the new daemon."""
    daemon, port = tcp_daemon
    assert "count_tokens" in SAFE_TO_REPEAT
    call = InFlight(kind, daemon, port, "count_tokens", MESSAGES)
    daemon.kill()
    daemon.start()
    result = call.result()
    assert isinstance(result, dict), result
    assert result["tokens"] > 0


class _FastRetries(zmq.Context[zmq.Socket[bytes]]):
    """A context whose DEALERs retry a refused connection every millisecond."""

    def socket(self, socket_type: int, **kwargs: Any) -> zmq.Socket[bytes]:  # type: ignore[override]
        sock: zmq.Socket[bytes] = super().socket(socket_type, **kwargs)
        if socket_type == zmq.DEALER:
            sock.setsockopt(zmq.RECONNECT_IVL, 1)
        return sock


def test_unread_monitor_events_do_not_stop_the_context() -> None:
    """An idle client's monitor fills while its daemon is down; the context must go on.

    A full monitor queue blocks libzmq's I/O thread, and every socket of the
    context with it. Retried every millisecond, the default queue (about 2,000
    events) is full within a few seconds.
    """
    context = _FastRetries()
    port = free_port()  # a port nobody listens on
    dealer, monitor, _ = open_dealer(context, f"tcp://127.0.0.1:{port}", None)
    moved = threading.Event()

    def second_socket() -> None:
        server, peer = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
        server.bind("tcp://127.0.0.1:*")
        peer.connect(server.getsockopt_string(zmq.LAST_ENDPOINT))
        peer.send(b"still moving")
        if server.poll(5000) and server.recv() == b"still moving":
            moved.set()
        server.close(linger=0)
        peer.close(linger=0)

    try:
        time.sleep(6.0)
        other = threading.Thread(target=second_socket, daemon=True)
        other.start()
        other.join(15.0)
    finally:
        held = 0
        while monitor.poll(0):  # a stuck I/O thread moves again once its events are read
            monitor.recv_multipart()
            held += 1
        other.join(15.0)
        close_dealer(dealer, monitor)
        context.term()
    assert moved.is_set(), f"a second socket of the context was stuck ({held} events unread)"
    assert held > 2_100, f"only {held} events were retried: the queue was never full"
