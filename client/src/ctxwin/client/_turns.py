"""Taking turns between threads, within a time limit, safe against Ctrl-C."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


class Turns:
    """One holder at a time; the others wait their turn, each within its own time limit.

    Unlike ``Lock.acquire(timeout=...)`` followed by ``try``, a turn cannot be
    kept by a ``KeyboardInterrupt`` that lands right after it was granted: it
    is claimed and released under ``with``, and released in ``finally``.
    """

    __slots__ = ("_busy", "_condition")

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._busy = False

    @contextlib.contextmanager
    def take(self, seconds: float | None, too_long: Callable[[], Exception]) -> Iterator[None]:
        """Hold the turn for the ``with`` block.

        Args:
            seconds: how long to wait for it (None: as long as it takes).
            too_long: the exception to raise when the wait runs out.
        """
        claimed = False
        try:
            with self._condition:
                if not self._condition.wait_for(lambda: not self._busy, seconds):
                    raise too_long()
                self._busy = claimed = True
            yield
        finally:
            if claimed:
                with self._condition:
                    self._busy = False
                    self._condition.notify()

    @property
    def busy(self) -> bool:
        """Whether someone holds the turn."""
        return self._busy
