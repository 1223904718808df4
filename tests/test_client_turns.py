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


@pytest.mark.usefixtures("sigint_raises")
def test_a_waiter_leaving_on_an_interrupt_does_not_swallow_the_next_one_s_turn() -> None:
    """With two waiters, an interrupt taking the first away still lets the second go at once."""
    turns = Turns()
    for _ in range(20):
        release = threading.Event()
        waited: list[float] = []

        def holder(release: threading.Event) -> None:
            with turns.take(None, RuntimeError):
                release.wait()
            os.kill(os.getpid(), signal.SIGINT)

        def second(waited: list[float]) -> None:
            started = time.monotonic()
            with turns.take(5, RuntimeError):
                waited.append(time.monotonic() - started)

        first = threading.Thread(target=holder, args=(release,))
        first.start()
        while not turns.busy:
            time.sleep(0.001)
        other = threading.Thread(target=second, args=(waited,))
        try:
            threading.Timer(0.05, other.start).start()  # queued behind this thread
            threading.Timer(0.1, release.set).start()
            with turns.take(5, RuntimeError):
                time.sleep(0.001)
            first.join()
        except Interrupted:
            first.join()
        other.join()
        assert len(waited) == 1
        assert waited[0] < 1.0, waited
        assert not turns.busy


def test_a_thread_that_asks_again_at_once_queues_behind_the_waiting() -> None:
    """First come, first served: a busy loop on one thread cannot starve another's call."""
    turns = Turns()
    stop = threading.Event()

    def hog() -> None:
        while not stop.is_set():
            with turns.take(None, RuntimeError):
                time.sleep(0.0005)

    thread = threading.Thread(target=hog)
    thread.start()
    try:
        for _ in range(20):
            with turns.take(0.5, TimeoutError):
                pass
    finally:
        stop.set()
        thread.join()
