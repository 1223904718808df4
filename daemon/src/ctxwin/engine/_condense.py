"""A task's summaries path: ``condense``, when a summary is due, and the guard that
shortens what no summary can fit (docs/SUMMARIES.md, SPEC.md §8).

A summary itself (its stored form, where the view carries it, the basic one
ctxwin writes) is ``_summary.py``'s; here are the operations that store one on
a task and move its range.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Self

from ctxwin.proto import CondenseResult, OptimizeFileReadsResult, SummaryKind

from ._auto import AutoTask, shorten_oversized
from ._blocks import Message, wire_view
from ._budget import Budgeting
from ._cuts import CutTask, add_truncation_notice, keep_newest
from ._ledger import CacheLedger, Receipt
from ._range import Keep, next_truncation_range
from ._summary import Summary, basic_summary
from ._view import keep_from
from ._window import context_window_info, should_compact

__all__ = [
    "AUTO_CONDENSE_FRACTION",
    "condense",
    "condensed",
    "fit_oversized",
    "rollback_summaries",
    "summary_due",
]


class CondenseTask(AutoTask, CutTask, Protocol):
    """What the summaries path uses of a task's state (``TaskState`` has it)."""

    summaries: list[Summary]

    @property
    def deleted_range(self) -> list[int] | None:
        """The inclusive ``[2, end]`` range of messages not sent, or None."""
        ...

    @deleted_range.setter
    def deleted_range(self, value: Sequence[int] | None) -> None: ...

    @property
    def ledger(self) -> CacheLedger:
        """The views returned and their cost."""
        ...

    def optimize_file_reads(self, messages: Sequence[Message], ts: int) -> OptimizeFileReadsResult:
        """Replace superseded file reads after the range and ask for a write."""
        ...

    def clone(self) -> Self:
        """An independent copy."""
        ...


AUTO_CONDENSE_FRACTION = 0.75
"""The fraction of the window at which a summary is due (SPEC.md §8)."""
CONDENSE_GAP = 6
"""Messages (three turns) that must come between two condenses."""
CONDENSE_KEEPS: tuple[Keep, ...] = ("half", "quarter", "lastTwo", "none")
"""The cuts a condense tries, shallowest first."""
MIN_SUMMARY_BUDGET = 200


def condense(
    state: CondenseTask,
    messages: Sequence[Message],
    model: Mapping[str, Any],
    ts: int,
    budgeting: Budgeting,
    summary: str | None = None,
    threshold: float = AUTO_CONDENSE_FRACTION,
    usage: Mapping[str, Any] | None = None,
) -> CondenseResult:
    """Store a summary for the turns a new range removes, and move the range over them.

    The cut keeps as many recent turns as it can while the view stays at
    most half the auto-condense trigger (SPEC.md §8's fraction of the
    window), going deeper when it must. Without ``summary`` (or when it is
    blank or would not make the view smaller) ctxwin writes a basic one
    (docs/SUMMARIES.md). Nothing changes when the condense is refused: too
    soon after the last one, nothing left to remove, or no summary that
    makes the view smaller. Either way a view over the window has its
    messages too large for it shortened first (:func:`fit_oversized`).

    Args:
        state: the task's state, changed in place.
        messages: the task's full history (the internal form).
        model: the model the view is for (its window sets the trigger).
        ts: the time of the condense (a rollback to before it undoes it).
        budgeting: the token counter the sizes are measured with.
        summary: a model's summary of the conversation, or None.
        threshold: the fraction of the window that triggers a condense.
        usage: what the request that asked the model for ``summary``
            reported: its cost goes into the ledger when a sheet is known,
            whether the summary is stored or not (it was paid for).
    """
    if usage is not None:
        sheet = state.sheet_for(model, budgeting)
        if sheet is not None:
            state.ledger.add_summary(usage, sheet)
    info = context_window_info(model)
    trigger = min(math.floor(info.context_window * threshold), info.max_allowed_size)
    # A message larger than the window is shortened first: no cut removes it.
    fit_oversized(state, messages, model, budgeting, ts)
    before_tokens = budgeting.view_tokens(state.truncated_messages(messages))

    def outcome(
        reason: str | None, stored: Summary | None, fallback: str | None, after: int
    ) -> CondenseResult:
        result: CondenseResult = {
            "condensed": stored is not None,
            "reason": reason,
            "deleted_range": state.deleted_range,
            "summary": None if stored is None else stored.wire(),
            "fallback": fallback,
            "tokens_before": before_tokens,
            "tokens_after": after,
            "trigger": trigger,
            "messages": wire_view(state.truncated_messages(messages)),
        }
        return result

    newest = state.summaries[-1] if state.summaries else None
    if newest is not None and len(messages) - newest.length < CONDENSE_GAP:
        return outcome(
            f"the last condense was {len(messages) - newest.length} messages ago; "
            f"at least {CONDENSE_GAP} must come between two",
            None,
            None,
            before_tokens,
        )
    candidates = _candidates(state, messages)
    if not candidates:
        reason = "no turn is left to remove: the view holds the task and the newest turn only"
        return outcome(reason, None, None, before_tokens)
    fallback: str | None = None
    if summary is not None and not summary.strip():
        fallback, summary = "the model's summary was empty", None
    attempt = _Attempt(state, messages, candidates, ts, budgeting, trigger / 2)
    found = attempt.best(summary) if summary is not None else None
    if found is not None and found[1] >= before_tokens:
        fallback, found = "the model's summary would not make the view smaller", None
    if found is None:
        found = attempt.best(None)
        if found[1] >= before_tokens:
            return outcome("no summary makes the view smaller", None, None, before_tokens)
    stored, after_tokens = found
    add_truncation_notice(state, ts, messages)
    state.summaries.append(stored)
    state.deleted_range = [2, stored.end]  # always further on: the change to write
    return outcome(None, stored, fallback, after_tokens)


def _candidates(state: CondenseTask, messages: Sequence[Message]) -> list[list[int]]:
    """The ranges a condense may take, one per cut of :data:`CONDENSE_KEEPS` that
    removes more than the current range, shallowest first."""
    current = state.deleted_range
    candidates: list[list[int]] = []
    for keep in CONDENSE_KEEPS:
        proposed = keep_newest(
            state, messages, current, next_truncation_range(messages, current, keep)
        )
        if proposed is None or proposed[1] < proposed[0]:
            continue
        if keep_from(proposed) <= keep_from(current) or proposed in candidates:
            continue
        candidates.append(proposed)
    return candidates


@dataclass
class _Attempt:
    """The candidate ranges tried with a summary, on a copy of the task."""

    state: CondenseTask
    messages: Sequence[Message]
    candidates: list[list[int]]
    ts: int
    budgeting: Budgeting
    target: float

    def __post_init__(self) -> None:
        self.previous = self.state.summary
        self.current = self.state.deleted_range
        self.probe = self.state.clone()
        add_truncation_notice(self.probe, self.ts, self.messages)

    def count(self, text: str) -> int:
        return self.budgeting.tokens({"role": "user", "content": [{"type": "text", "text": text}]})

    def best(self, given: str | None) -> tuple[Summary, int]:
        """The shallowest candidate whose view, with the summary, is at most the target
        (else the deepest), with the view's tokens; ``given`` None writes the basic one."""
        chosen: tuple[Summary, int] | None = None
        messages = self.messages
        for proposed in self.candidates:
            text = given
            if text is None:
                budget = max(int(self.target // 4), MIN_SUMMARY_BUDGET)
                text = basic_summary(
                    messages, proposed[1], budget, self.count, self.previous, self.state.reads
                )
            kind: SummaryKind = "basic" if given is None else "model"
            stored = Summary(self.ts, text, proposed[1], self.current, kind, len(messages))
            self.probe.deleted_range = proposed
            self.probe.summaries = [*self.state.summaries, stored]
            chosen = (stored, self.budgeting.view_tokens(self.probe.truncated_messages(messages)))
            if chosen[1] <= self.target:
                break
        assert chosen is not None
        return chosen


def fit_oversized(
    state: CondenseTask,
    messages: Sequence[Message],
    model: Mapping[str, Any],
    budgeting: Budgeting,
    ts: int,
) -> tuple[Receipt, ...]:
    """The summaries path's guard against a message larger than the window.

    A cut and a summary both keep the newest turn whole, so a view over
    ``auto``'s budget (the window less room for the response) has its
    messages too large for it shortened as ``auto`` shortens them, with the
    same notice (stamped ``ts``, rolled back like any edit); a view that
    fits is left as it is.
    """
    before = state.overlay.version
    receipts = shorten_oversized(
        state,
        messages,
        budgeting,
        state.auto.budget(model),
        state.sheet_for(model, budgeting),
        ts,
        state.auto.policy,
    )
    if state.overlay.version != before:
        state.mark_changed()
    return tuple(receipts)


def summary_due(
    state: CondenseTask,
    messages: Sequence[Message],
    previous_request: Mapping[str, Any] | None,
    model: Mapping[str, Any],
    threshold: float = AUTO_CONDENSE_FRACTION,
) -> bool:
    """Whether the auto-condense rule holds after the duplicate-read step (SPEC.md §8).

    When the last request crossed the trigger, the file reads after the
    range are optimised first (persisted); a summary is due only when that
    still calls for a cut.
    """
    decision = should_compact(previous_request, model, threshold, state.deleted_range, messages)
    if not decision.compact:
        return False
    assert previous_request is not None  # should_compact is false without one
    result = state.optimize_file_reads(messages, previous_request.get("ts") or 0)
    return result["need_to_truncate"]


def condensed(state: CondenseTask, messages: Sequence[Message]) -> list[int] | None:
    """After auto-condense, also hide the summary request and its turn (SPEC.md §8)."""
    current = state.deleted_range
    if current is not None and current[1] + 2 <= len(messages) - 1:
        state.deleted_range = [current[0], current[1] + 2]
    return state.deleted_range


def rollback_summaries(state: CondenseTask, ts: int) -> int:
    """Remove the summaries stored after ``ts`` and put back the range the first of them
    replaced (a rollback, SPEC.md §9, docs/SUMMARIES.md); returns how many were removed."""
    keep = len(state.summaries)
    while keep and state.summaries[keep - 1].ts > ts:
        keep -= 1
    removed = len(state.summaries) - keep
    if removed:
        state.deleted_range = state.summaries[keep].before
        del state.summaries[keep:]
    return removed
