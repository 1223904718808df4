"""Context window sizes and the compaction threshold (SPEC.md §2)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxwin.proto import WireRecord

DEFAULT_CONTEXT_WINDOW = 128_000
_KNOWN_LIMITS = {64_000: 37_000, 128_000: 98_000, 200_000: 160_000}
USAGE_FIELDS = ("tokens_in", "tokens_out", "cache_writes", "cache_reads")


def _number(value: float) -> int | float:
    """A whole number as int, a fraction as float (the wire keeps them apart)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


@dataclass(frozen=True, slots=True)
class WindowInfo(WireRecord):
    """A model's context window and the most of it a request may use."""

    context_window: int | float
    max_allowed_size: int | float


@dataclass(frozen=True, slots=True)
class CompactDecision(WireRecord):
    """Whether to compact now, with the numbers behind the answer."""

    compact: bool
    total_tokens: int
    threshold_tokens: int | float


def context_window_info(model: Mapping[str, Any]) -> WindowInfo:
    """The context window of ``model`` and its largest allowed request (SPEC.md §2).

    Args:
        model: ``{id, context_window, provider?}``; a missing, nil or zero
            window means 128000.

    Returns:
        The window and ``max_allowed_size`` (an int when whole, else a float).
    """
    window: int | float = model.get("context_window") or DEFAULT_CONTEXT_WINDOW
    model_id = model.get("id")
    if (
        model.get("provider") == "openai"
        and isinstance(model_id, str)
        and "deepseek" in model_id.lower()
    ):
        window = DEFAULT_CONTEXT_WINDOW
    window = _number(window)
    known = _KNOWN_LIMITS.get(window) if isinstance(window, int) else None
    if known is not None:
        return WindowInfo(window, known)
    return WindowInfo(window, _number(max(window - 40_000, 0.8 * window)))


def total_tokens(usage: Mapping[str, Any] | None) -> int:
    """Tokens in + out + cache writes + cache reads; missing fields count 0 (SPEC.md §2)."""
    if not usage:
        return 0
    return sum(usage.get(field) or 0 for field in USAGE_FIELDS)


def should_compact(
    usage: Mapping[str, Any] | None,
    model: Mapping[str, Any],
    threshold: float | None = None,
    deleted_range: Sequence[int] | None = None,
    messages: Sequence[Mapping[str, Any]] | None = None,
) -> CompactDecision:
    """Whether the last request came close enough to the window to compact (SPEC.md §2, §8).

    Args:
        usage: the previous request's usage, or None (never compact).
        model: the model the next request goes to.
        threshold: fraction of the window; nil or 0 means ``max_allowed_size``.
        deleted_range: the task's range, for the auto-condense rule.
        messages: the task's history, for the auto-condense rule: with a range,
            2 or fewer messages after it never compact.

    Returns:
        The decision with the total and the threshold it was compared to.
    """
    info = context_window_info(model)
    limit = info.max_allowed_size
    threshold_tokens: int | float = limit
    if threshold:
        threshold_tokens = min(math.floor(info.context_window * threshold), limit)
    total = total_tokens(usage)
    compact = usage is not None and total >= threshold_tokens
    if compact and deleted_range is not None and messages is not None:
        compact = len(messages) - (deleted_range[1] + 1) > 2
    return CompactDecision(compact, total, threshold_tokens)
