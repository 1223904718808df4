"""The client's dialect facts: which dialect a message list is in, which messages are the
user's side of a turn, and which strings of a message are content a person reads.

Everything else the tools know of a dialect comes from the daemon (``count_tokens``,
the view and its origins); docs/DIALECTS.md describes the dialects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ctxwin.proto import CLINE

__all__ = [
    "HIDDEN_KEYS",
    "ID_KEYS",
    "PLAIN_KEYS",
    "chars_of",
    "describe",
    "detect_dialect",
    "leaves",
    "message_chars",
    "no_request",
    "request_points",
    "user_side",
]

ID_KEYS = frozenset({"id", "tool_use_id", "tool_call_id", "call_id"})
"""Keys whose string values name a call, a result's call, or an item (kept by a rebuild)."""
PLAIN_KEYS = ID_KEYS | {"role", "type", "name", "status"}
"""Keys whose string values say nothing of what a message holds (left out of its texts)."""
HIDDEN_KEYS = ID_KEYS | {"role", "status", "signature", "thoughtSignature", "encrypted_content"}
"""Keys whose string values are not content a person reads (left out of its characters)."""


def detect_dialect(messages: Sequence[Any], hint: str = "") -> str:
    """The dialect a message list is in, from its shape (``hint``: the key it was under)."""
    if hint == "contents":
        return "gemini"
    if hint == "input":
        return "openai-responses"
    kinds: set[str] = set()
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        if "parts" in message:
            return "gemini"
        kind = message.get("type")
        if isinstance(kind, str) and kind != "message":
            return "openai-responses"
        if message.get("role") in ("tool", "system", "developer") or "tool_calls" in message:
            return "openai-chat"
        content = message.get("content")
        if isinstance(content, list):
            kinds.update(str(block.get("type")) for block in content if isinstance(block, Mapping))
    if kinds & {"input_text", "output_text"}:
        return "openai-responses"
    if hint == "messages":
        return "anthropic"  # an object with Anthropic-shaped messages, not Cline's file
    return CLINE


def user_side(message: Mapping[str, Any], dialect: str) -> bool:
    """Whether ``message`` is the user's side of a turn (a model request may follow it)."""
    role = message.get("role")
    if dialect == "openai-chat":
        return role in ("user", "tool")
    if dialect == "openai-responses":
        kind = message.get("type")
        return role == "user" or (isinstance(kind, str) and kind.endswith("_output"))
    return role == "user"


def request_points(history: Sequence[Mapping[str, Any]], dialect: str = CLINE) -> list[int]:
    """Where the agent calls the model (exclusive end indices).

    After every user message; in another dialect, after the last message of
    each run of the user's side (a user message, tool results).
    """
    if dialect == CLINE:
        return [i for i in range(1, len(history) + 1) if history[i - 1].get("role") == "user"]
    return [
        i
        for i in range(1, len(history) + 1)
        if user_side(history[i - 1], dialect)
        and (i == len(history) or not user_side(history[i], dialect))
    ]


def no_request(dialect: str) -> str:
    """Why a history without a model request cannot be replayed."""
    return (
        f"no model request in it: no message of the {dialect} dialect's user side "
        "(a user message, tool results)"
    )


def chars_of(value: Any) -> int:
    """Characters of every string inside a message's content (keys excluded; the values
    of ``type`` left out). Walked with a stack: any depth the file's JSON had."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, Mapping):
            stack.extend(inner for key, inner in item.items() if key != "type")
        elif isinstance(item, list):
            stack.extend(item)
    return total


def message_chars(message: Mapping[str, Any], dialect: str = CLINE) -> int:
    """Characters of a message's content: every string of it in a dialect other than ``cline``
    (texts, calls, results, parts), roles, ids and signatures left out."""
    if dialect == CLINE:
        return chars_of(message.get("content"))
    return sum(chars_of(value) for key, value in message.items() if key not in HIDDEN_KEYS)


def leaves(value: Any, ids: set[str], texts: set[str], key: str = "") -> None:
    """Collect the ids (:data:`ID_KEYS`) and the other content strings inside ``value``
    (walked with a stack: any depth)."""
    stack: list[tuple[Any, str]] = [(value, key)]
    while stack:
        item, name = stack.pop()
        if isinstance(item, str):
            if name in ID_KEYS:
                ids.add(item)
            elif name not in PLAIN_KEYS and item:
                texts.add(item)
        elif isinstance(item, Mapping):
            stack.extend((inner, str(field)) for field, inner in item.items())
        elif isinstance(item, list):
            stack.extend((inner, name) for inner in item)


def describe(message: Mapping[str, Any], dialect: str = CLINE) -> str:
    """What a message is, for people: its role (or item type) and the kinds of its content
    (a Cline result sent back as text named as such, with its head)."""
    role = str(message.get("role") or message.get("type") or "message")
    content = message.get("parts" if dialect == "gemini" else "content")
    if isinstance(content, str) or content is None:
        kinds = ["text"] if isinstance(content, str) else []
        head = content or ""
    else:
        kinds, head = [], ""
        for block in content if isinstance(content, list) else []:
            kind = (
                str(block.get("type") or next(iter(block), "part"))
                if isinstance(block, Mapping)
                else "part"
            )
            text = block.get("text") if isinstance(block, Mapping) else None
            if isinstance(text, str) and text.startswith("[") and "] Result:" in text[:300]:
                kind, head = "tool result as text", head or text[: text.index("] Result:") + 1]
            if kind not in kinds:
                kinds.append(kind)
    described = f"{role} message" + (f": {', '.join(kinds)}" if kinds else "")
    return described + (f" ({head})" if head and len(head) <= 120 else "")
