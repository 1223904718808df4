"""Taking turns between threads, in order of arrival, within a time limit, safe against Ctrl-C."""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator


class Turns:
    """One holder at a time; the others wait in order of arrival, each within its own limit.

    First come, first served: a thread that lets go and asks again at once
    queues behind those already waiting. Every change wakes all waiters (only
    the first in line goes), so a waiter that leaves by timeout or interrupt
    cannot swallow the wake-up meant for the next. A turn is claimed and
    released under ``with`` and released in ``finally``, so a
    ``KeyboardInterrupt`` right after it was granted cannot keep it.
    """

    __slots__ = ("_busy", "_condition", "_queue")

    def __init__(self) -> None:
        self._condition = threading.Condition(threading.Lock())
        self._busy = False
        self._queue: deque[object] = deque()

    @contextlib.contextmanager
    def take(
        self, seconds: float | None, too_long: Callable[..., Exception], *why: str
    ) -> Iterator[None]:
        """Hold the turn for the ``with`` block.

        Args:
            seconds: how long to wait for it (None: as long as it takes).
            too_long: makes the exception raised when the wait runs out, from ``why``
                (called only then: a turn taken at once builds nothing).
            why: the arguments of ``too_long``.
        """
        claimed = False
        try:
            with self._condition:
                if not self._busy and not self._queue:
                    self._busy = claimed = True  # free and nobody in line: no queueing
                else:
                    me = object()
                    self._queue.append(me)
                    try:
                        if self._condition.wait_for(
                            lambda: not self._busy and self._queue[0] is me, seconds
                        ):
                            self._busy = claimed = True
                    finally:
                        self._queue.remove(me)
                        if not claimed:
                            self._condition.notify_all()  # the next in line may be free to go
            if not claimed:
                raise too_long(*why)
            yield
        finally:
            if claimed:
                with self._condition:
                    self._busy = False
                    self._condition.notify_all()

    @property
    def busy(self) -> bool:
        """Whether someone holds the turn."""
        return self._busy

    @property
    def waiting(self) -> int:
        """How many wait for the turn."""
        return len(self._queue)
