"""``keep_task``: a compaction that leaves the task, the first user message, as it is."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ctxwin.client import Client
from ctxwin.engine import DEFAULT_NOTICES, TaskState, compact
from tests._client_data import conversation
from tests._daemon import DaemonProcess


def _first_text(message: Mapping[str, Any]) -> str:
    content = message["content"]
    assert isinstance(content, list)
    return str(content[0]["text"])


def test_compact_with_keep_task_leaves_the_task_and_adds_the_notice() -> None:
    """keep_task keeps message 0 and still notices message 1; the default replaces both (§5)."""
    messages = conversation(10)
    kept, default = TaskState(), TaskState()
    compact(kept, messages, "quarter", 5, keep_task=True)
    compact(default, messages, "quarter", 5)
    view = kept.truncated_messages(messages)
    assert "the task" == _first_text(view[0])
    assert DEFAULT_NOTICES.truncation == _first_text(view[1])
    replaced = default.truncated_messages(messages)
    assert DEFAULT_NOTICES.first_user == _first_text(replaced[0])
    assert kept.deleted_range == default.deleted_range


def test_the_truncation_notice_claims_nothing_about_the_task() -> None:
    """The default notice does not say the task was kept: by default it is replaced."""
    assert "task" not in DEFAULT_NOTICES.truncation.lower()
    assert "kept" not in DEFAULT_NOTICES.truncation.lower()


def test_keep_task_over_the_wire(shared_daemon: DaemonProcess) -> None:
    """Both ops take keep_task; the README's recovery (compact, then the view) keeps the task."""
    messages = conversation(10)
    with Client(shared_daemon.endpoint, timeout=10) as client:
        task = client.task("keep-task-1")
        assert {"deleted_range": [2, 15], "changed": True} == task.compact(
            messages, "quarter", keep_task=True
        )
        view = task.truncated_messages(messages)["messages"]
        assert "the task" == _first_text(view[0])
        assert DEFAULT_NOTICES.truncation == _first_text(view[1])
        other = client.task("keep-task-2")
        assert {"changed": True} == other.apply_truncation_notice(messages, keep_task=True)
        assert [1] == [entry[0] for entry in other.inspect()["updates"]]
        third = client.task("keep-task-3")
        assert {"changed": True} == third.apply_truncation_notice(messages)
        assert [0, 1] == sorted(entry[0] for entry in third.inspect()["updates"])
        for handle in (task, other, third):
            handle.close()
