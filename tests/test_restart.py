"""A task run again or rewound under the same id: the real daemon starts it over, never fails."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from ctxwin import engine, proto
from ctxwin.client import Client
from ctxwin.client.integrations import Turn
from ctxwin.client.integrations import openai as ctxwin_openai
from tests._conversation import read_file
from tests._daemon import DaemonProcess
from tests._fake_provider import CHAT, FakeProvider

NOTICE = engine.DEFAULT_NOTICES.truncation
MODEL: proto.Model = {"id": "small-model", "context_window": 20_000}
OVER: proto.Usage = {"ts": 1, "tokens_in": 19_000}  # over the 16,000 allowed: a cut is due
BODY = "x " * 2_000

History = list[dict[str, Any]]


def chat(turns: int, tag: str = "") -> History:
    """An OpenAI Chat conversation: system, task, then ``turns`` read calls with results."""
    messages: History = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "Fix the parser."},
    ]
    for turn in range(turns):
        call = {
            "id": f"c{turn}{tag}",
            "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": f"f{turn}.py"})},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{turn}{tag}", "content": BODY + tag})
    return messages


def anthropic(turns: int, tag: str = "") -> History:
    """An Anthropic conversation: the task, then ``turns`` tool_use/tool_result turns."""
    messages: History = [{"role": "user", "content": "Fix the parser."}]
    for turn in range(turns):
        use = {"type": "tool_use", "id": f"c{turn}{tag}", "name": "read_file", "input": {}}
        result = {"type": "tool_result", "tool_use_id": f"c{turn}{tag}", "content": BODY + tag}
        messages.append({"role": "assistant", "content": [use]})
        messages.append({"role": "user", "content": [result]})
    return messages


def cline(turns: int, tag: str = "") -> History:
    """A Cline conversation: the task, a reply, then ``turns`` result/reply turns."""
    messages: History = [
        {"role": "user", "content": [{"type": "text", "text": "<task>Fix the parser</task>"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Reading."}]},
    ]
    for turn in range(turns):
        messages.append({"role": "user", "content": [{"type": "text", "text": BODY + tag}]})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"ok {turn}"}]})
    return messages


DIALECTS: dict[str, Callable[..., History]] = {
    "openai-chat": chat,
    "anthropic": anthropic,
    "cline": cline,
}


def _cut(client: Client, task: str, dialect: str, history: History) -> list[int]:
    """Cut ``history`` once (a reported usage over the window); the range it made."""
    prepared = client.task(task, dialect=dialect).prepare_request(
        history, MODEL, previous_request=OVER
    )
    deleted = prepared["deleted_range"]
    assert deleted is not None
    assert prepared["range_updated"]
    assert "restarted" not in prepared
    return list(deleted)


@pytest.mark.parametrize("dialect", list(DIALECTS))
@pytest.mark.parametrize("turns", [6, 3, 1])
def test_a_history_shorter_than_the_range_starts_the_task_over(
    client: Client, dialect: str, turns: int
) -> None:
    """The same task given a shorter history (a re-run) sends all of it and says it restarted."""
    make = DIALECTS[dialect]
    task = f"shorter-{dialect}-{turns}"
    deleted = _cut(client, task, dialect, make(30))
    shorter = make(turns)
    assert len(shorter) <= deleted[1]  # the old range lies beyond the new history
    again = client.task(task, dialect=dialect)  # a new handle, as a new process has
    prepared = again.prepare_request(shorter, MODEL)
    assert shorter == prepared["messages"]
    assert prepared["deleted_range"] is None
    assert prepared.get("restarted") is True
    state = again.inspect()
    assert state["deleted_range"] is None
    assert state["updates"] == []
    # The next turn of the new conversation goes on normally.
    longer = make(turns + 1)
    follow = again.prepare_request(longer, MODEL)
    assert longer == follow["messages"]
    assert "restarted" not in follow


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_a_history_that_differs_before_the_range_end_starts_the_task_over(
    client: Client, dialect: str
) -> None:
    """A rewound history as long as the old one, different inside the range, starts over."""
    make = DIALECTS[dialect]
    task = f"differs-{dialect}"
    _cut(client, task, dialect, make(30))
    other = make(30, tag="b")
    prepared = client.task(task, dialect=dialect).prepare_request(other, MODEL)
    assert other == prepared["messages"]
    assert prepared["deleted_range"] is None
    assert prepared.get("restarted") is True


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_the_history_the_range_was_made_on_keeps_it(client: Client, dialect: str) -> None:
    """Grown by new turns, or cut back behind its newest messages only, the range stands."""
    make = DIALECTS[dialect]
    task = f"same-{dialect}"
    deleted = _cut(client, task, dialect, make(30))
    handle = client.task(task, dialect=dialect, delta=False)
    for history in (make(32), make(30)[:-1], make(31)):
        prepared = handle.prepare_request(history, MODEL)
        assert deleted == prepared["deleted_range"]
        assert "restarted" not in prepared
        assert len(prepared["messages"]) < len(history)


def test_a_range_set_by_the_caller_is_taken_on_any_history(client: Client) -> None:
    """A checkpoint restore sets the range it had: no restart, and later turns keep it."""
    task = "restore-chat"
    _cut(client, task, "openai-chat", chat(30))
    handle = client.task(task, dialect="openai-chat")
    restored = chat(8)
    prepared = handle.prepare_request(restored, MODEL, deleted_range=[2, 5])
    assert [2, 5] == prepared["deleted_range"]
    assert "restarted" not in prepared
    follow = handle.prepare_request(chat(9), MODEL)
    assert [2, 5] == follow["deleted_range"]
    assert "restarted" not in follow
    # A range past the end of the history leaves the first pair (with the first cut's notice).
    beyond = handle.prepare_request(chat(3), MODEL, deleted_range=[2, 40])["messages"]
    assert [chat(3)[:2], chat(3)[2]] == [beyond[:2], beyond[-1]]
    assert NOTICE == beyond[2]["content"]


def test_plan_says_a_restart_would_happen_and_changes_nothing(client: Client) -> None:
    """plan on a re-run's history answers restarted and leaves the range and edits alone."""
    task = "plan-anthropic"
    deleted = _cut(client, task, "anthropic", anthropic(30))
    handle = client.task(task, dialect="anthropic")
    before = handle.inspect()
    planned = handle.plan(anthropic(3), MODEL)
    assert planned.get("restarted") is True
    assert planned["deleted_range"] is None
    after = handle.inspect()
    assert deleted == after["deleted_range"]
    assert before["updates"] == after["updates"]


def test_the_prefix_a_range_was_made_on_outlives_a_daemon_restart(tmp_path: Path) -> None:
    """ctxwin.json keeps the prefix's digest: after a restart a rewound history is still told."""
    with DaemonProcess(tmp_path) as daemon:
        with Client(daemon.endpoint) as first:
            _cut(first, "kept", "cline", cline(30))
            first.flush("kept")
        stored = json.loads((daemon.task_dir("kept") / "ctxwin.json").read_text())
        assert {"length", "digest"} == set(stored["basis"])
        daemon.restart()
        with Client(daemon.endpoint) as second:
            handle = second.task("kept", delta=False)
            same = handle.prepare_request(cline(31), MODEL)
            assert "restarted" not in same
            assert same["deleted_range"] is not None
            other = cline(31, tag="b")
            prepared = handle.prepare_request(other, MODEL)
            assert other == prepared["messages"]
            assert prepared.get("restarted") is True


def _readme_run(provider: FakeProvider, endpoint: str) -> list[Turn]:
    """docs/INTEGRATIONS.md's OpenAI example with a 4,000-token window and no task id."""
    turns: list[Turn] = []
    sdk = openai.OpenAI(base_url=provider.openai_url, api_key="k", max_retries=0)
    client = ctxwin_openai.wrap(sdk, context_window=4_000, endpoint=endpoint, on_turn=turns.append)
    tools: Any = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
    ]
    messages: list[Any] = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "The result of main() is wrong; fix it."},
    ]
    for _ in range(60):
        response = client.chat.completions.create(model="gpt-4o", messages=messages, tools=tools)
        message = response.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            assert call.type == "function"
            path = json.loads(call.function.arguments)["path"]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": read_file(path)})
    client.close()
    return turns


def test_the_readme_agent_runs_twice_under_its_derived_task_id(
    shared_daemon: DaemonProcess,
) -> None:
    """A second run of the same script finds its old task, starts it over and runs to the end."""
    runs: list[list[Turn]] = []
    for _ in range(2):  # a provider each: the fake model's turns count from its start
        with FakeProvider(limit=4_000, tool_turns=40) as provider:
            runs.append(_readme_run(provider, shared_daemon.endpoint))
            sent = provider.sent(CHAT)
            assert [] == [r.problems for r in sent if r.problems]
            assert [200] * len(sent) == [r.status for r in sent]
    first, second = runs
    assert first[0].task == second[0].task  # the same derived id
    assert any(turn.range_updated for turn in first)
    assert [True] + [False] * (len(second) - 1) == [turn.restarted for turn in second]
    assert not any(turn.restarted for turn in first)
    assert second[0].messages == second[0].sent  # the new history is sent whole
    assert 41 == len(first) == len(second)


def test_a_checkpoint_restore_by_rollback_keeps_the_range_it_sets(client: Client) -> None:
    """rollback with the checkpoint's range, then the shorter history: no restart, range kept."""
    task = "rollback-cline"
    _cut(client, task, "cline", cline(30))
    handle = client.task(task, delta=False)
    handle.rollback(0, deleted_range=[2, 5])
    prepared = handle.prepare_request(cline(8), MODEL)
    assert "restarted" not in prepared
    assert [2, 5] == prepared["deleted_range"]
