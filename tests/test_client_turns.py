"""Turn-taking in the blocking client: bounded waits, and no turn kept by an interrupt."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest

from ctxwin.client import Client, RequestTimeoutError
from ctxwin.client._turns import Turns
from tests._client_fake import FakeRouter


class Interrupted(Exception):
    """Raised by the test's SIGINT handler, where KeyboardInterrupt would be."""


def until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    """Return once ``condition`` holds (checked without sleeping); fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the condition did not come about in time")
        os.sched_yield()  # lets the other threads run (it releases the GIL)


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
                until(lambda: turns.waiting == 1)  # the main thread waits for the turn
            os.kill(os.getpid(), signal.SIGINT)  # right as the turn is handed over

        thread = threading.Thread(target=holder, args=(granted,))
        try:
            thread.start()
            granted.wait()
            with turns.take(5, RuntimeError):
                pass
            thread.join()
        except Interrupted:
            interrupted += 1
            thread.join()
        assert not turns.busy
    assert interrupted == 200


def test_waiting_for_another_thread_s_call_counts_against_the_timeout(tmp_path: Path) -> None:
    """A call queued behind another thread's on one client times out on its own deadline."""
    arrived = threading.Event()

    def silent_handler(request: object) -> list[bytes]:
        arrived.set()
        return []

    with FakeRouter(tmp_path, silent_handler) as silent, Client(silent.endpoint) as client:
        outcomes: list[BaseException] = []

        def slow_call() -> None:
            try:
                client.ping(timeout=1.5)
            except RequestTimeoutError as exc:
                outcomes.append(exc)

        slow = threading.Thread(target=slow_call)
        slow.start()
        assert arrived.wait(5)  # the slow call holds the client's turn
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

        held = threading.Event()

        def holder(release: threading.Event, held: threading.Event) -> None:
            with turns.take(None, RuntimeError):
                held.set()
                release.wait()
            os.kill(os.getpid(), signal.SIGINT)

        def second(waited: list[float]) -> None:
            started = time.monotonic()
            with turns.take(5, RuntimeError):
                waited.append(time.monotonic() - started)

        def line_up(other: threading.Thread, release: threading.Event) -> None:
            until(lambda: turns.waiting == 1)  # this thread waits first,
            other.start()
            until(lambda: turns.waiting == 2)  # the other behind it
            release.set()

        first = threading.Thread(target=holder, args=(release, held))
        first.start()
        assert held.wait(5)
        other = threading.Thread(target=second, args=(waited,))
        arranger = threading.Thread(target=line_up, args=(other, release))
        try:
            arranger.start()
            with turns.take(5, RuntimeError):
                pass
            first.join()
        except Interrupted:
            first.join()
        arranger.join()
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
                pass

    thread = threading.Thread(target=hog)
    thread.start()
    try:
        for _ in range(20):
            with turns.take(0.5, TimeoutError):
                pass
    finally:
        stop.set()
        thread.join()
