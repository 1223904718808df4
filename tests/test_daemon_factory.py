"""The shared daemons of tests/conftest.py keep tests apart: a task belongs to one test."""

from __future__ import annotations

import pytest

from ctxwin.client import Client
from tests._daemon import DaemonFactory, DaemonProcess, wait_until

MESSAGES = [{"role": "user", "content": [{"type": "text", "text": "Fix the build."}]}]


def _stops(daemon: DaemonProcess, task: str) -> int:
    return daemon.log().count(f'{{"task": "{task}", "event": "actor_stopped"')


def test_a_task_an_earlier_test_used_is_named_and_each_tests_tasks_are_closed(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """One configuration, one daemon; after a test its tasks are closed, so a later test that
    uses one starts it again and is told whose it was; its own tasks it may use again."""
    factory = DaemonFactory(tmp_path_factory.mktemp)
    try:
        daemon = factory("--debounce-ms", "50")
        assert daemon is factory("--debounce-ms", "50")
        assert daemon is not factory("--debounce-ms", "50", group="other")
        with Client(daemon.endpoint, timeout=30) as client:
            client.task("first-task").truncated_messages(MESSAGES)
            assert [] == factory.claim("first")
            wait_until(lambda: _stops(daemon, "first-task") == 1, 10, "the task is closed")
            client.task("first-task").inspect()
            assert [] == factory.claim("first")  # a test's own task, again
            client.task("second-task").truncated_messages(MESSAGES)
            client.task("first-task").truncated_messages(MESSAGES)
            taken = factory.claim("second")
        assert ["task 'first-task' of a shared daemon was first's"] == taken
    finally:
        factory.close()
