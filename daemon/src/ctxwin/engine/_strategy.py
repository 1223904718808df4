"""The strategies ``prepare_request`` decides with, and ``plan`` (docs/STRATEGIES.md).

A strategy looks at a task's state and the next request, makes its edits on
the state (the range, the overlay) and returns the view to send with what it
decided. ``default`` is SPEC.md §7 exactly: the last request's reported usage
triggers it, duplicate file reads are replaced and, when that saves too
little, half (or a quarter) of the turns are cut. ``fit`` is the same but
sizes its cut by estimate. ``auto`` (``_auto.py``) decides on the view about to
be sent. :class:`~._state.TaskState` picks one by the request's
``Budgeting.strategy`` (``default`` when the request asked for no estimates).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, Self, cast

from ctxwin.proto import PlanResult, PrepareRequestResult, PriceSheet, Strategy

from ._auto import AutoStrategy, AutoTask
from ._blocks import Message, text_of
from ._budget import Budgeting, fit_range
from ._cuts import CutTask, add_truncation_notice, keep_newest
from ._ledger import CacheLedger, Receipt
from ._optimize import TOOL_HEADER
from ._overlay import EDIT_FILE_CHANGE, EDIT_FILE_MENTION, EDIT_READ_FILE, replaced_paths
from ._range import Keep, next_truncation_range
from ._request import Request, ViewStrategy, prepared
from ._view import keep_from
from ._window import context_window_info, total_tokens

__all__ = [
    "STRATEGIES",
    "FitStrategy",
    "SpecStrategy",
    "plan",
    "prepare",
]


class StrategyTask(AutoTask, CutTask, Protocol):
    """What the strategies and ``plan`` use of a task's state (``TaskState`` has it)."""

    @property
    def deleted_range(self) -> list[int] | None:
        """The inclusive ``[2, end]`` range of messages not sent, or None."""
        ...

    @deleted_range.setter
    def deleted_range(self, value: Sequence[int] | None) -> None: ...

    @property
    def pricing(self) -> PriceSheet | None:
        """The task's price sheet, once a request named one."""
        ...

    @pricing.setter
    def pricing(self, sheet: PriceSheet | None) -> None: ...

    @property
    def ledger(self) -> CacheLedger:
        """The views returned and their cost."""
        ...

    def clone(self) -> Self:
        """An independent copy."""
        ...


MAX_REPORT_SCALE = 4.0
"""The most a report may scale ``fit``'s estimates up (bounded like calibration)."""


def prepare(state: StrategyTask, request: Request) -> PrepareRequestResult:
    """``prepare_request``: the request's strategy decides (:data:`STRATEGIES`); with a
    price sheet known, the view's cache figures are recorded in the task's ledger."""
    budgeting, previous = request.budgeting, request.previous_request
    if previous is not None:
        state.auto.max_out = max(state.auto.max_out, int(previous.get("tokens_out") or 0))
    strategy = STRATEGIES[budgeting.strategy if budgeting is not None else "default"]
    result, receipts = strategy.prepare(state, request)
    sheet = None if budgeting is None else state.sheet_for(request.model, budgeting)
    if budgeting is not None and sheet is not None:
        view = cast("list[Message]", result["messages"])  # the engine's own view
        count, fixed = budgeting.count, budgeting.fixed
        entry = state.ledger.record(view, request.messages, count, sheet, fixed)
        state.ledger.add_receipts(receipts)
        result["cache"] = entry.wire()
    if receipts:
        result["receipts"] = [receipt.wire() for receipt in receipts]
    return result


_Sizes = tuple[float, Budgeting | None]
"""The allowed size and the estimates a cut is sized with."""


class SpecStrategy:
    """``default``: SPEC.md §7, and the opt-in proactive mode.

    The last request's reported total at ``max_allowed_size`` triggers it (with
    no request yet and ``proactive`` budgeting, the next view's estimate); the
    file reads after the range are optimised and, when that is not enough,
    the range moves by :meth:`proposal`.
    """

    def prepare(
        self, state: StrategyTask, request: Request
    ) -> tuple[PrepareRequestResult, Sequence[Receipt]]:
        limit = context_window_info(request.model).max_allowed_size
        trigger = None if request.use_auto_condense else self._trigger(state, request, limit)
        range_updated = stalled = False
        if trigger is not None:
            range_updated, stalled = self._cut(state, request, trigger, limit)
        result = prepared(state, request.messages, range_updated, stalled, limit, request.budgeting)
        return result, ()

    @staticmethod
    def _trigger(state: StrategyTask, request: Request, limit: float) -> tuple[float, int] | None:
        """What crossed the window and when, or None: nothing to do (SPEC.md §7).

        The last request's reported total; with no request yet and proactive
        budgeting, the next view's estimate (stamped ``ts``).
        """
        previous, budgeting = request.previous_request, request.budgeting
        if previous is not None:
            total = total_tokens(previous)
            return (total, previous.get("ts") or 0) if total >= limit else None
        if budgeting is not None and budgeting.proactive:
            estimate = budgeting.view_tokens(state.truncated_messages(request.messages))
            return (estimate, request.ts or 0) if estimate > limit else None
        return None

    def _cut(
        self, state: StrategyTask, request: Request, trigger: tuple[float, int], limit: float
    ) -> tuple[bool, bool]:
        """Optimise, then cut when that is not enough (SPEC.md §7).

        Args:
            state: the task's state.
            request: the next request.
            trigger: the tokens that crossed the window and their ``ts``.
            limit: the model's allowed size.

        Returns:
            ``(range_updated, stalled)``.
        """
        messages = request.messages
        tokens, trigger_ts = trigger
        sizing = self.sizing(state, request, tokens)
        keep: Keep = "quarter" if tokens / 2 > limit else "half"
        result = state.optimize(messages, trigger_ts)
        changed = result.changed
        range_updated = stalled = False
        if result.need_to_truncate:
            changed = add_truncation_notice(state, trigger_ts, messages) or changed
            before = state.deleted_range
            proposed = self.proposal(state, messages, keep, (limit, sizing))
            state.deleted_range = keep_newest(state, messages, before, proposed)
            range_updated = True
            stalled = not result.changed and keep_from(state.deleted_range) == keep_from(before)
        if changed:
            state.mark_changed()
        return range_updated, stalled

    def sizing(self, state: StrategyTask, request: Request, tokens: float) -> Budgeting | None:
        """The estimates the cut is sized with, taken before the file reads change
        (``tokens``: what crossed the window)."""
        return request.budgeting

    def proposal(
        self, state: StrategyTask, messages: Sequence[Message], keep: Keep, cut: _Sizes
    ) -> list[int] | None:
        """The range the cut proposes: SPEC.md §3's ``keep`` from the current one."""
        return next_truncation_range(messages, state.deleted_range, keep)


class FitStrategy(SpecStrategy):
    """``fit``: SPEC.md §7's trigger; the cut removes the fewest whole turns that
    bring the estimate under ``Budgeting.target`` of the allowed size."""

    def sizing(self, state: StrategyTask, request: Request, tokens: float) -> Budgeting | None:
        """Estimates at least as large as the provider's report says.

        A fit triggered by a reported usage must cut enough by the provider's
        count: when the estimate of the view the report was about is lower (a
        provider that counts more, a system prompt the daemon never sees),
        estimates are scaled up to match the report for this cut (bounded like
        calibration).
        """
        budgeting = request.budgeting
        assert budgeting is not None  # fit is asked for through budgeting
        if request.previous_request is None:  # not a provider's report
            return budgeting
        estimated = budgeting.view_tokens(state.truncated_messages(request.messages))
        if not estimated or tokens <= estimated:
            return budgeting
        return replace(budgeting, ratio=budgeting.ratio * min(tokens / estimated, MAX_REPORT_SCALE))

    def proposal(
        self, state: StrategyTask, messages: Sequence[Message], keep: Keep, cut: _Sizes
    ) -> list[int] | None:
        limit, sizing = cut
        assert sizing is not None
        budget = limit * sizing.target
        return fit_range(messages, state.deleted_range, state.overlay, budget, sizing)[0]


STRATEGIES: dict[Strategy, ViewStrategy[StrategyTask]] = {
    "default": SpecStrategy(),
    "fit": FitStrategy(),
    "auto": AutoStrategy(),
}
"""The strategies by name (``Budgeting.strategy``, ``proto.STRATEGY_VALUES``)."""


def plan(
    state: StrategyTask,
    messages: Sequence[Message],
    previous_request: Mapping[str, Any] | None,
    model: Mapping[str, Any],
    budgeting: Budgeting,
    use_auto_condense: bool = False,
    ts: int | None = None,
) -> PlanResult:
    """What ``prepare_request`` would do now, asked of a copy: ``state`` is left
    unchanged but for a ``pricing`` the request names (kept as the task's sheet)."""
    if budgeting.pricing is not None:
        state.pricing = budgeting.pricing
    before = budgeting.view_tokens(state.truncated_messages(messages))
    probe = state.clone()
    outcome = prepare(
        probe, Request(messages, previous_request, model, use_auto_condense, budgeting, ts)
    )
    return {
        "deleted_range": outcome["deleted_range"],
        "range_updated": outcome["range_updated"],
        "file_reads": _new_file_reads(state, probe, messages),
        "tokens_before": before,
        "tokens_after": outcome["estimated_tokens"],  # set whenever budgeting is given
        "budget": context_window_info(model).max_allowed_size,
        "fits": outcome["fits"],
        "stalled": outcome["stalled"],
        "largest": outcome.get("largest"),
        "calibration": budgeting.ratio,
    }


def _new_file_reads(
    state: StrategyTask, probe: StrategyTask, messages: Sequence[Message]
) -> list[dict[str, Any]]:
    """The file reads ``probe`` replaced that ``state`` has not."""
    found: list[dict[str, Any]] = []
    for index, entry in probe.overlay.items():
        if entry.edit_type not in (EDIT_READ_FILE, EDIT_FILE_CHANGE, EDIT_FILE_MENTION):
            continue
        mine = state.overlay.get(index)
        for block, updates in entry.blocks.items():
            known = mine.blocks.get(block, []) if mine is not None else []
            if len(updates) <= len(known):
                continue
            if entry.edit_type == EDIT_FILE_MENTION:
                previous = set(replaced_paths(known[-1])) if known else set()
                paths = [path for path in replaced_paths(updates[-1]) if path not in previous]
            else:
                content = messages[index].get("content")
                header = TOOL_HEADER.match(text_of(content[0]) or "") if content else None
                paths = [header.group(2)] if header else []
            found.append(
                {"index": index, "block": block, "edit_type": entry.edit_type, "paths": paths}
            )
    found.sort(key=lambda item: (item["index"], item["block"]))
    return found
