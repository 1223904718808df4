"""Where a task's state lives between actors: the one seam for loading and writing it.

An actor asks its :class:`TaskStore` for the state once, when it starts
(:meth:`TaskStore.load`), and the write schedule asks it to make the state
durable (:meth:`TaskStore.save`); nothing else in the daemon reads or writes
a task's state. What is stored is the engine's state plus the task's
:class:`TaskExtras` (calibration and dialect), as one unit.

:class:`FileStore` keeps each task in the files of ``_persist.py``;
:class:`~._fleet.RedisStateStore` keeps them in Redis, where a task also has
one owner at a time (a lease): its tasks answer :meth:`TaskStore.serving`
False once the lease is gone, and call the actor's ``on_lost`` then.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio.to_thread
import structlog

from ctxwin import engine, proto

from ._persist import DEFAULT_DIALECT, Encoded, NotOursError, TaskFiles, TaskRecord, encode_task

__all__ = [
    "FileStore",
    "FileTaskStore",
    "StateStore",
    "StoreError",
    "StoreUnavailableError",
    "TaskExtras",
    "TaskStore",
    "build_state",
    "extras_of",
    "record_of",
]


_log = structlog.get_logger("ctxwin.daemon.store")


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
    dialect: str = DEFAULT_DIALECT
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


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def build_state(record: TaskRecord, notices: engine.Notices) -> engine.TaskState:
    """The engine state of a stored record.

    Raises:
        Exception: whatever the engine rejects the record's overlay with.
    """
    if record.updates is None and record.deleted_range is None and not record.summaries:
        state = engine.TaskState(notices, dialect=engine.get_dialect(record.dialect))
    else:
        state = engine.TaskState.load(
            record.updates,
            record.deleted_range,
            notices,
            dialect=engine.get_dialect(record.dialect),
            summaries=list(record.summaries),
            basis=record.basis,
        )
    if record.pricing is not None:
        state.load_pricing(proto.sheet_from_wire(record.pricing))
    return state


def extras_of(record: TaskRecord) -> TaskExtras:
    """The extras a stored record carries."""
    return TaskExtras(record.calibration, record.dialect, record.read_tools)


def record_of(state: engine.TaskState, extras: TaskExtras) -> TaskRecord:
    """The record that stores this state and these extras."""
    return TaskRecord(
        state.dump_updates(),
        state.deleted_range,
        extras.calibration,
        extras.dialect,
        extras.read_tools,
        None if state.pricing is None else state.pricing.wire(),
        tuple(state.dump_summaries()),
        state.basis,
    )


class FileTaskStore:
    """One task kept in ``<state_dir>/tasks/<task>/`` (see ``_persist.py``).

    Args:
        files: the task's files.
        notices: notice texts for the loaded state.
        advertise: this daemon's endpoint (the owner ``inspect`` shows).
    """

    def __init__(self, files: TaskFiles, notices: engine.Notices, advertise: str) -> None:
        self.files = files
        self.notices = notices
        self.advertise = advertise

    async def load(self) -> tuple[engine.TaskState, TaskExtras]:
        """Read the task's files in a worker thread (see :meth:`TaskFiles.load`).

        Raises:
            StoreUnavailableError: the task's directory is not the daemon's own
                (a planted link, say): the task is not served until it is removed.
        """
        notices = self.notices

        def build(record: TaskRecord) -> tuple[engine.TaskState, TaskExtras]:
            return build_state(record, notices), extras_of(record)

        try:
            state, extras = await anyio.to_thread.run_sync(self.files.load, build)
        except NotOursError as exc:
            _log.error("task_dir_refused", task=self.files.task, reason=exc.strerror)
            raise StoreUnavailableError(f"refused: {exc.strerror}") from None
        self.files.mark_current(_encode(state, extras))
        return state, extras

    async def save(self, state: engine.TaskState, extras: TaskExtras) -> bool:
        """Write the files in a worker thread unless they hold this state already.

        Raises:
            StoreError: the write failed (the reason names the errno).
        """
        encoded = _encode(state, extras)
        if self.files.is_current(encoded):
            return False
        try:
            await anyio.to_thread.run_sync(self.files.write, encoded)
        except OSError as exc:
            raise StoreError(f"{exc.strerror or exc} ({_errno_name(exc)})") from None
        return True

    def is_current(self, state: engine.TaskState, extras: TaskExtras) -> bool:
        """Whether the files hold this state."""
        return self.files.is_current(_encode(state, extras))

    def serving(self) -> bool:
        """Always: the state dir's lock file makes this daemon its only user."""
        return True

    async def release(self) -> None:
        """Nothing to give up."""

    def describe(self) -> dict[str, Any]:
        """The file store, this daemon as owner, no fence."""
        return {"store": "file", "owner": self.advertise, "fence": None}


def _encode(state: engine.TaskState, extras: TaskExtras) -> Encoded:
    return encode_task(record_of(state, extras))


class FileStore:
    """Every task in its own directory under ``<state_dir>/tasks``.

    Args:
        state_dir: the daemon's state dir.
        notices: notice texts for loaded states.
        advertise: this daemon's endpoint.
    """

    features: tuple[str, ...] = ()

    def __init__(self, state_dir: Path, notices: engine.Notices, advertise: str = "") -> None:
        self.state_dir = state_dir
        self.notices = notices
        self.advertise = advertise

    def open(self, task: str, on_lost: Callable[[str], None] | None = None) -> FileTaskStore:
        """The files of ``task`` (an id already validated by the protocol layer)."""
        return FileTaskStore(TaskFiles(self.state_dir, task), self.notices, self.advertise)

    def describe(self) -> dict[str, Any]:
        """The store's kind and directory."""
        return {"kind": "file", "path": str(self.state_dir / "tasks")}

    async def close(self) -> None:
        """Nothing to close."""
