"""Agents' logs replayed request by request: no real result lost, no orphan sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ctxwin import engine
from ctxwin.client.cli._corpus import load_conversation
from ctxwin.client.cli._dialects import request_points
from ctxwin.engine._mapped import MappedHistory
from ctxwin.engine._reads import DEFAULT_READ_RULES
from tests._rules import CHECKS
from tests._shapes import LOGS, conversation_file

MISSING = engine.DEFAULT_NOTICES.missing_result


def _results(message: Any) -> dict[str, str]:
    """Call id -> result text (as JSON) of the results a Chat or Anthropic message holds."""
    if message.get("role") == "tool":
        return {message["tool_call_id"]: json.dumps(message.get("content"))}
    content = message.get("content")
    if message.get("role") != "user" or not isinstance(content, list):
        return {}
    return {
        block["tool_use_id"]: json.dumps(block.get("content"))
        for block in content
        if block.get("type") == "tool_result"
    }


@pytest.mark.parametrize("name", LOGS)
@pytest.mark.parametrize("cut_every", [0, 15])
def test_every_request_of_a_logged_conversation_keeps_its_real_results(
    name: str, cut_every: int, tmp_path: Path
) -> None:
    """Each view is valid for the provider (results right after their calls, none stray), every
    call it sends whose result the history holds outside the range gets that result, and the
    newest message is sent unless it is a result of no call (a log's result before its call)."""
    history, dialect = load_conversation(conversation_file(name, tmp_path))
    spec = engine.get_dialect(dialect)
    state = engine.TaskState(reads=DEFAULT_READ_RULES, dialect=spec)
    mapped = MappedHistory(spec)
    state.cache = mapped.cache
    for number, end in enumerate(request_points(history, dialect)):
        messages = history[:end]
        mapped.sync(messages)
        if cut_every and number % cut_every == cut_every - 1:
            engine.compact(state, mapped.internal, "half", number)
        view = mapped.view(state.truncated_messages(mapped.internal), state.deleted_range)
        CHECKS[dialect](view)
        start = engine.keep_from(state.deleted_range)
        real: dict[str, int] = {}
        for internal, members in enumerate(mapped.members):
            if internal < 2 or internal >= start:
                for member in members:
                    for call in _results(messages[member]):
                        real.setdefault(call, member)
        for message in view:
            for call, text in _results(message).items():
                if MISSING in text:
                    assert call not in real, f"request {number}: {call} lost ({real[call]})"
        newest = messages[-1]
        calls = {call for message in messages[:-1] for call in _calls(message)}
        sent = {call: text for message in view for call, text in _results(message).items()}
        if _results(newest) and set(_results(newest)) <= calls:
            # Sent as given or rebuilt (a filled-in result put first): its results are.
            for call, text in _results(newest).items():
                assert text == sent.get(call), f"request {number}: the newest message's {call}"
        elif not _results(newest):
            # Sent last, as given or rebuilt (the missing results of the call before put first).
            content = newest["content"]
            texts = [content] if isinstance(content, str) else [b.get("text", "") for b in content]
            last = json.dumps(view[-1])
            assert all(json.dumps(text)[1:-1] in last for text in texts), f"request {number}"


def _calls(message: Any) -> set[str]:
    if message.get("role") != "assistant":
        return set()
    found = {call["id"] for call in message.get("tool_calls") or []}
    content = message.get("content")
    if isinstance(content, list):
        found |= {block["id"] for block in content if block.get("type") == "tool_use"}
    return found


def test_a_result_in_the_first_message_is_dropped_as_an_orphan() -> None:
    """Anthropic: a tool_result in the first user message answers no call and is not sent."""
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "lost", "content": "stray"},
                {"type": "text", "text": "Fix the parser."},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Reading."}]},
        {"role": "user", "content": [{"type": "text", "text": "Go on."}]},
    ]
    state = engine.TaskState(reads=DEFAULT_READ_RULES, dialect=engine.DIALECTS["anthropic"])
    mapped = MappedHistory(state.dialect, messages)
    state.cache = mapped.cache
    view = mapped.view(state.truncated_messages(mapped.internal), state.deleted_range)
    CHECKS["anthropic"](view)
    assert [{"type": "text", "text": "Fix the parser."}] == view[0]["content"]
    assert messages[1:] == view[1:]
