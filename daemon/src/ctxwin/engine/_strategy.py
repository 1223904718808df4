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
from typing import TYPE_CHECKING, Any, Protocol

from ctxwin.proto import PlanResult, PrepareRequestResult

from ._blocks import Message, text_of, wire_view
from ._budget import Budgeting, fit_range, largest_messages, view_origins
from ._ledger import Receipt
from ._optimize import TOOL_HEADER
from ._overlay import EDIT_FILE_CHANGE, EDIT_FILE_MENTION, EDIT_READ_FILE, replaced_paths
from ._range import Keep, next_truncation_range
from ._view import keep_from
from ._window import context_window_info, total_tokens

if TYPE_CHECKING:
    from ._state import TaskState

__all__ = ["FIT", "SPEC", "FitStrategy", "SpecStrategy", "ViewStrategy", "plan", "prepared"]

MAX_REPORT_SCALE = 4.0
"""The most a report may scale ``fit``'s estimates up (bounded like calibration)."""


class ViewStrategy(Protocol):
    """What decides, before a request, whether and how the view changes."""

    def prepare(
        self,
        state: TaskState,
        messages: Sequence[Message],
        previous_request: Mapping[str, Any] | None,
        model: Mapping[str, Any],
        use_auto_condense: bool,
        budgeting: Budgeting | None,
        ts: int | None,
    ) -> tuple[PrepareRequestResult, Sequence[Receipt]]:
        """Edit ``state`` for the next request; the result and the receipts of the edits.

        Args:
            state: the task's state, changed in place (a change to write bumps
                its revision).
            messages: the task's full history.
            previous_request: the last request's usage ``{ts, tokens_*}``, or None.
            model: the model of the next request.
            use_auto_condense: the agent condenses by summary; never cut here.
            budgeting: the request's estimation settings, None when it asked for none.
            ts: the time stamped on edits made without a previous request.
        """
        ...


def prepared(
    state: TaskState,
    messages: Sequence[Message],
    range_updated: bool,
    stalled: bool,
    limit: float,
    budgeting: Budgeting | None,
) -> PrepareRequestResult:
    """The result with the view of ``state``; with ``budgeting``, the view's estimate
    against ``limit`` and its largest messages when it does not fit."""
    view = state.truncated_messages(messages)
    result: PrepareRequestResult = {
        "deleted_range": state.deleted_range,
        "range_updated": range_updated,
        "messages": wire_view(view),
        "stalled": stalled,
    }
    if budgeting is not None:
        estimated = budgeting.view_tokens(view)
        result["estimated_tokens"] = estimated
        result["fits"] = estimated <= limit
        if estimated > limit:
            origins = view_origins(len(messages), state.deleted_range)
            result["largest"] = largest_messages(view, origins, budgeting)
    return result


class SpecStrategy:
    """``default``: SPEC.md §7, and the opt-in proactive mode.

    The last request's reported total at ``max_allowed_size`` triggers it (with
    no request yet and ``proactive`` budgeting, the next view's estimate); the
    file reads after the range are optimised and, when that is not enough,
    the range moves by :meth:`proposal`.
    """

    def prepare(
        self,
        state: TaskState,
        messages: Sequence[Message],
        previous_request: Mapping[str, Any] | None,
        model: Mapping[str, Any],
        use_auto_condense: bool,
        budgeting: Budgeting | None,
        ts: int | None,
    ) -> tuple[PrepareRequestResult, Sequence[Receipt]]:
        limit = context_window_info(model).max_allowed_size
        trigger = None
        if not use_auto_condense:
            trigger = self._trigger(state, messages, previous_request, limit, budgeting, ts)
        range_updated = stalled = False
        if trigger is not None:
            range_updated, stalled = self._cut(
                state, messages, trigger, limit, budgeting, previous_request is not None
            )
        return prepared(state, messages, range_updated, stalled, limit, budgeting), ()

    @staticmethod
    def _trigger(
        state: TaskState,
        messages: Sequence[Message],
        previous_request: Mapping[str, Any] | None,
        limit: float,
        budgeting: Budgeting | None,
        ts: int | None,
    ) -> tuple[float, int] | None:
        """What crossed the window and when, or None: nothing to do (SPEC.md §7).

        The last request's reported total; with no request yet and proactive
        budgeting, the next view's estimate (stamped ``ts``).
        """
        if previous_request is not None:
            total = total_tokens(previous_request)
            return (total, previous_request.get("ts") or 0) if total >= limit else None
        if budgeting is not None and budgeting.proactive:
            estimate = budgeting.view_tokens(state.truncated_messages(messages))
            return (estimate, ts or 0) if estimate > limit else None
        return None

    def _cut(
        self,
        state: TaskState,
        messages: Sequence[Message],
        trigger: tuple[float, int],
        limit: float,
        budgeting: Budgeting | None,
        reported: bool,
    ) -> tuple[bool, bool]:
        """Optimise, then cut when that is not enough (SPEC.md §7).

        Args:
            state: the task's state.
            messages: the task's full history.
            trigger: the tokens that crossed the window and their ``ts``.
            limit: the model's allowed size.
            budgeting: the request's estimation settings, if any.
            reported: the trigger is a provider's report.

        Returns:
            ``(range_updated, stalled)``.
        """
        tokens, trigger_ts = trigger
        sizing = self.sizing(state, messages, tokens, budgeting, reported)
        keep: Keep = "quarter" if tokens / 2 > limit else "half"
        result = state.optimize(messages, trigger_ts)
        changed = result.changed
        range_updated = stalled = False
        if result.need_to_truncate:
            changed = state.add_truncation_notice(trigger_ts, messages) or changed
            before = state.deleted_range
            proposed = self.proposal(state, messages, keep, limit, sizing)
            state.deleted_range = state.keep_newest(messages, before, proposed)
            range_updated = True
            stalled = not result.changed and keep_from(state.deleted_range) == keep_from(before)
        if changed:
            state.mark_changed()
        return range_updated, stalled

    def sizing(
        self,
        state: TaskState,
        messages: Sequence[Message],
        tokens: float,
        budgeting: Budgeting | None,
        reported: bool,
    ) -> Budgeting | None:
        """The estimates the cut is sized with, taken before the file reads change."""
        return budgeting

    def proposal(
        self,
        state: TaskState,
        messages: Sequence[Message],
        keep: Keep,
        limit: float,
        sizing: Budgeting | None,
    ) -> list[int] | None:
        """The range the cut proposes: SPEC.md §3's ``keep`` from the current one."""
        return next_truncation_range(messages, state.deleted_range, keep)


class FitStrategy(SpecStrategy):
    """``fit``: SPEC.md §7's trigger; the cut removes the fewest whole turns that
    bring the estimate under ``Budgeting.target`` of the allowed size."""

    def sizing(
        self,
        state: TaskState,
        messages: Sequence[Message],
        tokens: float,
        budgeting: Budgeting | None,
        reported: bool,
    ) -> Budgeting | None:
        """Estimates at least as large as the provider's report says.

        A fit triggered by a reported usage must cut enough by the provider's
        count: when the estimate of the view the report was about is lower (a
        provider that counts more, a system prompt the daemon never sees),
        estimates are scaled up to match the report for this cut (bounded like
        calibration).
        """
        assert budgeting is not None  # fit is asked for through budgeting
        if not reported:
            return budgeting
        estimated = budgeting.view_tokens(state.truncated_messages(messages))
        if not estimated or tokens <= estimated:
            return budgeting
        return replace(budgeting, ratio=budgeting.ratio * min(tokens / estimated, MAX_REPORT_SCALE))

    def proposal(
        self,
        state: TaskState,
        messages: Sequence[Message],
        keep: Keep,
        limit: float,
        sizing: Budgeting | None,
    ) -> list[int] | None:
        assert sizing is not None
        budget = limit * sizing.target
        return fit_range(messages, state.deleted_range, state.overlay, budget, sizing)[0]


SPEC = SpecStrategy()
FIT = FitStrategy()


def plan(
    state: TaskState,
    messages: Sequence[Message],
    previous_request: Mapping[str, Any] | None,
    model: Mapping[str, Any],
    budgeting: Budgeting,
    use_auto_condense: bool,
    ts: int | None,
) -> PlanResult:
    """What ``prepare_request`` would do now, asked of a copy: ``state`` is left
    unchanged but for a ``pricing`` the request names (kept as the task's sheet)."""
    if budgeting.pricing is not None:
        state.pricing = budgeting.pricing
    before = budgeting.view_tokens(state.truncated_messages(messages))
    probe = state.clone()
    outcome = probe.prepare_request(
        messages, previous_request, model, use_auto_condense, budgeting, ts
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
    state: TaskState, probe: TaskState, messages: Sequence[Message]
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
