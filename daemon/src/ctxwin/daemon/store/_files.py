"""The file store: durable task files, one authority, a compatible export, locks.

A task lives in ``<state_dir>/tasks/<task_id>/``:

- ``ctxwin.json``: the authority, the task's whole state in one file, replaced
  atomically as a unit: ``{"format": 2, "dialect": ..., "deleted_range": ...,
  "calibration": {"ratio": ..., "samples": ...} | null, "read_tools"?: [...],
  "summaries"?: [...], "basis"?: {"length": ..., "digest": ...}, "updates": ...}``,
  where ``updates`` is the overlay in the on-disk form of SPEC.md §1 and
  ``basis`` names the history prefix the range and the overlay were made on
  (its length and chained digest, hex);
- ``context_history.json``: the compatible export, exactly ``json.dumps`` of
  the engine's ``dump_updates()``, written after the authority. It is read only
  to import a task directory that has no ctxwin file, or an old one
  (``{"format": 1, "deleted_range": ...}``, which carried the range alone).

A crash between the two renames leaves an export one state behind the
authority; the authority alone is loaded, so a range and an overlay always
come from one state.

Nothing here follows a link or uses a directory another user could write
to: the state dir and its ``tasks`` must be the daemon user's and writable by
no one else (:func:`check_private_dir`), a task directory must be a real
directory of the daemon user's (:class:`NotOursError` otherwise), and files are
opened with ``O_NOFOLLOW``.

Every function here blocks; the daemon runs them in worker threads.
:class:`FileStore` and :class:`FileTaskStore` are the store built on them,
which :func:`ctxwin.daemon.store.open_store` chooses for ``state_store = "file:"``.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
import structlog

from ctxwin import engine

from ._base import StoreError, StoreUnavailableError, TaskExtras
from ._record import (
    Encoded,
    TaskRecord,
    build_state,
    decode_record,
    encode_task,
    extras_of,
    record_of,
    valid_range,
)

__all__ = [
    "HISTORY_FILE",
    "META_FILE",
    "FileStore",
    "FileTaskStore",
    "LockedError",
    "NotOursError",
    "TaskFiles",
    "acquire_lock",
    "check_private_dir",
    "fsync_dir",
    "write_atomic",
]

HISTORY_FILE = "context_history.json"
META_FILE = "ctxwin.json"
_OLD_FORMAT = 1

_TEMP_SUFFIX = ".tmp"
_temp_ids = itertools.count()
_log = structlog.get_logger("ctxwin.daemon.persist")

T = TypeVar("T")


class NotOursError(PermissionError):
    """A path in the state dir is not the daemon user's own (a link, another owner, a mode).

    Nothing is read or written through it; the message names it and what to do.
    """

    def __init__(self, message: str) -> None:
        super().__init__(errno.EPERM, message)


def _why_not_ours(path: Path, info: os.stat_result, what: str) -> str | None:
    if stat.S_ISLNK(info.st_mode):
        return f"{what} {path} is a symbolic link; remove it (it was not made by ctxwind)"
    if not stat.S_ISDIR(info.st_mode):
        return f"{what} {path} is not a directory"
    if info.st_uid != os.getuid():
        return f"{what} {path} belongs to uid {info.st_uid}, not to the daemon's uid {os.getuid()}"
    if info.st_mode & 0o022:
        return (
            f"{what} {path} may be written by others (mode {stat.S_IMODE(info.st_mode):o}); "
            f"chmod go-w {path}"
        )
    return None


def check_private_dir(path: Path, what: str, *, follow: bool) -> None:
    """Require ``path`` to be a directory of the daemon's uid that no one else can write to.

    Args:
        path: an existing directory.
        what: how the message names it ("state dir").
        follow: whether ``path`` itself may be a link (the operator's own
            configured path may; what is inside the state dir may not).

    Raises:
        NotOursError: it is a link, not a directory, another uid's, or
            writable by group or others.
    """
    info = os.stat(path) if follow else os.lstat(path)
    reason = _why_not_ours(path, info, what)
    if reason is not None:
        raise NotOursError(reason)


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
        self._durable: Encoded | None = None  # the content that is durable
        self._on_disk: Encoded | None = None  # what each file holds (b"": not that content)
        self._loaded = "import"  # how load() found the task: authority, stale_export, import

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

    def _exists(self) -> bool:
        """Whether the task's directory exists.

        Raises:
            NotOursError: it is a link, or not a directory of the daemon's own.
        """
        try:
            info = os.lstat(self.directory)
        except FileNotFoundError:
            return False
        reason = _why_not_ours(self.directory, info, f"task {self.task}'s directory")
        if reason is not None:
            raise NotOursError(reason)
        return True

    def _read_json(self, name: str, corrupt: list[str]) -> tuple[bool, Any]:
        path = self.directory / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return False, None
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            corrupt.append(self.set_aside(name, "a symbolic link, not a file of ctxwind's"))
            return False, None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                fd = -1
                corrupt.append(self.set_aside(name, "not a regular file"))
                return False, None
            with os.fdopen(fd, "rb") as file:
                fd = -1
                raw = file.read()
        finally:
            if fd >= 0:
                os.close(fd)
        try:
            return True, json.loads(raw)
        except (ValueError, RecursionError) as exc:
            corrupt.append(self.set_aside(name, f"not JSON: {type(exc).__name__}"))
            return False, None

    def _import(self, deleted_range: list[int] | None, corrupt: list[str]) -> TaskRecord:
        """The record of a directory without a format-2 authority: the export and a range."""
        found, updates = self._read_json(HISTORY_FILE, corrupt)
        return TaskRecord(updates if found else None, deleted_range)

    def load(self, build: Callable[[TaskRecord], T]) -> T:
        """Read the task's files and build its state.

        Stale temp files of an interrupted write are removed first. The
        authority is read when it is there; the export only when it is not
        (or is of format 1). A file that does not parse, or that ``build``
        rejects, is renamed aside and logged, and the task starts from what
        is left (a rejected authority: the export, imported).

        Args:
            build: makes the state from a record (an empty one for a new task).

        Returns:
            The state.

        Raises:
            NotOursError: the task's directory is a link or not the daemon's own.
            OSError: the directory cannot be read.
        """
        self._durable = self._on_disk = None
        self._loaded = "import"
        corrupt: list[str] = []
        if not self._exists():
            self._loaded = "authority"  # nothing stored: an empty state is what is there
            return build(TaskRecord())
        for entry in os.listdir(self.directory):
            if _is_temp(entry):
                try:
                    os.unlink(self.directory / entry)
                except OSError:
                    pass
        found_meta, meta = self._read_json(META_FILE, corrupt)
        record: TaskRecord | None = None
        deleted_range: list[int] | None = None
        if found_meta:
            if isinstance(meta, dict) and meta.get("format") == _OLD_FORMAT:
                if valid_range(meta.get("deleted_range")) and set(meta) <= {
                    "format",
                    "deleted_range",
                }:
                    deleted_range = meta.get("deleted_range")
                else:
                    corrupt.append(self.set_aside(META_FILE, "unexpected content"))
            else:
                try:
                    record = decode_record(meta)[0]
                except ValueError as exc:
                    corrupt.append(self.set_aside(META_FILE, str(exc)))
        if record is not None:
            try:
                state = build(record)
            except Exception as exc:  # whatever the engine rejects the file with
                # The type only: a message could quote the file's (conversation) text.
                corrupt.append(self.set_aside(META_FILE, f"rejected: {type(exc).__name__}"))
            else:
                self._loaded = "authority" if self._export_in_step() else "stale_export"
                return state
        record = self._import(deleted_range, corrupt)
        try:
            return build(record)
        except Exception as exc:
            if record.updates is None:
                raise
            corrupt.append(self.set_aside(HISTORY_FILE, f"rejected: {type(exc).__name__}"))
            return build(TaskRecord(None, deleted_range))

    def _export_in_step(self) -> bool:
        """Whether the export was renamed after the authority (as every whole write does)."""
        try:
            export = self.history_path.stat().st_mtime_ns
            authority = self.meta_path.stat().st_mtime_ns
        except OSError:
            return False
        return export >= authority

    def mark_current(self, encoded: Encoded) -> None:
        """Record that this content, as just loaded, is durable.

        Loading never writes. What is on disk may still differ from the
        content: an imported directory has no format-2 authority yet, and an
        export older than its authority (a crash between the two renames) is
        behind. The first write after a change brings both files level.
        """
        self._durable = encoded
        if self._loaded == "authority":
            self._on_disk = encoded
        elif self._loaded == "stale_export":
            self._on_disk = Encoded(encoded.authority, b"")
        else:
            self._on_disk = Encoded(b"", encoded.export)

    def is_current(self, encoded: Encoded) -> bool:
        """Whether this content is durable (was last written or loaded)."""
        return encoded == self._durable

    def write(self, encoded: Encoded) -> bool:
        """Make the task's files hold this content: the authority first, then the export.

        The authority alone makes the state durable; a crash before the
        export's rename leaves the export one state behind, never the
        authority. A file already holding its bytes is skipped.

        Returns:
            Whether anything was written.

        Raises:
            NotOursError: the task's directory is a link or not the daemon's own.
            OSError: a write failed; what was durable before stays so.
        """
        if encoded == self._durable:
            return False
        if not self._exists():
            self.tasks_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            check_private_dir(self.tasks_dir, "tasks dir", follow=False)
            os.mkdir(self.directory, 0o700)  # never an existing one: it appeared since
            fsync_dir(self.tasks_dir)
            fsync_dir(self.tasks_dir.parent)
        on_disk = self._on_disk
        if on_disk is None or encoded.authority != on_disk.authority:
            # Until the export is written too, the export on disk is unknown.
            self._on_disk = None
            write_atomic(self.directory, META_FILE, encoded.authority)
        if on_disk is None or encoded.export != on_disk.export:
            write_atomic(self.directory, HISTORY_FILE, encoded.export)
        self._durable = self._on_disk = encoded
        return True


class LockedError(RuntimeError):
    """Another process holds a lock file."""


def acquire_lock(path: Path) -> int:
    """Take an exclusive ``flock`` on ``path`` (created 0600); returns the fd to keep open.

    A link is never followed (``O_NOFOLLOW``) and a file of another uid is
    refused before anything is written to it.

    Raises:
        LockedError: another process holds it.
        OSError: the file cannot be created, is a link (ELOOP), or is not ours.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NOCTTY, 0o600)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise NotOursError(
                f"lock file {path} is not a regular file of the daemon's uid {os.getuid()}"
            )
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


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


class FileTaskStore:
    """One task kept in ``<state_dir>/tasks/<task>/`` (see :class:`TaskFiles`).

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
