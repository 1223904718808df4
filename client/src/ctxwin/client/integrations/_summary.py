"""The adapters' summary path: when ``prepare_request`` says a summary is due.

The window asks the model for a summary of the view (the summary request is
the view with the instruction appended, sent with the caller's own client),
stores it with ``condense`` (a failing or useless one falls back to ctxwin's
basic summary) and notes what was stored in the request's :class:`Turn`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ctxwin.proto import Usage

from ._conversations import Request

__all__ = [
    "SUMMARY_MODES",
    "AsyncSummarize",
    "Summarize",
    "note_condensed",
    "summary_failed",
    "summary_request",
]

log = logging.getLogger("ctxwin.integrations")


SUMMARY_MODES = ("model", "basic")
"""How an adapter summarises when a summary is due: ask the model, or ctxwin's basic summary."""

AsyncSummarize = Callable[[list[Any], str], Awaitable[tuple[str | None, Usage | None]]]
"""The asyncio twin of :data:`Summarize`."""

Summarize = Callable[[list[Any], str], tuple[str | None, Usage | None]]
"""Sends a summary request (its messages, the model id) with the caller's own client;
returns the answer's text and usage."""


def summary_request(dialect: str | None, view: Sequence[Any], prompt: str) -> list[Any]:
    """The view with the summary instruction at its end, as one more user message.

    The view's messages stay as they are, so the request shares its prefix
    with the one before it (the provider's prompt cache covers it). Where a
    dialect wants one user turn at a time (Anthropic, Gemini) and the view
    ends with one, the instruction is a text part added at the end of it.
    """
    out = list(view)
    last = out[-1] if out else None
    if dialect == "anthropic":
        if isinstance(last, Mapping) and last.get("role") == "user":
            content = last.get("content")
            blocks = (
                [{"type": "text", "text": content}]
                if isinstance(content, str)
                else list(content or [])
            )
            out[-1] = {**last, "content": [*blocks, {"type": "text", "text": prompt}]}
            return out
        return [*out, {"role": "user", "content": prompt}]
    if dialect == "gemini":
        if isinstance(last, Mapping) and last.get("role") == "user":
            out[-1] = {**last, "parts": [*last.get("parts", []), {"text": prompt}]}
            return out
        return [*out, {"role": "user", "parts": [{"text": prompt}]}]
    if dialect == "openai-responses":
        return [*out, {"type": "message", "role": "user", "content": prompt}]
    return [*out, {"role": "user", "content": prompt}]


def summary_failed(exc: Exception) -> str:
    """Log a failed summary request; what the turn notes as the reason for the fallback."""
    log.warning("ctxwin summary request failed", exc_info=True)
    return f"the summary request failed: {type(exc).__name__}"


def note_condensed(
    request: Request, result: Mapping[str, Any], usage: Usage | None, failure: str | None
) -> None:
    """Take the view after a ``condense`` and note what it stored in the turn."""
    if usage is not None:
        usage["ts"] = request.ts
    stored = result.get("summary")
    if result.get("condensed") and stored is not None:
        summary: dict[str, Any] = {
            "kind": stored["kind"],
            "range": stored["range"],
            "chars": stored["chars"],
            "fallback": failure or result.get("fallback"),
        }
        request.took(
            result["messages"], result["deleted_range"], summary=summary, summary_usage=usage
        )
        return
    request.turn = replace(
        request.turn,
        summary={"reason": result.get("reason"), "fallback": failure},
        summary_usage=usage,
    )
