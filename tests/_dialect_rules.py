"""The provider rules every view of a dialect must satisfy (docs/DIALECTS.md), as checks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Message = dict[str, Any]


KEPT_OUT = ("system", "developer")


def _fail(where: str, what: str) -> None:
    raise AssertionError(f"{where}: {what}")


def check_chat(view: Sequence[Message]) -> None:
    """OpenAI Chat: every assistant message's calls answered by the tool messages right after
    it (the API refuses calls followed by another message first, another assistant message
    with calls included), and no stray result."""
    open_ids: set[str] = set()
    between = ""
    for index, message in enumerate(view):
        role = message.get("role")
        where = f"messages[{index}]"
        if role == "tool":
            if between:
                _fail(between, "a kept-out message stands between calls and their results")
            call = message.get("tool_call_id")
            if call not in open_ids:
                _fail(where, f"a tool result for {call!r} does not answer the message before")
            open_ids.discard(call)
            continue
        if open_ids and role in ("system", "developer"):
            between = where  # fine only if nothing but kept-out messages follows
            continue
        calls = message.get("tool_calls") or [] if role == "assistant" else []
        if open_ids:
            _fail(between or where, f"calls {sorted(open_ids)} are not answered before this")
        if role == "assistant":
            if message.get("content") is None and not calls:
                _fail(where, "an assistant message with neither content nor calls")
            open_ids = open_ids | {call["id"] for call in calls}
            between = ""
    # Calls in the newest message are the caller's to answer: the history ends there.


def _merged(view: Sequence[Message], role_key: str, content_key: str) -> list[Message]:
    """Consecutive messages of one role as one (what the provider does with them)."""
    merged: list[Message] = []
    for message in view:
        content: Any = message.get(content_key)
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
        if merged and merged[-1][role_key] == message[role_key]:
            merged[-1][content_key].extend(parts)
        else:
            merged.append({role_key: message[role_key], content_key: parts})
    return merged


def check_anthropic(view: Sequence[Message]) -> None:
    """Anthropic: a turn's results lead the next user turn, one per call; no stray result."""
    merged = _merged(view, "role", "content")
    if merged and merged[0]["role"] != "user":
        _fail("messages[0]", "the first turn must be the user's")
    for index, turn in enumerate(merged):
        for part in turn["content"]:
            if part.get("type") == "text" and part.get("text") == "":
                _fail(f"turn {index}", "an empty text block")
        results = [p for p in turn["content"] if p.get("type") == "tool_result"]
        if turn["role"] == "assistant" and results:
            _fail(f"turn {index}", "a tool result in an assistant turn")
        if turn["role"] == "user":
            before = merged[index - 1] if index else None
            wanted = (
                [p["id"] for p in before["content"] if p.get("type") == "tool_use"]
                if before is not None
                else []
            )
            got = [p["tool_use_id"] for p in results]
            if sorted(got) != sorted(wanted):
                _fail(f"turn {index}", f"results {got} do not answer calls {wanted}")
            lead = turn["content"][: len(results)]
            if any(p.get("type") != "tool_result" for p in lead):
                _fail(f"turn {index}", "results must come first in the user turn")


def check_responses(view: Sequence[Message]) -> None:
    """Responses: every call has one output after it; every output has its call before it."""
    calls: set[str] = set()
    answered: set[str] = set()
    for index, item in enumerate(view):
        kind = item.get("type", "message")
        if kind.endswith("_call_output"):
            if item["call_id"] not in calls or item["call_id"] in answered:
                _fail(f"input[{index}]", f"an output for {item['call_id']!r} without its call")
            answered.add(item["call_id"])
        elif kind.endswith("_call") and "call_id" in item:
            calls.add(item["call_id"])
    unanswered = calls - answered
    trailing = set()
    for item in reversed(view):
        if not (item.get("type", "message").endswith("_call") and "call_id" in item):
            break
        trailing.add(item["call_id"])
    if unanswered - trailing:
        _fail("end", f"calls {sorted(unanswered - trailing)} have no output")


def check_gemini(view: Sequence[Message]) -> None:
    """Gemini: a turn's calls are answered by the very next content, one response each."""
    for index, content in enumerate(view):
        calls = [p for p in content["parts"] if "functionCall" in p or "function_call" in p]
        responses = [
            p for p in content["parts"] if "functionResponse" in p or "function_response" in p
        ]
        if content["role"] == "model" and responses:
            _fail(f"contents[{index}]", "a function response in a model turn")
        if not content["parts"]:
            _fail(f"contents[{index}]", "a content with no parts")
        if calls and index + 1 < len(view):
            after = view[index + 1]
            if after["role"] != "user":
                _fail(f"contents[{index}]", "calls not followed by a user content")
            answers = [
                p for p in after["parts"] if "functionResponse" in p or "function_response" in p
            ]
            if len(answers) != len(calls):
                _fail(f"contents[{index + 1}]", f"{len(answers)} responses for {len(calls)} calls")
        if responses:
            before = view[index - 1] if index else None
            if before is None or before["role"] != "model":
                _fail(f"contents[{index}]", "responses with no model turn before")


CHECKS: dict[str, Callable[[Sequence[Message]], None]] = {
    "openai-chat": check_chat,
    "anthropic": check_anthropic,
    "openai-responses": check_responses,
    "gemini": check_gemini,
}


def check_origins(
    history: Sequence[Message], view: Sequence[Any], origins: Sequence[int | None]
) -> None:
    """A patch's origins name each view message's history message: the caller's own object
    stands for its own index, a message of no history object was rebuilt from a message of
    its kind (the same role, and item type) or added by the view (None)."""
    if len(origins) != len(view):
        _fail("origins", f"{len(origins)} origins for a view of {len(view)} messages")
    own = {id(message): index for index, message in enumerate(history)}
    for position, (message, origin) in enumerate(zip(view, origins, strict=True)):
        where = f"view[{position}]"
        index = own.get(id(message))
        if index is not None and origin != index:
            _fail(where, f"history message {index} itself is given origin {origin}")
        if index is None and origin is not None:
            original = history[origin]
            kind = (original.get("role"), original.get("type"))
            if (message.get("role"), message.get("type")) != kind:
                _fail(where, f"a rebuilt {kind} message is given origin {origin}")
