"""Frameworks' message objects to a wire dialect and back, keeping untouched objects as they are.

A framework adapter turns its history into dialect messages (each remembers
which source object it came from), asks ctxwin for the view, and maps the
view back: a view message that is the very object it sent stands for its
source unchanged; a changed one (a notice written into it) is matched to its
source by tool-call id or by position and rebuilt from it; one with no
source (the missing-result text filled in for a call) is new.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["Converted", "Origin", "convert", "origins", "text_of"]

S = TypeVar("S")


@dataclass(frozen=True)
class Origin:
    """Where a dialect message came from: the source message's index, and the part within it."""

    message: int
    part: int


@dataclass
class Converted(Generic[S]):
    """A history in dialect form: ``messages`` and, for each, its :class:`Origin`."""

    sources: list[S]
    messages: list[dict[str, Any]]
    origin: list[Origin]


def convert(
    sources: Sequence[S],
    to_dialect: Callable[[S], list[tuple[int, dict[str, Any]]]],
    memo: dict[int, tuple[Any, list[tuple[int, dict[str, Any]]]]],
) -> Converted[S]:
    """Map every source message with ``to_dialect`` (``[(part, message), ...]``).

    ``memo`` keeps each source object's dialect messages from the call before,
    so the same object yields the very same dicts (delta sync then sees them
    unchanged, and nothing is converted twice). It is replaced by this call's.
    """
    messages: list[dict[str, Any]] = []
    origin: list[Origin] = []
    seen: dict[int, tuple[Any, list[tuple[int, dict[str, Any]]]]] = {}
    for index, source in enumerate(sources):
        known = memo.get(id(source))
        converted = known[1] if known is not None and known[0] is source else to_dialect(source)
        seen[id(source)] = (source, converted)
        for part, message in converted:
            messages.append(message)
            origin.append(Origin(index, part))
    memo.clear()
    memo.update(seen)
    return Converted(list(sources), messages, origin)


def _call_id(message: Mapping[str, Any]) -> str | None:
    value = message.get("tool_call_id")
    return value if isinstance(value, str) else None


def origins(view: Sequence[Any], converted: Converted[Any]) -> list[int | None]:
    """For each view message, the index of the sent message it stands for (None: a new one).

    Args:
        view: the view ctxwin answered, in the same dialect.
        converted: what was sent.

    Returns:
        One entry per view message; ``converted.origin[index]`` is its source, and
        the message is unchanged when it is ``converted.messages[index]`` itself.
    """
    sent = converted.messages
    position = {id(message): index for index, message in enumerate(sent)}
    results: dict[str, int] = {}
    callers: dict[str, int] = {}
    for number, message in enumerate(sent):
        result = _call_id(message)
        if result is not None:
            results.setdefault(result, number)
        for call in _calls(message):
            callers.setdefault(call, number)
    found: list[int | None] = []
    previous = -1
    for message in view:
        index: int | None = position.get(id(message))
        if index is None or sent[index] is not message:
            index = None
            if isinstance(message, Mapping):
                index = _match(message, sent, results, callers, previous)
        if index is not None:
            previous = index
        found.append(index)
    return found


def _calls(message: Mapping[str, Any]) -> list[str]:
    """The ids of an assistant message's tool calls."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [
        call["id"]
        for call in calls
        if isinstance(call, Mapping) and isinstance(call.get("id"), str)
    ]


def _match(
    message: Mapping[str, Any],
    sent: Sequence[Any],
    results: Mapping[str, int],
    callers: Mapping[str, int],
    previous: int,
) -> int | None:
    """The sent message a rebuilt view message stands for (None: a new one, e.g. a filler).

    A result by its call id (a result filled in for a call that had none is
    new); an assistant message with calls by its first call's id; else the
    first later sent message equal to it; else the next sent one when it has
    the same role (a notice written into that message).
    """
    result = _call_id(message)
    if result is not None:
        return results.get(result)
    calls = _calls(message)
    if calls:
        return callers.get(calls[0])
    for index in range(previous + 1, len(sent)):
        if sent[index] == message:
            return index
    following = previous + 1
    if following < len(sent) and sent[following].get("role") == message.get("role"):
        return following
    return None


def text_of(content: Any) -> str | None:
    """The text of a dialect message's content: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            str(part["text"])
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        ]
        return "\n".join(texts) if texts else None
    return None
