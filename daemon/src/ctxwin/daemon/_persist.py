"""Durable task files: atomic writes, loading, corrupt files set aside, lock files.

A task lives in ``<state_dir>/tasks/<task_id>/``:

- ``context_history.json``: the overlay in the on-disk form of SPEC.md §1,
  exactly ``json.dumps`` of the engine's ``dump_updates()``, so an existing
  task directory of that format works as is;
- ``ctxwin.json``: what that format lacks, ``{"format": 1, "deleted_range": ...}``.

Every function here blocks; the daemon runs them in worker threads.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import structlog

from ctxwin import proto

__all__ = [
    "FORMAT",
    "HISTORY_FILE",
    "META_FILE",
    "LockedError",
    "TaskFiles",
    "acquire_lock",
    "encode_history",
    "encode_meta",
    "fsync_dir",
    "write_atomic",
]

HISTORY_FILE = "context_history.json"
META_FILE = "ctxwin.json"
FORMAT = 1
"""Version of ``ctxwin.json``."""

_TEMP_SUFFIX = ".tmp"
_temp_ids = itertools.count()
_log = structlog.get_logger("ctxwin.daemon.persist")

T = TypeVar("T")


def encode_history(updates: object) -> bytes:
    """``context_history.json`` content for an overlay in on-disk form."""
    return json.dumps(updates).encode("utf-8")


def encode_meta(deleted_range: list[int] | None, dialect: str = proto.DEFAULT_DIALECT) -> bytes:
    """``ctxwin.json`` content for a deleted range and a dialect (written when not the default)."""
    meta: dict[str, Any] = {"format": FORMAT, "deleted_range": deleted_range}
    if dialect != proto.DEFAULT_DIALECT:
        meta["dialect"] = dialect
    return json.dumps(meta).encode("utf-8")


def fsync_dir(directory: Path) -> None:
    """fsync a directory so that entries renamed or created in it are durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte or raise: a short write is continued, a zero write is ENOSPC."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def write_atomic(directory: Path, name: str, data: bytes) -> None:
    """Replace ``directory/name`` with ``data`` so that a crash leaves old or new, never part.

    Temp file in the same directory, every byte written (checked), fsync,
    rename over the target, fsync the directory. On any failure the temp file
    is removed and the target is untouched.

    Args:
        directory: an existing directory.
        name: the file name inside it.
        data: the complete new content.

    Raises:
        OSError: the write failed (e.g. ENOSPC, EFBIG, EACCES, EROFS).
    """
    temp = directory / f".{name}.{os.getpid()}.{next(_temp_ids)}{_TEMP_SUFFIX}"
    renamed = False
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, directory / name)
        renamed = True
        fsync_dir(directory)
    finally:
        if not renamed:
            try:
                os.unlink(temp)
            except OSError:
                pass


def _is_temp(name: str) -> bool:
    return (
        name.startswith(".")
        and name.endswith(_TEMP_SUFFIX)
        and (name.startswith(f".{HISTORY_FILE}.") or name.startswith(f".{META_FILE}."))
    )


@dataclass
class LoadResult:
    """What was found on disk for one task.

    Attributes:
        updates: the parsed ``context_history.json``, or None when absent.
        deleted_range: the stored range, or None.
        dialect: the stored dialect (``cline`` when none is stored).
        corrupt: files that did not parse and were renamed aside (new names).
    """

    updates: Any = None
    deleted_range: list[int] | None = None
    dialect: str = proto.DEFAULT_DIALECT
    corrupt: list[str] = field(default_factory=list)


class TaskFiles:
    """The files of one task.

    Args:
        state_dir: the daemon's state dir.
        task: a task id already validated by the protocol layer.
    """

    def __init__(self, state_dir: Path, task: str) -> None:
        self.task = task
        self.tasks_dir = state_dir / "tasks"
        self.directory = self.tasks_dir / task
        self._history_bytes: bytes | None = None
        self._meta_bytes: bytes | None = None
        self.loaded_dialect = proto.DEFAULT_DIALECT  # the dialect the last load found

    @property
    def history_path(self) -> Path:
        """Path of ``context_history.json``."""
        return self.directory / HISTORY_FILE

    @property
    def meta_path(self) -> Path:
        """Path of ``ctxwin.json``."""
        return self.directory / META_FILE

    def set_aside(self, name: str, reason: str) -> str:
        """Rename a file that cannot be used to ``<name>.corrupt-<ms>``; returns the new name.

        Raises:
            OSError: the rename failed.
        """
        stamp = int(time.time() * 1000)
        target = self.directory / f"{name}.corrupt-{stamp}"
        suffix = 0
        while target.exists():
            suffix += 1
            target = self.directory / f"{name}.corrupt-{stamp}-{suffix}"
        os.rename(self.directory / name, target)
        fsync_dir(self.directory)
        _log.error("corrupt_file", task=self.task, file=name, moved_to=target.name, reason=reason)
        return target.name

    def _read_json(self, name: str, result: LoadResult) -> tuple[bool, Any]:
        path = self.directory / name
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return False, None
        try:
            return True, json.loads(raw)
        except (ValueError, RecursionError) as exc:
            result.corrupt.append(self.set_aside(name, f"not JSON: {type(exc).__name__}"))
            return False, None

    def load(self, build: Callable[[Any, list[int] | None], T], empty: Callable[[], T]) -> T:
        """Read the task's files and build its state.

        Stale temp files of an interrupted write are removed first. A file that
        does not parse, or that ``build`` rejects, is renamed aside and logged,
        and the task starts from what is left.

        Args:
            build: makes the state from (parsed updates or None, deleted range).
            empty: makes an empty state.

        Returns:
            The state.

        Raises:
            OSError: the directory cannot be read.
        """
        result = LoadResult()
        if not self.directory.is_dir():
            return empty()
        for entry in os.listdir(self.directory):
            if _is_temp(entry):
                try:
                    os.unlink(self.directory / entry)
                except OSError:
                    pass
        found_meta, meta = self._read_json(META_FILE, result)
        if found_meta:
            if (
                not isinstance(meta, dict)
                or meta.get("format") != FORMAT
                or proto.deleted_range_error(meta.get("deleted_range")) is not None
                or meta.get("dialect", proto.DEFAULT_DIALECT) not in proto.DIALECTS
            ):
                result.corrupt.append(self.set_aside(META_FILE, "unexpected content"))
            else:
                result.deleted_range = meta.get("deleted_range")
                result.dialect = meta.get("dialect", proto.DEFAULT_DIALECT)
        self.loaded_dialect = result.dialect
        found_history, updates = self._read_json(HISTORY_FILE, result)
        if found_history:
            result.updates = updates
        try:
            state = build(result.updates, result.deleted_range)
        except Exception as exc:  # whatever the engine rejects the file with
            if not found_history:
                raise
            # The type only: a message could quote the file's (conversation) text.
            reason = f"rejected: {type(exc).__name__}"
            result.corrupt.append(self.set_aside(HISTORY_FILE, reason))
            state = build(None, result.deleted_range)
        self._history_bytes = None
        self._meta_bytes = None
        return state

    def mark_current(self, history: bytes, meta: bytes) -> None:
        """Record that the files on disk hold this content (after loading)."""
        self._history_bytes = history
        self._meta_bytes = meta

    def is_current(self, history: bytes, meta: bytes) -> bool:
        """Whether the last written (or loaded) content equals this content."""
        return history == self._history_bytes and meta == self._meta_bytes

    def write(self, history: bytes, meta: bytes) -> bool:
        """Make both files durable with this content; skips a file already written as is.

        Returns:
            Whether anything was written.

        Raises:
            OSError: a write failed; what was durable before stays so.
        """
        wrote = False
        if not self.directory.is_dir():
            self.tasks_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.directory.mkdir(mode=0o700, exist_ok=True)
            fsync_dir(self.tasks_dir)
            fsync_dir(self.tasks_dir.parent)
        if meta != self._meta_bytes:
            write_atomic(self.directory, META_FILE, meta)
            self._meta_bytes = meta
            wrote = True
        if history != self._history_bytes:
            write_atomic(self.directory, HISTORY_FILE, history)
            self._history_bytes = history
            wrote = True
        return wrote


class LockedError(RuntimeError):
    """Another process holds a lock file."""


def acquire_lock(path: Path) -> int:
    """Take an exclusive ``flock`` on ``path`` (created 0600); returns the fd to keep open.

    Raises:
        LockedError: another process holds it.
        OSError: the file cannot be created.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LockedError(f"{path} is locked by another process") from None
    except OSError:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd
