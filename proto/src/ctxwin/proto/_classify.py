"""Classify a provider's error as "the request exceeded the context window" (SPEC.md §10)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

_WORDING = re.compile(
    r"context[ _-]?(length|window)|maximum context|tokens? exceed|exceeds? .*tokens?"
    r"|too many tokens|input is too long|prompt is too long|input too long|prompt too long",
    re.IGNORECASE,
)
_EXPLICIT_CODE = "context_length_exceeded"
_MAX_DEPTH = 6


def _layers(error: Any) -> Iterator[Mapping[str, Any]]:
    """The error map and its nested ``error`` / ``cause`` / ``response`` maps."""
    stack: list[tuple[Any, int]] = [(error, 0)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, Mapping) or depth > _MAX_DEPTH:
            continue
        yield item
        for key in ("error", "cause", "response", "body", "data"):
            stack.append((item.get(key), depth + 1))


def _status(layer: Mapping[str, Any]) -> int | None:
    for key in ("status", "statusCode", "status_code", "code"):
        value = layer.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.isdigit():
            return int(value)
    return None


def is_context_window_error(error: Mapping[str, Any] | BaseException | str | None) -> bool:
    """Whether a provider error means the request did not fit the context window.

    Args:
        error: the error as a map (``status``/``code``, ``message``, nested
            ``error`` maps as providers send them), an exception (its ``args``
            and message are read), or a bare message.

    Returns:
        True for HTTP 400 with context-window wording, an explicit
        ``context_length_exceeded`` code, an Anthropic ``invalid_request_error``,
        or a Bedrock ``ValidationException`` with such wording.
    """
    if error is None:
        return False
    if isinstance(error, str):
        return error == _EXPLICIT_CODE
    if isinstance(error, BaseException):
        as_map: dict[str, Any] = dict(getattr(error, "__dict__", {}))
        as_map.setdefault("message", str(error))
        error = as_map
    layers = list(_layers(error))
    statuses = {status for layer in layers if (status := _status(layer)) is not None}
    messages = " ".join(
        str(layer.get("message")) for layer in layers if isinstance(layer.get("message"), str)
    )
    names = {
        str(layer.get(key))
        for layer in layers
        for key in ("code", "type", "name", "__type")
        if isinstance(layer.get(key), str)
    }
    worded = _WORDING.search(messages) is not None
    if _EXPLICIT_CODE in names or _EXPLICIT_CODE in messages:
        return True
    if 400 in statuses and worded:
        return True
    if "invalid_request_error" in names:
        return True
    return any("ValidationException" in name for name in names) and worded
