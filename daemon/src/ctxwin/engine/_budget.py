"""Token budgets: estimate a view, fit it under a budget, name what is too big.

These are opt-in additions to SPEC.md's strategy: SPEC.md reacts to the
previous request's reported usage and cuts a fixed half or quarter; a caller
that supplies a token counter can also ask what a request would cost before
sending it, cut only as many whole turns as needed, and learn when no cut can
help (one message alone is too big, or the cut changes nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ctxwin.proto import PriceSheet, Strategy

from ._blocks import Message
from ._overlay import Overlay
from ._view import apply_overlay, keep_from, view_spans

Counter = Callable[[Message], int]
"""Tokens of one message (the daemon counts with tiktoken and caches per message)."""

LARGEST_REPORTED = 5
DEFAULT_FIT_TARGET = 0.8


@dataclass(frozen=True, slots=True)
class Budgeting:
    """How to estimate and fit, for the opt-in modes of ``prepare_request`` and ``plan``.

    Attributes:
        count: raw tokens of a message.
        ratio: calibration, real tokens per estimated token (1.0 when unknown).
        strategy: ``default`` cuts SPEC.md's half or quarter; ``fit`` cuts the
            fewest whole turns that bring the estimate under ``target`` of the budget;
            ``auto`` decides on the view about to be sent (docs/STRATEGIES.md).
        proactive: with no previous usage, estimate the view and compact before
            the request when it would not fit.
        target: fraction of ``max_allowed_size`` that ``fit`` aims for, leaving
            room for the next turns so that a fit is not redone every turn.
        fixed: raw tokens sent with every view besides its messages (a native
            dialect's system and developer messages, never cut).
        pricing: the request's price sheet, when it names one (else the task's).
    """

    count: Counter
    ratio: float = 1.0
    strategy: Strategy = "default"
    proactive: bool = False
    target: float = DEFAULT_FIT_TARGET
    fixed: int = 0
    pricing: PriceSheet | None = None

    def tokens(self, message: Message) -> int:
        """Calibrated tokens of one message."""
        return round(self.count(message) * self.ratio)

    def view_tokens(self, view: Sequence[Message]) -> int:
        """Calibrated tokens of a whole view, with what is sent beside it (``fixed``)."""
        return round((sum(self.count(message) for message in view) + self.fixed) * self.ratio)


def largest_messages(
    view: Sequence[Message], origins: Sequence[int], budgeting: Budgeting
) -> list[list[int]]:
    """The biggest messages of a view as ``[history_index, tokens]``, largest first."""
    sized = [
        [origin, budgeting.tokens(message)] for origin, message in zip(origins, view, strict=True)
    ]
    sized.sort(key=lambda item: (-item[1], item[0]))
    return sized[:LARGEST_REPORTED]


def view_origins(
    length: int, deleted_range: Sequence[int] | None, dropped: Sequence[Sequence[int]] = ()
) -> list[int]:
    """The history index of each view position (SPEC.md §4 step 2), with the deleted set
    ``dropped`` left out too."""
    if length < 2:
        return list(range(length))
    if not dropped:
        return [0, 1, *range(keep_from(deleted_range), length)]
    spans = view_spans(length, keep_from(deleted_range), dropped)
    return [0, 1, *(index for low, high, _ in spans for index in range(low, high))]


def fit_range(
    messages: Sequence[Message],
    deleted_range: Sequence[int] | None,
    overlay: Overlay,
    budget: float,
    budgeting: Budgeting,
) -> tuple[list[int] | None, bool]:
    """The smallest growth of the range that brings the view under ``budget``.

    Cuts only at turn boundaries (the range ends on an assistant message and a
    user message follows) and never shrinks the range.

    Returns:
        ``(range, fits)``: the new range (the current one when no cut is
        needed or possible) and whether the estimate fits; when nothing fits,
        the range that keeps only the first pair and the newest turn.
    """
    current = list(deleted_range) if deleted_range else None
    if len(messages) < 2:
        return current, True

    def tokens_at(index: int) -> int:
        entry = overlay.get(index)
        message = messages[index] if entry is None else apply_overlay(messages[index], entry)
        return budgeting.count(message)

    # Raw counts summed, calibrated once: rounding each message would let a view
    # whose calibrated total is over the budget by a fraction pass as fitting.
    ratio = budgeting.ratio
    start = keep_from(deleted_range)
    kept = [tokens_at(index) for index in range(start, len(messages))]
    remaining = budgeting.fixed + tokens_at(0) + tokens_at(1) + sum(kept)
    if remaining * ratio <= budget:
        return current, True
    best: list[int] | None = None
    for end in range(start, len(messages) - 1):
        remaining -= kept[end - start]
        if messages[end].get("role") != "assistant" or messages[end + 1].get("role") != "user":
            continue
        best = [2, end]
        if remaining * ratio <= budget:
            return best, True
    return (best or current), False


@dataclass(slots=True)
class Calibration:
    """A task's ratio of real to estimated tokens, as a bounded moving average.

    Each report of a request's real input tokens, against the estimate made
    for that request's view, moves the ratio ``weight`` of the way toward the
    observed ratio; the ratio stays within ``[low, high]`` so that one odd
    report (a provider counting differently, a cached prefix) cannot wreck it.
    """

    ratio: float = 1.0
    samples: int = 0
    weight: float = 0.3
    low: float = 0.25
    high: float = 4.0

    def update(self, real: int, estimated: int) -> float:
        """Fold in one observation; returns the new ratio (unchanged when unusable)."""
        if real <= 0 or estimated <= 0:
            return self.ratio
        observed = min(max(real / estimated, self.low), self.high)
        if self.samples == 0:
            self.ratio = observed
        else:
            self.ratio += self.weight * (observed - self.ratio)
        self.samples += 1
        return self.ratio
