"""Disk faults under the real daemon: a file-size limit, a read-only directory, a full disk.

In each case the failure is logged with the task id, the daemon keeps answering,
the last good file stays as it was, no temp file is left, and the next write
after the fault clears succeeds.
"""

from __future__ import annotations

import errno
import functools
import itertools
import json
import os
import resource
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from ctxwin import proto
from tests._daemon import DaemonProcess, wait_until

TASK = "faulty"
FIRST = [
    {"role": "user", "content": [{"type": "text", "text": "Port the build to meson."}]},
    {"role": "assistant", "content": [{"type": "text", "text": "Looking."}]},
]
FSIZE_LIMIT = 256 * 1024


def ok(reply: proto.Reply) -> dict[str, Any]:
    """The result of a reply that must have succeeded."""
    assert reply.ok, (reply.code, reply.message)
    assert reply.result is not None
    return reply.result


def mention(path: str, filler: int, body: str) -> dict[str, Any]:
    """A user message mentioning a file, after ``filler`` characters of other text."""
    text = "x" * filler + f'\n<file_content path="{path}">{body}</file_content>'
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def big_conversation(filler: int) -> list[dict[str, Any]]:
    """Two mentions of one file: replacing the first stores its whole (large) text."""
    answer = {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}
    return [*FIRST, mention("a.txt", filler, "one"), answer, mention("a.txt", 0, "two"), answer]


def small_conversation() -> list[dict[str, Any]]:
    """Two mentions of another file with little text around them."""
    answer = {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}
    return [*FIRST, mention("b.txt", 10, "one"), answer, mention("b.txt", 10, "two"), answer]


@functools.cache
def mount_works() -> str | None:
    """None when tmpfs and bind mounts can be made here, else the reason they cannot."""
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "mount/umount not installed"
    if os.geteuid() != 0:
        return "mounting needs root"
    probe = tempfile.mkdtemp(prefix="ctxwin-mount-probe-")
    try:
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", probe],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            return f"mount is not allowed here: {result.stderr.strip()}"
        subprocess.run(["umount", probe], check=True)
        return None
    finally:
        os.rmdir(probe)


def skip_unless_mounting(purpose: str) -> None:
    """Skip the test, saying what it could not do, when mounts cannot be made here."""
    reason = mount_works()
    if reason is not None:
        pytest.skip(f"cannot {purpose}: {reason}")


def run(*argv: str) -> None:
    """Run a command that must succeed."""
    subprocess.run(list(argv), check=True, capture_output=True)


def events(daemon: DaemonProcess, name: str) -> list[dict[str, Any]]:
    """The daemon's log events called ``name``."""
    found = []
    for line in daemon.log().splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") == name:
                found.append(event)
    return found


def temp_files(directory: Path) -> list[str]:
    """Names in ``directory`` that are not the task's two state files."""
    return sorted(
        name
        for name in os.listdir(directory)
        if name not in ("context_history.json", "ctxwin.json")
    )


def write_good_state(daemon: DaemonProcess) -> bytes:
    """A first small state, flushed; returns the history file's bytes."""
    ok(daemon.call("apply_truncation_notice", {"task": TASK, "ts": 1, "messages": FIRST}))
    assert ok(daemon.call("flush", {"task": TASK}))["flushed"] in (0, 1)  # 0: debounced first
    assert ok(daemon.call("inspect", {"task": TASK}))["dirty"] is False
    return (daemon.task_dir(TASK) / "context_history.json").read_bytes()


def assert_fault_handled(daemon: DaemonProcess, good: bytes, error: str) -> None:
    """The flush failed with a reason, the daemon answers, the old file and no temp file."""
    reply = daemon.call("flush", {"task": TASK})
    assert (reply.ok, reply.code) == (False, "internal")
    assert reply.message is not None
    assert error in reply.message
    assert ok(daemon.call("ping"))["pong"] is True
    assert ok(daemon.call("stats"))["write_failures"] >= 1
    assert (daemon.task_dir(TASK) / "context_history.json").read_bytes() == good
    # A retry under way may hold a temp file for a moment; none may stay.
    wait_until(lambda: temp_files(daemon.task_dir(TASK)) == [], 10, "no temp file remains")
    failures = events(daemon, "write_failed")
    assert failures
    assert (failures[-1]["task"], error in failures[-1]["error"]) == (TASK, True)


def assert_written_now(daemon: DaemonProcess) -> None:
    """A flush succeeds and the file holds the task's overlay."""
    assert ok(daemon.call("flush", {"task": TASK}))["flushed"] in (0, 1)
    on_disk = json.loads((daemon.task_dir(TASK) / "context_history.json").read_text())
    assert on_disk == ok(daemon.call("inspect", {"task": TASK}))["updates"]
    assert temp_files(daemon.task_dir(TASK)) == []


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, FSIZE_LIMIT))


def test_a_file_size_limit_fails_the_write_not_the_daemon(tmp_path: Path) -> None:
    """Past RLIMIT_FSIZE the write fails with EFBIG; shrinking the state makes writes work again."""
    with DaemonProcess(tmp_path, "--debounce-ms", "20", preexec_fn=_limit_file_size) as daemon:
        good = write_good_state(daemon)
        messages = big_conversation(FSIZE_LIMIT + 4096)
        changed = ok(
            daemon.call("optimize_file_reads", {"task": TASK, "messages": messages, "ts": 100})
        )
        assert changed["changed"] is True
        assert_fault_handled(daemon, good, "EFBIG")
        assert ok(daemon.call("rollback", {"task": TASK, "ts": 50}))["removed"] >= 1
        small = small_conversation()
        ok(daemon.call("optimize_file_reads", {"task": TASK, "messages": small, "ts": 200}))
        assert_written_now(daemon)


def test_an_idle_task_that_cannot_be_written_retries_at_its_back_off(tmp_path: Path) -> None:
    """An idle task whose write fails is retried at its back-off (0.25 s, doubling), no sooner."""
    argv = ("--debounce-ms", "20", "--idle-timeout", "0.2")
    with DaemonProcess(tmp_path, *argv, preexec_fn=_limit_file_size) as daemon:
        write_good_state(daemon)
        messages = big_conversation(FSIZE_LIMIT + 4096)
        ok(daemon.call("optimize_file_reads", {"task": TASK, "messages": messages, "ts": 100}))
        wait_until(lambda: len(events(daemon, "write_failed")) >= 4, 20, "four writes fail")
        failed = events(daemon, "write_failed")[:4]
        assert [1, 2, 3, 4] == [event["failures_in_row"] for event in failed]
        assert [0.25, 0.5, 1.0, 2.0] == [event["retry_in_s"] for event in failed]
        # Each attempt waits out the back-off announced by the one before; the idle
        # sweep alone (every 0.2 s) would try again far sooner.
        at = [datetime.fromisoformat(event["timestamp"]).timestamp() for event in failed]
        gaps = [later - earlier for earlier, later in itertools.pairwise(at)]
        backoffs = [event["retry_in_s"] for event in failed[:-1]]
        assert all(gap >= 0.9 * b for gap, b in zip(gaps, backoffs, strict=True)), gaps
        assert ok(daemon.call("inspect", {"task": TASK}))["dirty"] is True
        ok(daemon.call("rollback", {"task": TASK, "ts": 50}))  # small enough to write again
        assert_written_now(daemon)


@pytest.fixture
def read_only_task_dir(tmp_path: Path) -> Iterator[Path]:
    """The task directory path; the test makes it a read-only bind mount (undone after)."""
    skip_unless_mounting("make a read-only directory for root")
    task_dir = tmp_path / "state" / "tasks" / TASK
    try:
        yield task_dir
    finally:
        subprocess.run(["umount", str(task_dir)], capture_output=True, check=False)


def test_an_unwritable_directory_fails_the_write_then_recovers(
    tmp_path: Path, read_only_task_dir: Path
) -> None:
    """A read-only task dir fails the write; once writable, the retry writes without a flush."""
    with DaemonProcess(tmp_path, "--debounce-ms", "20") as daemon:
        good = write_good_state(daemon)
        run("mount", "--bind", str(read_only_task_dir), str(read_only_task_dir))
        run("mount", "-o", "remount,bind,ro", str(read_only_task_dir))
        small = small_conversation()
        ok(daemon.call("optimize_file_reads", {"task": TASK, "messages": small, "ts": 200}))
        assert_fault_handled(daemon, good, "EROFS")
        run("umount", str(read_only_task_dir))
        expected = ok(daemon.call("inspect", {"task": TASK}))["updates"]
        history = read_only_task_dir / "context_history.json"
        # The backoff retry writes it, without a flush.
        wait_until(
            lambda: json.loads(history.read_text()) == expected, 10, "the failed write is retried"
        )
        assert_written_now(daemon)


@pytest.fixture
def small_state_fs(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs as the daemon's state dir (unmounted after)."""
    skip_unless_mounting("mount a small tmpfs for a full disk")
    state = tmp_path / "state"
    state.mkdir()
    run("mount", "-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs", str(state))
    try:
        yield state
    finally:
        if subprocess.run(["umount", str(state)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(state)], capture_output=True, check=False)


def fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` up; returns the filler file."""
    filler = directory / "filler"
    chunk = b"\0" * 4096
    code = 0
    with filler.open("wb", buffering=0) as handle:
        while not code:
            try:
                handle.write(chunk)
            except OSError as exc:
                code = exc.errno or -1
    assert code == errno.ENOSPC
    return filler


def test_a_full_disk_fails_the_write_then_recovers(tmp_path: Path, small_state_fs: Path) -> None:
    """ENOSPC fails the write and leaves the old file; after space is freed the flush works."""
    with DaemonProcess(tmp_path, "--debounce-ms", "20") as daemon:
        good = write_good_state(daemon)
        filler = fill(small_state_fs)
        messages = big_conversation(8192)
        ok(daemon.call("optimize_file_reads", {"task": TASK, "messages": messages, "ts": 300}))
        assert_fault_handled(daemon, good, "ENOSPC")
        filler.unlink()
        assert_written_now(daemon)
