"""Framework messages to the openai-chat dialect and back: untouched ones stay the same objects."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.usage import RequestUsage

from ctxwin.client.integrations import langchain as lc
from ctxwin.client.integrations import pydantic_ai as pa
from ctxwin.client.integrations._mapping import convert
from ctxwin.client.integrations.openai import usage_from_responses

READING: dict[str, Any] = {
    "role": "assistant",
    "content": "Reading.",
    "tool_calls": [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path":"a.py"}'},
        }
    ],
}
"""The openai-chat form of each framework's answer that reads ``a.py``."""
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "print(1)"}
"""The openai-chat form of that read's result."""
SPLIT = {"tokens_in": 600, "tokens_out": 20, "cache_writes": 100, "cache_reads": 300}
"""ctxwin's usage of 1,000 input tokens (300 read from the cache, 100 written to it), 20 out."""


def _langchain_history() -> list[Any]:
    return [
        HumanMessage(content="Fix the bug", id="h1"),
        AIMessage(
            content="Reading.",
            tool_calls=[{"name": "read_file", "args": {"path": "a.py"}, "id": "c1"}],
            id="a1",
        ),
        ToolMessage(content="print(1)", tool_call_id="c1", id="t1"),
        AIMessage(content="Done.", id="a2"),
    ]


def test_langchain_messages_map_to_chat_completions_messages() -> None:
    """Human, AI with tool calls, tool and system messages take the Chat Completions shapes."""
    history = _langchain_history()
    assert {"role": "user", "content": "Fix the bug"} == lc.to_openai_chat(history[0])
    assert READING == lc.to_openai_chat(history[1])
    assert RESULT == lc.to_openai_chat(history[2])
    assert {"role": "system", "content": "terse"} == lc.to_openai_chat(SystemMessage("terse"))


def test_a_langchain_view_keeps_untouched_messages_and_copies_changed_ones() -> None:
    """Sent dicts come back as the original objects; a changed result is a copy; a filler is new."""
    history = _langchain_history()
    memo: dict[int, Any] = {}
    converted = convert(history, lambda m: [(0, lc.to_openai_chat(m))], memo)
    same = lc.from_openai_chat(list(converted.messages), converted)
    assert all(a is b for a, b in zip(history, same, strict=True))
    notice = {"role": "tool", "tool_call_id": "c1", "content": "[read again later]"}
    filler = {"role": "tool", "tool_call_id": "c9", "content": "missing"}
    sent = converted.messages
    view = lc.from_openai_chat([sent[0], sent[1], notice, filler, sent[3]], converted)
    assert history[0] is view[0]
    assert history[1] is view[1]
    assert isinstance(view[2], ToolMessage)
    assert ("[read again later]", "c1", "t1") == (view[2].content, view[2].tool_call_id, view[2].id)
    assert isinstance(view[3], ToolMessage)
    assert ("missing", "c9") == (view[3].content, view[3].tool_call_id)
    assert history[3] is view[4]
    again = convert(history, lambda m: [(0, lc.to_openai_chat(m))], memo)
    assert all(a is b for a, b in zip(converted.messages, again.messages, strict=True))


def test_langchain_usage_splits_the_cached_part_out() -> None:
    """``usage_metadata`` input counts include cache reads and writes; they are split out."""
    message = AIMessage(
        content="x",
        usage_metadata={
            "input_tokens": 1000,
            "output_tokens": 20,
            "total_tokens": 1020,
            "input_token_details": {"cache_read": 300, "cache_creation": 100},
        },
    )
    assert SPLIT == lc.usage_from_langchain(message)
    assert lc.usage_from_langchain(HumanMessage("x")) is None


def _pydantic_history() -> list[ModelMessage]:
    return [
        ModelRequest(parts=[SystemPromptPart("terse"), UserPromptPart("Fix the bug")]),
        ModelResponse(
            parts=[
                TextPart("Reading."),
                ToolCallPart("read_file", {"path": "a.py"}, tool_call_id="c1"),
            ]
        ),
        ModelRequest(parts=[ToolReturnPart("read_file", "print(1)", tool_call_id="c1")]),
        ModelResponse(parts=[TextPart("Done.")]),
    ]


def test_pydantic_ai_messages_map_part_by_part() -> None:
    """A request gives one message per part; a response one assistant message with its calls."""
    history = _pydantic_history()
    assert [
        (0, {"role": "system", "content": "terse"}),
        (1, {"role": "user", "content": "Fix the bug"}),
    ] == pa.to_openai_chat(history[0])
    assert [(-1, READING)] == pa.to_openai_chat(history[1])
    assert [(0, RESULT)] == pa.to_openai_chat(history[2])


def test_a_pydantic_ai_view_keeps_untouched_messages_and_rebuilds_changed_ones() -> None:
    """Untouched messages are the originals; a changed tool result is a copy with the new text."""
    history = _pydantic_history()
    converted = convert(history, pa.to_openai_chat, {})
    same = pa.from_openai_chat(list(converted.messages), converted)
    assert all(a is b for a, b in zip(history, same, strict=True))
    sent = converted.messages
    notice = {"role": "tool", "tool_call_id": "c1", "content": "[read again later]"}
    view = pa.from_openai_chat([sent[0], sent[1], sent[2], notice, sent[4]], converted)
    assert [history[0], history[1]] == view[:2]
    assert history[0] is view[0]
    changed = view[2]
    assert isinstance(changed, ModelRequest)
    part = changed.parts[0]
    assert isinstance(part, ToolReturnPart)
    assert ("[read again later]", "c1", "read_file") == (
        part.content,
        part.tool_call_id,
        part.tool_name,
    )
    assert history[3] is view[3]
    filler = {"role": "tool", "tool_call_id": "c9", "content": "missing"}
    cut = pa.from_openai_chat([sent[0], sent[1], sent[2], filler], converted)
    assert history[:2] == cut[:2]
    new = cut[2]
    assert isinstance(new, ModelRequest)
    assert [("c9", "missing")] == [
        (p.tool_call_id, p.content) for p in new.parts if isinstance(p, ToolReturnPart)
    ]


def test_usage_from_pydantic_ai_and_responses_split_the_cached_part_out() -> None:
    """Both report input counts with the cache included; ctxwin's usage splits it out."""
    usage = RequestUsage(
        input_tokens=1000, output_tokens=20, cache_read_tokens=300, cache_write_tokens=100
    )
    assert SPLIT == pa.usage_from_pydantic_ai(usage)
    assert pa.usage_from_pydantic_ai(RequestUsage()) is None
    responses = {
        "input_tokens": 1000,
        "output_tokens": 20,
        "input_tokens_details": {"cached_tokens": 300},
    }
    assert {"tokens_in": 700, "tokens_out": 20, "cache_writes": 0, "cache_reads": 300, "ts": 5} == (
        usage_from_responses(responses, ts=5)
    )
