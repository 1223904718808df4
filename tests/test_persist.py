"""Atomic writes, loading and lock files of the daemon's persistence layer."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from ctxwin import engine
from ctxwin.daemon.store._base import TaskExtras
from ctxwin.daemon.store._files import (
    LockedError,
    NotOursError,
    TaskFiles,
    acquire_lock,
    write_atomic,
)
from ctxwin.daemon.store._record import (
    TaskRecord,
    build_state,
    decode_record,
    encode_task,
    record_of,
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


Loaded = tuple[Any, list[int] | None, tuple[float, int] | None, str]

OVERLAY = [[1, [0, [[0, [[5, "text", ["n"], []]]]]]]]


def _build(record: TaskRecord) -> Loaded:
    if record.updates is not None and not isinstance(record.updates, list):
        raise ValueError("an overlay is a list")
    return record.updates, record.deleted_range, record.calibration, record.dialect


def test_task_files_round_trip_and_skip_unchanged_content(tmp_path: Path) -> None:
    """Written files load back whole, calibration and dialect too; the same again writes nothing."""
    files = TaskFiles(tmp_path, "t1")
    encoded = encode_task(TaskRecord(OVERLAY, [2, 5], (1.25, 3), "anthropic"))
    assert files.write(encoded) is True
    assert files.write(encoded) is False
    authority = json.loads(files.meta_path.read_text())
    assert authority == {
        "format": 2,
        "dialect": "anthropic",
        "deleted_range": [2, 5],
        "calibration": {"ratio": 1.25, "samples": 3},
        "updates": OVERLAY,
    }
    assert json.loads(files.history_path.read_text()) == OVERLAY
    loaded = TaskFiles(tmp_path, "t1").load(_build)
    assert loaded == (OVERLAY, [2, 5], (1.25, 3), "anthropic")


def test_the_authority_is_loaded_and_the_export_is_not_read(tmp_path: Path) -> None:
    """With a format-2 ctxwin.json, a context_history.json from another state is ignored."""
    files = TaskFiles(tmp_path, "t1")
    files.write(encode_task(TaskRecord(OVERLAY, [2, 5])))
    files.history_path.write_bytes(b"[]")  # an export from another (older) state
    assert TaskFiles(tmp_path, "t1").load(_build) == (OVERLAY, [2, 5], None, "cline")


def test_an_export_older_than_its_authority_is_rewritten_by_the_next_write(tmp_path: Path) -> None:
    """A crash between the two renames leaves the export behind; the next write brings it level."""
    files = TaskFiles(tmp_path, "t1")
    files.write(encode_task(TaskRecord(OVERLAY, [2, 5])))
    files.history_path.write_bytes(b"[]")  # the export of the state before
    stale = files.meta_path.stat().st_mtime_ns - 10**9
    os.utime(files.history_path, ns=(stale, stale))
    again = TaskFiles(tmp_path, "t1")
    loaded = encode_task(again.load(lambda record: record))
    again.mark_current(loaded)
    assert again.is_current(loaded) is True  # loading never writes
    changed = encode_task(TaskRecord(OVERLAY, [2, 6]))
    assert again.write(changed) is True
    assert json.loads(again.history_path.read_text()) == OVERLAY
    assert json.loads(again.meta_path.read_text())["deleted_range"] == [2, 6]


@pytest.mark.parametrize(
    "meta",
    [None, b'{"format": 1, "deleted_range": [2, 7]}', b'{"format": 1, "deleted_range": null}'],
)
def test_a_directory_without_a_format_2_authority_is_imported(
    tmp_path: Path, meta: bytes | None
) -> None:
    """An export (and a format-1 range) load as the task; the next write adds the authority."""
    directory = tmp_path / "tasks" / "t1"
    directory.mkdir(parents=True)
    (directory / "context_history.json").write_bytes(json.dumps(OVERLAY).encode())
    expected_range = None
    if meta is not None:
        (directory / "ctxwin.json").write_bytes(meta)
        expected_range = json.loads(meta)["deleted_range"]
    files = TaskFiles(tmp_path, "t1")
    record = files.load(lambda record: record)
    assert (record.updates, record.deleted_range) == (OVERLAY, expected_range)
    files.mark_current(encode_task(record))
    assert files.write(encode_task(record)) is False  # loading never writes
    changed = TaskRecord(OVERLAY, expected_range, (2.0, 1))
    assert files.write(encode_task(changed)) is True
    assert json.loads(files.meta_path.read_text())["format"] == 2
    assert TaskFiles(tmp_path, "t1").load(_build) == (OVERLAY, expected_range, (2.0, 1), "cline")


def test_stale_temp_files_are_removed_on_load(tmp_path: Path) -> None:
    """Temp files left by a killed writer are deleted when the task loads."""
    files = TaskFiles(tmp_path, "t1")
    files.write(encode_task(TaskRecord()))
    (files.directory / ".context_history.json.123.4.tmp").write_bytes(b"[[1, ")
    (files.directory / ".ctxwin.json.123.5.tmp").write_bytes(b'{"form')
    (files.directory / "notes.txt").write_bytes(b"kept")
    TaskFiles(tmp_path, "t1").load(_build)
    assert listing(files.directory) == ["context_history.json", "ctxwin.json", "notes.txt"]


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("context_history.json", b"[[1, [0"),
        ("context_history.json", b'{"a": 1}'),
        ("ctxwin.json", b'{"format": 3, "deleted_range": null}'),
        ("ctxwin.json", b'{"format": 2, "deleted_range": null}'),
        ("ctxwin.json", b'{"format": 2, "deleted_range": null, "updates": {"a": 1}}'),
        ("ctxwin.json", b'{"format": 2, "deleted_range": null, "updates": [], "dialect": 5}'),
        (
            "ctxwin.json",
            b'{"format": 2, "deleted_range": null, "updates": [], '
            b'"calibration": {"ratio": -1, "samples": 2}}',
        ),
        ("ctxwin.json", b'{"format": 1, "deleted_range": [3, 4]}'),
        ("ctxwin.json", b"\x00\x01"),
    ],
)
def test_corrupt_files_are_set_aside_and_logged(tmp_path: Path, name: str, content: bytes) -> None:
    """A file that does not parse or is rejected is renamed aside, logged, and not used."""
    directory = tmp_path / "tasks" / "t1"
    directory.mkdir(parents=True)
    (directory / name).write_bytes(content)
    with capture_logs() as logs:
        loaded = TaskFiles(tmp_path, "t1").load(_build)
    assert loaded == (None, None, None, "cline")
    kept = [entry for entry in listing(directory) if entry.startswith(name + ".corrupt-")]
    assert len(kept) == 1
    assert (directory / kept[0]).read_bytes() == content
    assert [(log["event"], log["task"], log["file"]) for log in logs] == [
        ("corrupt_file", "t1", name)
    ]


def test_a_rejected_authority_falls_back_to_the_export(tmp_path: Path) -> None:
    """An authority the engine rejects is set aside and the export is imported instead."""
    directory = tmp_path / "tasks" / "t1"
    directory.mkdir(parents=True)
    (directory / "context_history.json").write_bytes(json.dumps(OVERLAY).encode())
    (directory / "ctxwin.json").write_bytes(
        b'{"format": 2, "deleted_range": [2, 4], "updates": {"not": "a list"}}'
    )
    with capture_logs() as logs:
        loaded = TaskFiles(tmp_path, "t1").load(_build)
    assert loaded == (OVERLAY, None, None, "cline")
    assert [(log["event"], log["file"]) for log in logs] == [("corrupt_file", "ctxwin.json")]


def test_a_missing_task_directory_loads_empty(tmp_path: Path) -> None:
    """A task never written starts from the empty state."""
    assert TaskFiles(tmp_path, "new").load(_build) == (None, None, None, "cline")
    assert not (tmp_path / "tasks").exists()


def test_records_round_trip_with_a_fence() -> None:
    """decode_record reads back what encode_task wrote, fence included."""
    record = TaskRecord(OVERLAY, None, (0.5, 1), "gemini")
    authority = encode_task(record, fence=7).authority
    assert decode_record(json.loads(authority)) == (record, 7)


def test_a_lock_is_exclusive_until_released(tmp_path: Path) -> None:
    """A second flock on the same lock file fails until the first holder closes it."""
    lock = tmp_path / "ctxwind.lock"
    fd = acquire_lock(lock)
    with pytest.raises(LockedError):
        acquire_lock(lock)
    os.close(fd)
    os.close(acquire_lock(lock))


def test_a_lock_file_planted_as_a_link_is_not_followed(tmp_path: Path) -> None:
    """A lock path that is a symbolic link to a file: refused (ELOOP), the file untouched."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's secret")
    (tmp_path / "ctxwind.lock").symlink_to(victim)
    with pytest.raises(OSError) as raised:
        acquire_lock(tmp_path / "ctxwind.lock")
    assert errno.ELOOP == raised.value.errno
    assert b"root's secret" == victim.read_bytes()


@pytest.mark.skipif(os.geteuid() != 0, reason="a file of another uid needs root")
def test_a_lock_file_of_another_uid_is_refused(tmp_path: Path) -> None:
    """A lock file another user made is neither truncated nor locked."""
    lock = tmp_path / "ctxwind.lock"
    lock.write_bytes(b"theirs")
    os.chown(lock, 65534, 65534)
    with pytest.raises(NotOursError, match="not a regular file of the daemon's uid"):
        acquire_lock(lock)
    assert b"theirs" == lock.read_bytes()


def _planted(tmp_path: Path) -> tuple[TaskFiles, Path]:
    """A task whose directory is a link to another directory holding a valid authority."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "ctxwin.json").write_bytes(encode_task(TaskRecord(OVERLAY, [2, 5])).authority)
    (tmp_path / "tasks").mkdir(mode=0o700)
    (tmp_path / "tasks" / "t1").symlink_to(elsewhere)
    return TaskFiles(tmp_path, "t1"), elsewhere


def test_a_planted_task_directory_link_is_neither_read_nor_written(tmp_path: Path) -> None:
    """Load and write refuse a task directory that is a link; what it points to is untouched."""
    files, elsewhere = _planted(tmp_path)
    before = {name: (elsewhere / name).read_bytes() for name in os.listdir(elsewhere)}
    with pytest.raises(NotOursError, match="is a symbolic link"):
        files.load(_build)
    with pytest.raises(NotOursError, match="is a symbolic link"):
        files.write(encode_task(TaskRecord(OVERLAY, [2, 9])))
    assert before == {name: (elsewhere / name).read_bytes() for name in os.listdir(elsewhere)}


def test_a_planted_file_link_in_a_task_directory_is_set_aside_unread(tmp_path: Path) -> None:
    """ctxwin.json as a link to another file: renamed aside (the link), the file never read."""
    files = TaskFiles(tmp_path, "t1")
    files.directory.mkdir(parents=True, mode=0o700)
    secret = tmp_path / "secret.json"
    secret.write_bytes(encode_task(TaskRecord(OVERLAY, [2, 5])).authority)
    files.meta_path.symlink_to(secret)
    with capture_logs() as logs:
        loaded = files.load(_build)
    assert (None, None, None, "cline") == loaded
    assert any("symbolic link" in entry.get("reason", "") for entry in logs)
    assert not files.meta_path.is_symlink()
    assert secret.exists()


@pytest.mark.parametrize("how", ["other-writable", "other-uid"])
def test_a_task_directory_not_ours_is_refused(tmp_path: Path, how: str) -> None:
    """A task directory others may write to, or of another uid: refused, never used."""
    if how == "other-uid" and os.geteuid() != 0:
        pytest.skip("a directory of another uid needs root")
    files = TaskFiles(tmp_path, "t1")
    files.directory.mkdir(parents=True, mode=0o700)
    if how == "other-writable":
        files.directory.chmod(0o777)
        reason = "may be written by others"
    else:
        os.chown(files.directory, 65534, 65534)
        reason = "belongs to uid 65534"
    with pytest.raises(NotOursError, match=reason):
        files.load(_build)
    with pytest.raises(NotOursError, match=reason):
        files.write(encode_task(TaskRecord(OVERLAY, [2, 9])))
    assert [] == os.listdir(files.directory)


def test_the_deleted_set_is_stored_and_a_file_without_it_loads_with_none() -> None:
    """A state's deleted set goes into ctxwin.json and comes back whole, rollback included;
    an authority written before the set existed loads with an empty one."""
    state = engine.TaskState(dialect=engine.get_dialect("anthropic"))
    state.drop([(3, 4), (7, 8)], 10)
    state.drop([(5, 6)], 20)
    record = record_of(state, TaskExtras(None, "anthropic", ()))
    authority = encode_task(record).authority
    assert json.loads(authority)["dropped"] == [
        {"ts": 10, "ranges": [[3, 4], [7, 8]]},
        {"ts": 20, "ranges": [[5, 6]]},
    ]
    loaded = build_state(decode_record(json.loads(authority))[0], engine.DEFAULT_NOTICES)
    assert loaded.dropped == ((3, 8),)
    assert loaded.rollback(15) == 1
    assert list(loaded.dropped) == [(3, 4), (7, 8)]
    older = json.loads(encode_task(TaskRecord(OVERLAY, [2, 5])).authority)
    assert "dropped" not in older
    assert build_state(decode_record(older)[0], engine.DEFAULT_NOTICES).dropped == ()
    bad = {**older, "dropped": [{"ts": 1, "ranges": [[1, 4]]}]}
    with pytest.raises(engine.CorruptStateError):
        build_state(decode_record(bad)[0], engine.DEFAULT_NOTICES)
