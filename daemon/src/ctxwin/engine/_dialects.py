"""The dialects by name."""

from __future__ import annotations

from typing import Any

from ctxwin.proto import CLINE

from ._dialect import CLINE_DIALECT, Dialect, DialectError
from ._dialect_anthropic import ANTHROPIC
from ._dialect_chat import CHAT
from ._dialect_gemini import GEMINI
from ._dialect_responses import RESPONSES
from ._parts import MEDIA_TYPES, held_text

DIALECTS: dict[str, Dialect] = {
    dialect.name: dialect for dialect in (CHAT, ANTHROPIC, RESPONSES, GEMINI)
}
"""The native dialects by name (their histories are mapped into the internal form)."""
DIALECT_NAMES: tuple[str, ...] = (CLINE, *DIALECTS)
"""Every dialect a task can have, the default first."""
_BY_NAME: dict[str, Dialect] = {CLINE: CLINE_DIALECT, **DIALECTS}


def get_dialect(name: str) -> Dialect:
    """The dialect called ``name`` (:data:`CLINE_DIALECT` for ``cline``, SPEC.md's).

    Raises:
        DialectError: no dialect has that name.
    """
    found = _BY_NAME.get(name)
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
            elif isinstance(part, dict) and part.get("type") not in MEDIA_TYPES:
                texts.append(held_text(part))  # never nothing (docs/DIALECTS.md, Tokens)
    return "\n".join(text for text in texts if text)


__all__ = [
    "CLINE",
    "DIALECTS",
    "DIALECT_NAMES",
    "DialectError",
    "get_dialect",
    "kept_out_text",
]
