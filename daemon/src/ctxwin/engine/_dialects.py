"""The dialects by name, and a task's engine calls on its dialect's messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._blocks import Message
from ._dialect import Dialect, DialectError, MappedHistory
from ._dialect_anthropic import ANTHROPIC
from ._dialect_chat import CHAT
from ._dialect_gemini import GEMINI
from ._dialect_responses import RESPONSES

CLINE = "cline"
"""The dialect of SPEC.md: the engine's internal form itself, with Cline's file reads."""

DIALECTS: dict[str, Dialect] = {
    dialect.name: dialect for dialect in (CHAT, ANTHROPIC, RESPONSES, GEMINI)
}
DIALECT_NAMES: tuple[str, ...] = (CLINE, *DIALECTS)
"""Every dialect a task can have, the default first."""


def get_dialect(name: str) -> Dialect | None:
    """The dialect called ``name``; None for ``cline`` (no mapping).

    Raises:
        DialectError: no dialect has that name.
    """
    if name == CLINE:
        return None
    found = DIALECTS.get(name)
    if found is None:
        raise DialectError(f"unknown dialect {name!r}; known: {', '.join(DIALECT_NAMES)}")
    return found


def kept_out_text(message: Any) -> str:
    """The text of a kept-out (system or developer) message, for token counts."""
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    texts: list[str] = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
    return "\n".join(texts)


def map_view(
    history: MappedHistory, view: Sequence[Message], deleted_range: Sequence[int] | None
) -> list[Message]:
    """The dialect form of an engine view of ``history.internal``."""
    return history.view(view, deleted_range)


__all__ = [
    "CLINE",
    "DIALECTS",
    "DIALECT_NAMES",
    "DialectError",
    "get_dialect",
    "kept_out_text",
    "map_view",
]
