"""Turn-taking in the blocking client: bounded waits, and no turn kept by an interrupt."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from ctxwin.client import Client, RequestTimeoutError
from ctxwin.client._turns import Turns
from tests._client_fake import FakeRouter


class Interrupted(Exception):
    """Raised by the test's SIGINT handler, where KeyboardInterrupt would be."""


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("sigint_raises")
def test_an_interrupt_at_the_hand_over_never_keeps_the_turn() -> None:
    """SIGINT sent as the holder lets go: whatever the waiter was doing, the turn ends free."""
    turns = Turns()
    interrupted = 0
    for _ in range(200):
        granted = threading.Event()

        def holder(granted: threading.Event) -> None:
            with turns.take(None, RuntimeError):
                granted.set()
                time.sleep(0.002)
            os.kill(os.getpid(), signal.SIGINT)  # right as the turn is handed over

        thread = threading.Thread(target=holder, args=(granted,))
        try:
            thread.start()
            granted.wait()
            with turns.take(5, RuntimeError):
                time.sleep(0.001)
            thread.join()
        except Interrupted:
            interrupted += 1
            thread.join()
        assert not turns.busy
    assert interrupted == 200


def test_waiting_for_another_thread_s_call_counts_against_the_timeout(tmp_path: Path) -> None:
    """A call queued behind another thread's on one client times out on its own deadline."""
    with FakeRouter(tmp_path, lambda request: []) as silent, Client(silent.endpoint) as client:
        outcomes: list[BaseException] = []

        def slow_call() -> None:
            try:
                client.ping(timeout=3)
            except RequestTimeoutError as exc:
                outcomes.append(exc)

        slow = threading.Thread(target=slow_call)
        slow.start()
        time.sleep(0.2)
        started = time.monotonic()
        with pytest.raises(RequestTimeoutError, match="earlier calls on this client"):
            client.ping(timeout=0.3)
        assert time.monotonic() - started < 2.0
        slow.join()
        assert len(outcomes) == 1
