"""Atomic writes, loading and lock files of the daemon's persistence layer."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from ctxwin.daemon._persist import (
    LockedError,
    TaskFiles,
    acquire_lock,
    encode_history,
    encode_meta,
    write_atomic,
)


def listing(directory: Path) -> list[str]:
    """Sorted names in a directory."""
    return sorted(os.listdir(directory))


def test_write_atomic_replaces_the_file_and_leaves_nothing_else(tmp_path: Path) -> None:
    """The target holds exactly the new bytes and no temp file remains."""
    (tmp_path / "f.json").write_bytes(b"old")
    write_atomic(tmp_path, "f.json", b"new content")
    assert (tmp_path / "f.json").read_bytes() == b"new content"
    assert listing(tmp_path) == ["f.json"]


def test_short_writes_are_continued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """os.write writing only part of the buffer is called again for the rest."""
    real_write = os.write
    calls: list[int] = []

    def short_write(fd: int, data: Any) -> int:
        calls.append(len(data))
        return real_write(fd, bytes(data[:3]))

    monkeypatch.setattr(os, "write", short_write)
    write_atomic(tmp_path, "f.json", b"0123456789")
    monkeypatch.undo()
    assert (tmp_path / "f.json").read_bytes() == b"0123456789"
    assert calls == [10, 7, 4, 1]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG, errno.EIO])
def test_a_failed_write_keeps_the_old_file_and_removes_the_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """A write error after a partial write leaves the old file as it was and no temp file."""
    (tmp_path / "f.json").write_bytes(b"good")
    real_write = os.write
    state = {"calls": 0}

    def failing_write(fd: int, data: Any) -> int:
        state["calls"] += 1
        if state["calls"] == 1:
            return real_write(fd, bytes(data[:2]))
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(OSError) as raised:
        write_atomic(tmp_path, "f.json", b"new and longer")
    monkeypatch.undo()
    assert raised.value.errno == code
    assert (tmp_path / "f.json").read_bytes() == b"good"
    assert listing(tmp_path) == ["f.json"]


def test_a_zero_length_write_counts_as_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """os.write returning 0 raises ENOSPC instead of looping forever."""
    monkeypatch.setattr(os, "write", lambda fd, data: 0)
    with pytest.raises(OSError) as raised:
        write_atomic(tmp_path, "f.json", b"data")
    monkeypatch.undo()
    assert raised.value.errno == errno.ENOSPC
    assert listing(tmp_path) == []


def _empty() -> list[Any]:
    return []


def _build(updates: Any, deleted_range: list[int] | None) -> tuple[Any, list[int] | None]:
    if updates is not None and not isinstance(updates, list):
        raise ValueError("an overlay is a list")
    return updates, deleted_range


def test_task_files_round_trip_and_skip_unchanged_content(tmp_path: Path) -> None:
    """Written files load back; writing the same content again touches nothing."""
    files = TaskFiles(tmp_path, "t1")
    history = encode_history([[1, [0, [[0, [[5, "text", ["n"], []]]]]]]])
    meta = encode_meta([2, 5])
    assert files.write(history, meta) is True
    assert files.write(history, meta) is False
    assert json.loads(files.meta_path.read_text()) == {"format": 1, "deleted_range": [2, 5]}
    loaded = TaskFiles(tmp_path, "t1").load(_build, _empty)
    assert loaded == (json.loads(history), [2, 5])


def test_stale_temp_files_are_removed_on_load(tmp_path: Path) -> None:
    """Temp files left by a killed writer are deleted when the task loads."""
    files = TaskFiles(tmp_path, "t1")
    files.write(encode_history([]), encode_meta(None))
    (files.directory / ".context_history.json.123.4.tmp").write_bytes(b"[[1, ")
    (files.directory / "notes.txt").write_bytes(b"kept")
    TaskFiles(tmp_path, "t1").load(_build, _empty)
    assert listing(files.directory) == ["context_history.json", "ctxwin.json", "notes.txt"]


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("context_history.json", b"[[1, [0"),
        ("context_history.json", b'{"a": 1}'),
        ("ctxwin.json", b'{"format": 2, "deleted_range": null}'),
        ("ctxwin.json", b'{"format": 1, "deleted_range": [3, 4]}'),
    ],
)
def test_corrupt_files_are_set_aside_and_logged(tmp_path: Path, name: str, content: bytes) -> None:
    """A file that does not parse or is rejected is renamed aside, logged, and not used."""
    directory = tmp_path / "tasks" / "t1"
    directory.mkdir(parents=True)
    (directory / name).write_bytes(content)
    with capture_logs() as logs:
        loaded = TaskFiles(tmp_path, "t1").load(_build, _empty)
    assert loaded == (None, None)
    kept = [entry for entry in listing(directory) if entry.startswith(name + ".corrupt-")]
    assert len(kept) == 1
    assert (directory / kept[0]).read_bytes() == content
    assert [(log["event"], log["task"], log["file"]) for log in logs] == [
        ("corrupt_file", "t1", name)
    ]


def test_a_missing_task_directory_loads_empty(tmp_path: Path) -> None:
    """A task never written starts from the empty state."""
    assert TaskFiles(tmp_path, "new").load(_build, _empty) == []
    assert not (tmp_path / "tasks").exists()


def test_a_lock_is_exclusive_until_released(tmp_path: Path) -> None:
    """A second flock on the same lock file fails until the first holder closes it."""
    lock = tmp_path / "ctxwind.lock"
    fd = acquire_lock(lock)
    with pytest.raises(LockedError):
        acquire_lock(lock)
    os.close(fd)
    os.close(acquire_lock(lock))
