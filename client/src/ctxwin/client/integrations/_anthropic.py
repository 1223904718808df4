"""What both Anthropic adapters (``_async_anthropic.py`` and its generated twin) share.

Conversation heads, usage from a message or its stream's events, cache breakpoints, and the
arguments of a summary request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ctxwin.proto import Usage

from .._usage import usage_from_anthropic
from ._cache_hints import Breakpoints
from ._conversations import Request, Turn
from ._window import AsyncWindow, Window, answered

__all__ = [
    "DIALECT",
    "Hints",
    "answer",
    "conversation_head",
    "finish",
    "snapshot_usage",
    "summary_answer",
    "summary_kwargs",
]

DIALECT = "anthropic"
USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)


def conversation_head(system: Any, messages: Sequence[Any]) -> list[Any]:
    """The system prompt and the first message: what names a conversation."""
    return [system if isinstance(system, str | list) else None, *messages[:1]]


def _merge_usage(total: dict[str, int], usage: Any) -> None:
    """Fold an event's usage into ``total`` (a later count of a field replaces the earlier)."""
    for name in USAGE_FIELDS:
        value = usage.get(name) if isinstance(usage, Mapping) else getattr(usage, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            total[name] = value


def _event_usage(seen: dict[str, Any]) -> Callable[[Any], bool]:
    """Watch raw stream events: ``message_start`` carries the input counts, ``message_delta``
    the output count so far (and, on newer API versions, the input counts again)."""
    total: dict[str, int] = seen.setdefault("usage", {})

    def see(event: Any) -> bool:
        kind = getattr(event, "type", None)
        if kind == "message_start":
            _merge_usage(total, getattr(getattr(event, "message", None), "usage", None))
        elif kind == "message_delta":
            _merge_usage(total, getattr(event, "usage", None))
        return True

    return see


def _usage(usage: Any) -> Usage | None:
    return usage_from_anthropic(usage) if usage else None


def finish(window: Window | AsyncWindow, request: Request, usage: Any) -> Turn:
    """Finish ``request`` with the SDK's usage (an object, a map, or None)."""
    return window.finish(request, _usage(usage))


def answer(window: Window | AsyncWindow, request: Request, result: Any, streaming: bool) -> Any:
    """What ``messages.create`` returns: the message, or its stream watched for usage."""
    return answered(window, request, result, streaming=streaming, watch=_event_usage, usage=_usage)


def snapshot_usage(stream: Any) -> Any:
    """The usage a ``MessageStream`` has accumulated, or None before its first event."""
    try:
        return stream.current_message_snapshot.usage
    except (AssertionError, AttributeError, RuntimeError):
        return None


_NOT_FOR_SUMMARY = ("messages", "model", "stream", "tool_choice")


def summary_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The caller's arguments for a summary request: the same system and tools (the
    cached prefix), no tool to be called, no stream."""
    extra = {key: value for key, value in kwargs.items() if key not in _NOT_FOR_SUMMARY}
    if extra.get("tools"):
        extra["tool_choice"] = {"type": "none"}
    return extra


def summary_answer(message: Any) -> tuple[str | None, Usage | None]:
    """The text and usage of the model's answer to a summary request."""
    texts = [
        getattr(block, "text", "")
        for block in getattr(message, "content", None) or []
        if getattr(block, "type", None) == "text"
    ]
    return "".join(texts), _usage(getattr(message, "usage", None))


class Hints:
    """Each conversation's breakpoints (docs/PRICING.md, "What the adapters send")."""

    def __init__(self) -> None:
        self._tasks: dict[str, Breakpoints] = {}

    def request(
        self, request: Request, kwargs: Mapping[str, Any], view: list[Any]
    ) -> tuple[dict[str, Any], Callable[[], None]]:
        """The call's arguments with the view and its breakpoints, and what to call once the
        API took the request (its prefixes are cached from then on)."""
        points = self._tasks.setdefault(request.task, Breakpoints())
        marked, written = points.place(view, kwargs.get("system"), kwargs.get("tools"))
        return {**kwargs, "messages": marked}, lambda: points.sent(written)
