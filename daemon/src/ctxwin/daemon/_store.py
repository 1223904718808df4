"""Where a task's state lives between actors: the one seam for loading and writing it.

An actor asks its :class:`TaskStore` for the state once, when it starts
(:meth:`TaskStore.load`), and the write schedule asks it to make the state
durable (:meth:`TaskStore.save`); nothing else in the daemon reads or writes
a task's state. :class:`FileStore` keeps each task in the files of
``_persist.py``; another store (a shared one, say) implements the same two
protocols and is handed to :class:`~._actors.ActorSystem` instead.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any, Protocol

import anyio.to_thread

from ctxwin import engine

from ._persist import TaskFiles, encode_history, encode_meta

__all__ = ["FileStore", "FileTaskStore", "StateStore", "StoreError", "TaskStore"]


class StoreError(Exception):
    """A task's state could not be made durable; the message says why (no conversation text)."""


class TaskStore(Protocol):
    """The stored state of one task, as its actor sees it."""

    async def load(self) -> engine.TaskState:
        """The task's state as last made durable (an empty one for a new task).

        Raises:
            Exception: the store cannot be read at all (the actor fails to start).
        """

    async def save(self, state: engine.TaskState) -> bool:
        """Make ``state`` durable unless it is already; returns whether anything was written.

        The state is read before the first ``await``: changes made while the
        write is under way are not part of it.

        Raises:
            StoreError: the write failed; what was durable before stays so.
        """

    def is_current(self, state: engine.TaskState) -> bool:
        """Whether ``state`` equals what was last loaded or saved."""


class StateStore(Protocol):
    """Where every task's state lives."""

    def open(self, task: str) -> TaskStore:
        """The store of one task (cheap: nothing is read until ``load``)."""


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


class FileTaskStore:
    """One task kept in ``<state_dir>/tasks/<task>/`` (see ``_persist.py``).

    Args:
        files: the task's files.
        notices: notice texts for the loaded state.
    """

    def __init__(self, files: TaskFiles, notices: engine.Notices) -> None:
        self.files = files
        self.notices = notices

    async def load(self) -> engine.TaskState:
        """Read the task's files in a worker thread (see :meth:`TaskFiles.load`)."""
        notices = self.notices

        files = self.files

        def build(updates: Any, deleted_range: list[int] | None) -> engine.TaskState:
            dialect = files.loaded_dialect
            if updates is None and deleted_range is None:
                return engine.TaskState(notices, dialect=dialect)
            return engine.TaskState.load(updates, deleted_range, notices, dialect=dialect)

        state = await anyio.to_thread.run_sync(
            self.files.load, build, lambda: engine.TaskState(notices)
        )
        self.files.mark_current(*_snapshot(state))
        return state

    async def save(self, state: engine.TaskState) -> bool:
        """Write the files in a worker thread unless they hold this state already.

        Raises:
            StoreError: the write failed (the reason names the errno).
        """
        history, meta = _snapshot(state)
        if self.files.is_current(history, meta):
            return False
        try:
            await anyio.to_thread.run_sync(self.files.write, history, meta)
        except OSError as exc:
            raise StoreError(f"{exc.strerror or exc} ({_errno_name(exc)})") from None
        return True

    def is_current(self, state: engine.TaskState) -> bool:
        """Whether the files hold this state."""
        return self.files.is_current(*_snapshot(state))


def _snapshot(state: engine.TaskState) -> tuple[bytes, bytes]:
    return encode_history(state.dump_updates()), encode_meta(state.deleted_range, state.dialect)


class FileStore:
    """Every task in its own directory under ``<state_dir>/tasks``.

    Args:
        state_dir: the daemon's state dir.
        notices: notice texts for loaded states.
    """

    def __init__(self, state_dir: Path, notices: engine.Notices) -> None:
        self.state_dir = state_dir
        self.notices = notices

    def open(self, task: str) -> FileTaskStore:
        """The files of ``task`` (an id already validated by the protocol layer)."""
        return FileTaskStore(TaskFiles(self.state_dir, task), self.notices)
