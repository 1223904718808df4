"""Where a task's state lives between actors: the one seam for loading and writing it.

An actor asks its :class:`TaskStore` for the state once, when it starts
(:meth:`TaskStore.load`), and the write schedule asks it to make the state
durable (:meth:`TaskStore.save`); nothing else in the daemon reads or writes
a task's state. What is stored is the engine's state plus the task's
:class:`TaskExtras` (calibration, dialect and read tools), as one unit (a
:class:`~._record.TaskRecord`).

:class:`~._files.FileStore` keeps each task in the files of ``_files.py``;
:class:`~._fleet.RedisStateStore` keeps them in Redis, where a task also has
one owner at a time (a lease): its tasks answer :meth:`TaskStore.serving`
False once the lease is gone, and call the actor's ``on_lost`` then.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from ctxwin import engine, proto

__all__ = [
    "Spawn",
    "StateStore",
    "StoreError",
    "StoreUnavailableError",
    "TaskExtras",
    "TaskStore",
]

Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], None]
"""Starts a coroutine function in the daemon's task group."""


class StoreError(Exception):
    """A task's state could not be made durable; the message says why (no conversation text)."""


class StoreUnavailableError(StoreError):
    """The store cannot be reached (or refuses) just now: the request may be sent again."""


@dataclass(frozen=True)
class TaskExtras:
    """What a task keeps beside the engine's state.

    Attributes:
        calibration: ``(ratio, samples)`` of its calibration, None before the first sample.
        dialect: its message dialect, stored as given.
        read_tools: its own read tools, in their wire form.
    """

    calibration: tuple[float, int] | None = None
    dialect: str = proto.DEFAULT_DIALECT
    read_tools: tuple[dict[str, Any], ...] = ()


class TaskStore(Protocol):
    """The stored state of one task, as its actor sees it."""

    async def load(self) -> tuple[engine.TaskState, TaskExtras]:
        """The task's state as last made durable (an empty one for a new task).

        Raises:
            StoreUnavailableError: the store cannot be reached (send the request again).
            ProtocolError: ``owned_elsewhere`` when another daemon owns the task.
            Exception: the store cannot be read at all (the actor fails to start).
        """

    async def save(self, state: engine.TaskState, extras: TaskExtras) -> bool:
        """Make the state durable unless it is already; returns whether anything was written.

        The state is read before the first ``await``: changes made while the
        write is under way are not part of it.

        Raises:
            StoreError: the write failed; what was durable before stays so.
        """

    def is_current(self, state: engine.TaskState, extras: TaskExtras) -> bool:
        """Whether this content equals what was last loaded or saved."""

    def serving(self) -> bool:
        """Whether this daemon may answer for the task now (it owns it)."""

    async def release(self) -> None:
        """The actor stops: give up ownership (after its final write)."""

    def describe(self) -> dict[str, Any]:
        """``store``, ``owner`` and ``fence`` of the task for ``inspect``."""


class StateStore(Protocol):
    """Where every task's state lives."""

    features: tuple[str, ...]
    """Features it adds to ``ping`` (``fleet`` for a shared store)."""

    def open(self, task: str, on_lost: Callable[[str], None]) -> TaskStore:
        """The store of one task (cheap: nothing is read until ``load``).

        ``on_lost(reason)`` is called when the task's ownership is lost.
        """

    def describe(self) -> dict[str, Any]:
        """What ``stats`` shows of the store."""

    async def close(self) -> None:
        """Release what the store holds (connections)."""
