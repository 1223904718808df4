"""When a task's state is written: debounce, cap, retry with back-off (DESIGN.md "Persistence").

A change arms a timer for ``debounce`` after the last change, but no later
than ``debounce_max`` after the first unwritten one. A failed write is
retried after 0.25 s, doubling up to 30 s, until one succeeds. Writes of one
task never overlap: a flush waits for the write under way, then writes
whatever that one did not cover.

What a write does is injected (:attr:`WriteSchedule.write`, the task's
:meth:`~.store.TaskStore.save`), so the schedule knows nothing of files.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from .store import Spawn, StoreError

__all__ = ["FlushError", "WriteCounters", "WriteSchedule", "WriteTiming"]

_log = structlog.get_logger("ctxwin.daemon.actors")

_RETRY_FIRST_S = 0.25
_RETRY_MAX_S = 30.0


class FlushError(Exception):
    """The task's state could not be made durable; the message says why."""


class WriteCounters(Protocol):
    """What the schedule counts: ``flushes`` and ``write_failures`` (see ``Counters``)."""

    flushes: int
    write_failures: int


@dataclass(frozen=True)
class WriteTiming:
    """What the write schedules of all tasks share.

    Attributes:
        loop: the event loop whose clock and timers are used.
        spawn: starts a coroutine function in the daemon's task group.
        counters: counts of writes and failed writes.
        debounce_s: write delay after the last change.
        debounce_max_s: latest write after the first unwritten change.
    """

    loop: asyncio.AbstractEventLoop
    spawn: Spawn
    counters: WriteCounters
    debounce_s: float
    debounce_max_s: float


class WriteSchedule:
    """The debounced writes of one task.

    Args:
        task: the task id (for logs and errors).
        write: makes the current state durable unless it is; returns whether
            anything was written; raises :class:`~.store.StoreError`.
        revision: the state's revision now (it grows with every change).
        timing: the loop, spawner, counters and delays the daemon's tasks share.
        stopping: whether the actor is stopping (no retry is scheduled then).
    """

    def __init__(
        self,
        *,
        task: str,
        write: Callable[[], Awaitable[bool]],
        revision: Callable[[], int],
        timing: WriteTiming,
        stopping: Callable[[], bool],
    ) -> None:
        self.task = task
        self.write = write
        self._revision = revision
        self._timing = timing
        self._stopping = stopping
        self.durable_revision = 0
        self._seen_revision = 0
        self._first_unwritten: float | None = None
        self._last_change = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._lock = asyncio.Lock()
        self._write_queued = False
        self._failures_in_row = 0

    def loaded(self, revision: int) -> None:
        """Note that ``revision`` is durable as loaded."""
        self.durable_revision = self._seen_revision = revision

    def changed(self) -> None:
        """Note a possible change of the state; arm the debounce timer when it did change."""
        revision = self._revision()
        if revision == self._seen_revision:
            return
        self._seen_revision = revision
        now = self._timing.loop.time()
        if self._first_unwritten is None:
            self._first_unwritten = now
        self._last_change = now
        if not self._write_queued:  # a queued write re-arms the timer when it is done
            self._arm(self._deadline())

    def cancel(self) -> None:
        """Disarm the timer (the actor stops, or no longer persists)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def write_soon(self) -> None:
        """Start a write in the background, unless one is under way or a retry is pending."""
        if not self._lock.locked() and self._failures_in_row == 0:
            self._timing.spawn(self._write_in_background)

    async def flush(self) -> bool:
        """Write the current state unless it is durable already.

        Returns:
            Whether anything was written.

        Raises:
            FlushError: the write failed (logged; a retry is scheduled).
        """
        async with self._lock:
            revision = self._revision()
            taken_at = self._timing.loop.time()
            try:
                wrote = await self.write()
            except StoreError as exc:
                self._failed(str(exc))
                raise FlushError(
                    f"task {self.task}: state not durable, write failed: {exc}"
                ) from None
            except Exception as exc:  # whatever a store raises is this task's failure only
                _log.error("write_crashed", task=self.task, exc_info=exc)
                self._failed(type(exc).__name__)
                raise FlushError(
                    f"task {self.task}: state not durable, write failed: {type(exc).__name__}"
                ) from None
            if wrote:
                if self._failures_in_row:
                    _log.info("write_recovered", task=self.task, failures=self._failures_in_row)
                self._failures_in_row = 0
                self._timing.counters.flushes += 1
            self._written(revision, taken_at)
            return wrote

    def _failed(self, reason: str) -> None:
        self._timing.counters.write_failures += 1
        self._failures_in_row += 1
        delay = min(_RETRY_MAX_S, _RETRY_FIRST_S * 2 ** (self._failures_in_row - 1))
        _log.error(
            "write_failed",
            task=self.task,
            error=reason,
            failures_in_row=self._failures_in_row,
            retry_in_s=delay,
        )
        if not self._stopping() and self._timer is None:
            self._timer = self._timing.loop.call_later(delay, self._on_timer)

    def _written(self, revision: int, taken_at: float) -> None:
        """Note that ``revision``, snapshot at ``taken_at``, is durable.

        Changes that arrived while the write was under way are newer than
        the snapshot: their cap counts from ``taken_at``, not from the first
        change of the batch just written (which would make every later write
        immediate under steady traffic).
        """
        self.durable_revision = revision
        if self._failures_in_row:
            return
        self.cancel()
        if self._revision() == revision:
            self._first_unwritten = None
            return
        self._first_unwritten = taken_at
        self._arm(self._deadline())

    def _deadline(self) -> float:
        first = self._first_unwritten if self._first_unwritten is not None else self._last_change
        return min(self._last_change + self._timing.debounce_s, first + self._timing.debounce_max_s)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            if self._timer.when() <= when:
                return
            self._timer.cancel()
        self._timer = self._timing.loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._first_unwritten is None and self._failures_in_row == 0:
            return
        when = self._deadline()
        if self._failures_in_row == 0 and self._timing.loop.time() < when:
            self._timer = self._timing.loop.call_at(when, self._on_timer)
            return
        self._write_queued = True
        self._timing.spawn(self._write_in_background)

    async def _write_in_background(self) -> None:
        try:
            await self.flush()
        except FlushError:
            pass  # logged, and retried by the timer that flush() armed
        finally:
            self._write_queued = False
