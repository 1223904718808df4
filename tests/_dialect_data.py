"""Generated conversations rendered in every dialect, and the SDK request types to check views."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

Message = dict[str, Any]
PATHS = ["src/app.py", "README.md", "a b/ü.txt"]
words = st.text(alphabet="abc xyz\n😀é", min_size=1, max_size=30)


@dataclass
class Call:
    """One tool call: a read of a path, or another tool."""

    id: str
    name: str
    args: dict[str, Any]


@dataclass
class Turn:
    """One step of a conversation, in no dialect yet.

    ``kind``: ``system`` (text), ``user`` (text), ``assistant`` (reasoning,
    text, calls) or ``results`` (``(call id, text)`` for the calls before;
    some may be missing, an unknown id is an orphan). ``split``: rendered as
    consecutive messages of one role where the dialect allows it. ``note``: a
    text sent with results (after the first one in its message, as agents add
    reminders to a tool result; a user message after them where a result is a
    message of its own).
    """

    kind: str
    text: str = ""
    reasoning: bool = False
    calls: list[Call] = field(default_factory=list)
    results: list[tuple[str, str]] = field(default_factory=list)
    split: bool = False
    as_list: bool = False
    note: str = ""


@st.composite
def conversations(draw: st.DrawFn, systems: bool = True, exact: bool = False) -> list[Turn]:
    """A task, its first reply, then turns with parallel calls, results and odd cases.

    ``exact``: only what translates exactly into the Cline dialect (no system
    messages, no split messages, no missing or orphan results, no reasoning).
    """
    turns = [Turn("user", draw(words), as_list=draw(st.booleans()))]
    if systems and not exact and draw(st.booleans()):
        turns.insert(0, Turn("system", draw(words)))
    serial = 0
    for _ in range(draw(st.integers(1, 14))):
        if systems and not exact and draw(st.integers(0, 5)) == 0:
            turns.append(Turn("system", draw(words)))
        calls: list[Call] = []
        for _ in range(draw(st.integers(0, 3))):
            serial += 1
            if draw(st.booleans()):
                calls.append(
                    Call(f"call_{serial}", "Read", {"file_path": draw(st.sampled_from(PATHS))})
                )
            else:
                calls.append(Call(f"call_{serial}", "Bash", {"command": draw(words)}))
        turns.append(
            Turn(
                "assistant",
                draw(words) if draw(st.booleans()) or not calls else "",
                reasoning=not exact and draw(st.booleans()),
                calls=calls,
                split=not exact and draw(st.booleans()),
            )
        )
        if calls:
            results = [(call.id, draw(words) * draw(st.integers(1, 40))) for call in calls]
            if not exact and draw(st.integers(0, 4)) == 0:
                results.pop(draw(st.integers(0, len(results) - 1)))
            if not exact and draw(st.integers(0, 6)) == 0:
                results.append(("call_orphan", "stray"))
            note = draw(words) if not exact and draw(st.integers(0, 3)) == 0 else ""
            split = not exact and draw(st.booleans())
            turns.append(Turn("results", results=results, split=split, note=note))
        elif not exact and draw(st.integers(0, 5)) == 0:
            # A stray result after a reply without calls (a log that lost the call).
            turns.append(Turn("results", results=[("call_orphan", "stray")]))
        if draw(st.booleans()) or not calls:
            turns.append(Turn("user", draw(words), as_list=draw(st.booleans())))
    return turns


def _arguments(call: Call) -> str:
    return json.dumps(call.args)


def render_chat(turns: list[Turn]) -> list[Message]:
    """OpenAI Chat Completions messages.

    A split turn with several calls is one assistant message per call (as logs
    converted from other agents have it), and when its results are split too,
    the first call's result stands before the last call (so the results of the
    calls before that one come after it).
    """
    out: list[Message] = []
    early: set[str] = set()  # results already put between a split turn's calls
    for number, turn in enumerate(turns):
        if turn.kind == "system":
            out.append({"role": "system", "content": turn.text})
        elif turn.kind == "user":
            content: Any = [{"type": "text", "text": turn.text}] if turn.as_list else turn.text
            out.append({"role": "user", "content": content})
        elif turn.kind == "assistant":
            message: Message = {"role": "assistant", "content": turn.text or None}
            if turn.reasoning:
                message["reasoning_content"] = "thinking about it"
            calls = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": _arguments(c)},
                }
                for c in turn.calls
            ]
            if turn.split and len(calls) > 1:
                if turn.text:
                    out.append(message)
                after = turns[number + 1] if number + 1 < len(turns) else None
                for place, call in enumerate(calls):
                    out.append({"role": "assistant", "content": None, "tool_calls": [call]})
                    if place == len(calls) - 2 and after is not None and after.split:
                        for call_id, text in after.results:
                            if call_id == calls[0]["id"] and after.kind == "results":
                                out.append(
                                    {"role": "tool", "tool_call_id": call_id, "content": text}
                                )
                                early.add(call_id)
            elif turn.split and turn.text and calls:
                out.append(message)
                out.append({"role": "assistant", "content": None, "tool_calls": calls})
            else:
                if calls:
                    message["tool_calls"] = calls
                if message["content"] is None and not calls:
                    message["content"] = "ok"
                out.append(message)
        else:
            for call_id, text in turn.results:
                if call_id not in early:
                    out.append({"role": "tool", "tool_call_id": call_id, "content": text})
            if turn.note:
                out.append({"role": "user", "content": turn.note})
    return out


def render_anthropic(turns: list[Turn]) -> list[Message]:
    """Anthropic Messages (system messages are not messages there: left out)."""
    out: list[Message] = []
    for turn in turns:
        if turn.kind == "user":
            content: Any = [{"type": "text", "text": turn.text}] if turn.as_list else turn.text
            out.append({"role": "user", "content": content})
        elif turn.kind == "assistant":
            blocks: list[Message] = []
            if turn.reasoning:
                blocks.append({"type": "thinking", "thinking": "hmm", "signature": "c2lnbmF0dXJl"})
            if turn.text:
                blocks.append({"type": "text", "text": turn.text, "citations": None})
            uses = [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": c.args}
                for c in turn.calls
            ]
            if turn.split and blocks and uses:
                out.append({"role": "assistant", "content": blocks})
                out.append({"role": "assistant", "content": uses})
            else:
                out.append({"role": "assistant", "content": [*blocks, *uses] or "ok"})
        elif turn.kind == "results":
            results: list[Message] = [
                {"type": "tool_result", "tool_use_id": call_id, "content": text}
                for call_id, text in turn.results
            ]
            note = [{"type": "text", "text": turn.note}] if turn.note else []
            if turn.split:
                contents = [[result] for result in results]
                if contents:
                    contents[0].extend(note)
                out.extend({"role": "user", "content": content} for content in contents)
            elif results:
                out.append({"role": "user", "content": [*results[:1], *note, *results[1:]]})
    return out


def render_responses(turns: list[Turn]) -> list[Message]:
    """OpenAI Responses input items."""
    out: list[Message] = []
    for turn in turns:
        if turn.kind == "system":
            out.append({"role": "developer", "content": turn.text})
        elif turn.kind == "user":
            content: Any = (
                [{"type": "input_text", "text": turn.text}] if turn.as_list else turn.text
            )
            out.append({"type": "message", "role": "user", "content": content})
        elif turn.kind == "assistant":
            if turn.reasoning:
                out.append(
                    {
                        "type": "reasoning",
                        "id": f"rs_{len(out)}",
                        "summary": [{"type": "summary_text", "text": "thinking"}],
                        "encrypted_content": "ZW5jcnlwdGVk",
                    }
                )
            if turn.text or not turn.calls:
                text = turn.text or "ok"
                out.append(
                    {
                        "type": "message",
                        "id": f"msg_{len(out)}",
                        "status": "completed",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": text, "annotations": []}],
                    }
                )
            for call in turn.calls:
                out.append(
                    {
                        "type": "function_call",
                        "call_id": call.id,
                        "name": call.name,
                        "arguments": _arguments(call),
                    }
                )
        else:
            for call_id, text in turn.results:
                out.append({"type": "function_call_output", "call_id": call_id, "output": text})
            if turn.note:
                out.append({"type": "message", "role": "user", "content": turn.note})
    return out


def render_gemini(turns: list[Turn]) -> list[Message]:
    """Gemini contents (system instructions are not contents: left out)."""
    out: list[Message] = []
    for turn in turns:
        if turn.kind == "user":
            out.append({"role": "user", "parts": [{"text": turn.text}]})
        elif turn.kind == "assistant":
            parts: list[Message] = []
            if turn.reasoning:
                parts.append({"text": "thinking", "thought": True})
            if turn.text:
                parts.append({"text": turn.text})
            calls: list[dict[str, Any]] = [
                {"functionCall": {"name": c.name, "args": c.args, "id": c.id}} for c in turn.calls
            ]
            if calls and turn.reasoning:
                calls[0]["thoughtSignature"] = "c2lnbmF0dXJl"
            if turn.split and parts and calls:
                out.append({"role": "model", "parts": parts})
                out.append({"role": "model", "parts": calls})
            else:
                out.append({"role": "model", "parts": [*parts, *calls] or [{"text": "ok"}]})
        elif turn.kind == "results":
            parts = [
                {"functionResponse": {"name": "tool", "id": call_id, "response": {"output": text}}}
                for call_id, text in turn.results
            ]
            note = [{"text": turn.note}] if turn.note else []
            # Not split: every response to a turn's calls must be in the one content after it.
            if parts:
                out.append({"role": "user", "parts": [*parts[:1], *note, *parts[1:]]})
    return out


def render_cline(turns: list[Turn]) -> list[Message]:
    """The Cline dialect (the engine's own form), for conversations made with ``exact``."""
    out: list[Message] = []
    for turn in turns:
        if turn.kind == "user":
            if out and out[-1]["role"] == "user":
                out[-1]["content"].append({"type": "text", "text": turn.text})
            else:
                out.append({"role": "user", "content": [{"type": "text", "text": turn.text}]})
        elif turn.kind == "assistant":
            blocks: list[Message] = [{"type": "text", "text": turn.text}] if turn.text else []
            blocks += [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": c.args}
                for c in turn.calls
            ]
            out.append({"role": "assistant", "content": blocks or [{"type": "text", "text": "ok"}]})
        elif turn.kind == "results":
            results = [
                {
                    "type": "tool_result",
                    "tool_use_id": call_id,
                    "content": [{"type": "text", "text": text}],
                }
                for call_id, text in turn.results
            ]
            out.append({"role": "user", "content": results})
    return out


RENDER = {
    "openai-chat": render_chat,
    "anthropic": render_anthropic,
    "openai-responses": render_responses,
    "gemini": render_gemini,
}


def _force(value: Any) -> Any:
    """Consume pydantic's lazy iterators so that every nested part is validated."""
    if isinstance(value, dict):
        return {key: _force(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_force(item) for item in value]
    if isinstance(value, Iterator):
        return [_force(item) for item in value]
    return value


def sdk_validator(dialect: str) -> Any:
    """A function checking a view against the official SDK's request type of ``dialect``."""
    from pydantic import TypeAdapter

    if dialect == "openai-chat":
        from openai.types.chat import ChatCompletionMessageParam

        chat = TypeAdapter(list[ChatCompletionMessageParam])
        return lambda view: _force(chat.validate_python(view))
    if dialect == "openai-responses":
        from openai.types.responses import ResponseInputParam

        responses = TypeAdapter(ResponseInputParam)
        return lambda view: _force(responses.validate_python(view))
    if dialect == "anthropic":
        from anthropic.types import MessageParam

        anthropic = TypeAdapter(list[MessageParam])
        return lambda view: _force(anthropic.validate_python(view))
    from google.genai import types

    gemini = TypeAdapter(list[types.Content])
    return lambda view: gemini.validate_python(view)
