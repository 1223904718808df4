"""A task's calibration and basis are the task's own: its kept history's eviction takes
neither, and a task stored before they left the kept history loads with both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ctxwin import proto
from tests._daemon import DaemonProcess
from tests._redis import RedisServer

MODEL = {"id": "m", "context_window": 64_000}

NOTICE = (
    "[ctxwin] This copy of the file's content was removed to save context; a later read "
    "of the same file in this conversation holds a newer copy."
)
UPDATES = [[index, [2, [[0, [[7, "text", [NOTICE], []]]]]]] for index in (4, 6)]

STORED = {
    "format": 2,
    "dialect": "anthropic",
    "deleted_range": [2, 3],
    "calibration": {"ratio": 1.5, "samples": 1},
    "basis": {"length": 7, "digest": "3b9e3cea4c6f125ca36959c4d468f7f9"},
    "updates": UPDATES,
}
"""``ctxwin.json`` of task ``saved`` as the daemon wrote it before the calibration moved from
the kept history to the task's session (commit 515f91a): :func:`conversation` calibrated
once at 1.5 times the estimate, then ``optimize_file_reads`` at ts 7 with range [2, 3]."""


def conversation(tag: str = "") -> list[dict[str, Any]]:
    """An Anthropic conversation reading ``p.py`` four times (results tagged ``tag``)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the parser."}]
    for turn in range(4):
        use = {"type": "tool_use", "id": f"c{turn}", "name": "read_file", "input": {"path": "p.py"}}
        content = f"def parse(): return {turn}{tag}"
        result = {"type": "tool_result", "tool_use_id": f"c{turn}", "content": content}
        messages.append({"role": "assistant", "content": [use]})
        messages.append({"role": "user", "content": [result]})
    return messages


def ok(reply: proto.Reply) -> dict[str, Any]:
    """The result of a reply that must have succeeded."""
    assert reply.ok, (reply.code, reply.message)
    assert reply.result is not None
    return reply.result


def _store_as_before(store: str, tmp_path: Path, request: pytest.FixtureRequest) -> DaemonProcess:
    """A daemon whose store holds task ``saved`` as the daemon wrote it before the move."""
    if store == "file":
        daemon = DaemonProcess(tmp_path)
        directory = daemon.task_dir("saved")
        directory.mkdir(parents=True)
        (directory / "ctxwin.json").write_text(json.dumps(STORED))
        (directory / "context_history.json").write_text(json.dumps(UPDATES))
        return daemon
    import redis as redis_sync

    server: RedisServer = request.getfixturevalue("redis_server")
    client = redis_sync.Redis(unix_socket_path=str(server.socket))
    try:  # as a daemon holding fence 1 wrote it
        client.set("ctxwin:{saved}:fence", "1")
        client.set("ctxwin:{saved}:state", json.dumps({**STORED, "fence": 1}))
    finally:
        client.close()
    return DaemonProcess(tmp_path, "--state-store", server.url)


@pytest.mark.parametrize("store", ["file", "redis"])
def test_a_task_stored_before_the_move_loads_its_calibration_and_basis(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A stored task's calibration scales its estimates and its basis tells its history from a
    rewound one, in files and in Redis; a restart of the conversation keeps the calibration."""
    with _store_as_before(store, tmp_path, request) as daemon:
        task = {"task": "saved", "dialect": "anthropic"}
        shown = ok(daemon.call("inspect", task))
        assert shown["calibration"] == {"ratio": 1.5, "samples": 1}
        assert (shown["deleted_range"], shown["updates"]) == ([2, 3], UPDATES)
        estimated = {**task, "model": MODEL, "estimate": True}
        same = ok(daemon.call("prepare_request", {**estimated, "messages": conversation()}))
        assert same["calibration"] == 1.5
        assert same["deleted_range"] == [2, 3]
        assert "restarted" not in same
        # As long, different inside the prefix the edits were made on: only the stored basis
        # tells (the range [2, 3] ends well before the history does).
        rewound = conversation(tag="b")
        other = ok(daemon.call("truncated_messages", {**task, "messages": rewound}))
        assert other.get("restarted") is True
        assert other["messages"] == rewound
        shown = ok(daemon.call("inspect", task))
        assert (shown["deleted_range"], shown["updates"]) == (None, [])
        assert shown["calibration"] == {"ratio": 1.5, "samples": 1}
        ok(daemon.call("flush", {"task": "saved"}))
        if store == "file":
            written = json.loads((daemon.task_dir("saved") / "ctxwin.json").read_text())
            assert written["calibration"] == {"ratio": 1.5, "samples": 1}


def _prepare(daemon: DaemonProcess, task: str, usage: dict[str, Any] | None) -> dict[str, Any]:
    """A ``prepare_request`` with estimates on :func:`conversation`, reporting ``usage``."""
    args: dict[str, Any] = {"task": task, "dialect": "anthropic", "messages": conversation()}
    args.update(model=MODEL, estimate=True)
    if usage is not None:
        args["previous_request"] = usage
    return ok(daemon.call("prepare_request", args))


def _usage(result: dict[str, Any], ts: int, factor: float) -> dict[str, Any]:
    """A report of ``factor`` times the uncalibrated estimate ``result`` made."""
    raw = result["estimated_tokens"] / result["calibration"]
    return {"ts": ts, "tokens_in": round(raw * factor), "tokens_out": 5}


def test_the_calibration_and_its_last_estimate_outlive_the_kept_history_s_eviction(
    tmp_path: Path,
) -> None:
    """With room for one history, another task's request evicts this task's; its calibration
    stays, and the report of its last view still calibrates against that view's estimate."""
    with DaemonProcess(tmp_path, "--history-cache-mb", "0") as daemon:
        first = _prepare(daemon, "a", None)
        second = _prepare(daemon, "a", _usage(first, 1, 1.5))
        assert second["calibration"] == pytest.approx(1.5, rel=0.01)
        _prepare(daemon, "b", None)  # the only history kept is now b's
        shown = ok(daemon.call("inspect", {"task": "a", "dialect": "anthropic"}))
        assert shown["history"] is None
        assert shown["calibration"]["samples"] == 1
        # How long the history of its last op was is the task's too: a checkpoint range past
        # it is still refused.
        rollback = {"task": "a", "dialect": "anthropic", "ts": 1, "deleted_range": [2, 40]}
        past = daemon.call("rollback", rollback)
        assert (past.ok, past.code) == (False, "bad_request")
        assert "which has 9 internal messages" in (past.message or "")
        third = _prepare(daemon, "a", _usage(second, 2, 2.5))
        calibration = ok(daemon.call("inspect", {"task": "a"}))["calibration"]
        assert calibration["samples"] == 2
        # Moved 0.3 of the way from 1.5 toward 2.5.
        assert calibration["ratio"] == pytest.approx(1.8, rel=0.01)
        assert third["calibration"] == calibration["ratio"]
        ok(daemon.call("flush", {"task": "a"}))
        written = json.loads((daemon.task_dir("a") / "ctxwin.json").read_text())
        assert written["calibration"] == calibration
