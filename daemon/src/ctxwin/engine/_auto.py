"""The ``auto`` strategy: keep the view inside the window at the least cost under a prompt cache.

Decided on the view about to be sent (estimated and calibrated), never on
the last request's usage alone:

1. While the view fits the budget (the window minus an output reserve) and
   no batch of edits pays back, nothing changes: under a prompt cache,
   sending everything again is cheapest (docs/PRICING.md).
2. Candidates for a batch: file reads a later read of the same file
   supersedes (they become the duplicate-read notice, losing nothing), and
   tool results older than the last ``keep_calls`` calls, or larger than
   ``large_result`` tokens, which become a stub naming the tool, its
   arguments and its size (observation masking). Never the latest read of a
   file, never a result of the last ``recent_turns`` turns. Once a view did
   not fit, later views count as not fitting above ``ceiling`` of the budget.
3. A batch is applied whole when the view does not fit, or when it saves at
   least ``min_batch`` tokens and what it saves each turn, over the expected
   remaining turns (over ``margin``), exceeds what rewriting the cache after its
   first edit costs.
4. When masking is not enough, whole turns are cut, down to ``low_water`` of
   the budget so that cuts do not recur every few turns.
5. A message too large for the budget is shortened, with a notice saying so.

Every edit is an overlay update stamped with the request's time, so it is
persisted and rolled back like any other; only text is edited (reasoning and
signatures are opaque parts, never touched), and cuts fall at turn
boundaries, so tool call and result pairs stay intact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ctxwin.proto import PrepareRequestResult, PriceSheet

from ._auto_edits import Planner
from ._blocks import Message
from ._budget import Budgeting
from ._ledger import Receipt
from ._request import Request, prepared
from ._window import context_window_info

if TYPE_CHECKING:
    from ._state import TaskState

__all__ = [
    "DEFAULT_POLICY",
    "AutoMemory",
    "AutoOutcome",
    "AutoPolicy",
    "AutoStrategy",
    "run_auto",
    "shorten_oversized",
]


@dataclass(frozen=True, slots=True)
class AutoPolicy:
    """The settings of the ``auto`` strategy (docs/STRATEGIES.md).

    Attributes:
        reserve: tokens kept free for the response (at least; a quarter more
            than the largest response reported so far when that is larger).
        recent_turns: results in the last this many user messages are never masked.
        keep_calls: results of the last this many tool calls are not masked
            unless they are larger than ``large_result``.
        large_result: tokens from which an older result is masked even among
            the last ``keep_calls``.
        min_batch: tokens a batch must save to be applied while the view fits.
        margin: how many times over a batch's savings must cover its rewrite.
        horizon: expected remaining turns: the turns so far, within these bounds.
        high_water: after masking, a view above this share of the budget also cuts.
        low_water: a cut brings the view down to this share of the budget.
        big_message: a message above this share of the budget is shortened to
            ``shortened`` of the budget before anything is cut for it.
        shortened: see ``big_message``.
        ceiling: once a view did not fit the budget, the share of the budget
            above which later views count as not fitting (below 1, they stay
            smaller than the window allows: cheaper to read from the cache each
            turn, at the cost of what is cut).
        ceiling_floor: the ceiling never brings the limit below this many
            tokens (in a small window the views stay as large as the budget).
    """

    reserve: int = 2048
    recent_turns: int = 2
    keep_calls: int = 2
    large_result: int = 1000
    min_batch: int = 2000
    margin: float = 2.0
    horizon: tuple[int, int] = (20, 200)
    high_water: float = 0.9
    low_water: float = 0.45
    big_message: float = 0.5
    shortened: float = 0.25
    ceiling: float = 0.4
    ceiling_floor: int = 16_000


DEFAULT_POLICY = AutoPolicy()


@dataclass(slots=True)
class AutoMemory:
    """What ``auto`` keeps on a task between requests (not stored: a restarted task
    starts afresh).

    Attributes:
        policy: the task's settings.
        max_out: the largest response reported so far (room is kept for one as large).
        block_tokens: tokens of history text blocks, by (index, block), while the
            message is the same (shared by a task's copies: a cache).
        stub_tokens: tokens of the stubs written, by text (shared the same way).
        checked: the view's tokens when ``auto`` last looked for a batch that pays back.
        overflowed: a view did not fit once: the ceiling applies from then on.
    """

    policy: AutoPolicy = DEFAULT_POLICY
    max_out: int = 0
    block_tokens: dict[tuple[int, int], tuple[Message, int]] = field(default_factory=dict)
    stub_tokens: dict[str, int] = field(default_factory=dict)
    checked: int = 0
    overflowed: bool = False

    def copy(self) -> AutoMemory:
        """An independent copy that shares the token caches."""
        return replace(self)

    def budget(self, model: Mapping[str, Any]) -> float:
        """What ``auto`` lets a view use: the window less room for the response."""
        window = context_window_info(model).context_window
        return max(window - max(self.policy.reserve, round(self.max_out * 1.25)), 0)


@dataclass(slots=True)
class AutoOutcome:
    """What ``auto`` did to a task before a request."""

    range_updated: bool = False
    stalled: bool = False
    receipts: list[Receipt] = field(default_factory=list)


def shorten_oversized(
    state: TaskState,
    messages: Sequence[Message],
    budgeting: Budgeting,
    budget: float,
    sheet: PriceSheet | None,
    ts: int,
    policy: AutoPolicy = DEFAULT_POLICY,
) -> list[Receipt]:
    """Shorten what no cut can fit: when the view is over ``budget``, each message
    above ``big_message`` of it is shortened to ``shortened`` of it, with a notice
    saying so (the step ``auto`` takes first; the summaries path takes it too, since a
    cut and a summary both keep the newest turn whole).

    Returns:
        The receipts of the shortenings (none while the view fits).
    """
    if len(messages) < 3:
        return []
    planner = Planner(state, messages, budgeting, sheet, policy, ts)
    if planner.view_tokens() <= budget:
        return []
    return planner.shorten(budget * policy.big_message, budget * policy.shortened)


def run_auto(
    state: TaskState,
    messages: Sequence[Message],
    budgeting: Budgeting,
    budget: float,
    sheet: PriceSheet | None,
    ts: int,
    policy: AutoPolicy = DEFAULT_POLICY,
) -> AutoOutcome:
    """Decide and apply ``auto``'s edits for the next request (see the module docstring).

    Args:
        state: the task's state, changed in place.
        messages: the task's full history.
        budgeting: the estimates (counter, calibration, fixed tokens).
        budget: the tokens the view may use (the window minus the output reserve).
        sheet: the task's price sheet, or None (decisions assume Anthropic's).
        ts: the time stamped on every edit made.
    """
    outcome = AutoOutcome()
    if len(messages) < 3:
        return outcome
    planner = Planner(state, messages, budgeting, sheet, policy, ts)
    hard = budget
    estimate = planner.view_tokens()
    if estimate > hard:
        state.auto.overflowed = True
    if state.auto.overflowed:
        # A conversation that outgrew the window once will again: keep its views
        # under the ceiling, where reading them from the cache each turn costs less.
        budget = max(budget * policy.ceiling, min(budget, policy.ceiling_floor))
    if estimate <= budget:
        # A batch that did not pay back at the last look can only do so once new
        # messages have added candidates (or turns): look again every half batch.
        if estimate - state.auto.checked < policy.min_batch // 2 and estimate >= state.auto.checked:
            return outcome
        state.auto.checked = estimate
        candidates = planner.candidates()
        if candidates and planner.pays_back(candidates):
            outcome.receipts.append(planner.apply(candidates))
            state.auto.checked = planner.view_tokens()
        return outcome
    candidates = planner.candidates()
    # Over the budget: a message too large for it is shortened first, then the batch.
    outcome.receipts.extend(planner.shorten(budget * policy.big_message, budget * policy.shortened))
    if candidates:
        outcome.receipts.append(planner.apply(candidates))
    estimate = planner.view_tokens()
    state.auto.checked = estimate
    if estimate <= budget * policy.high_water:
        return outcome
    # Not enough: cut whole turns to the low-water mark. (A summary of what the
    # cut removes could stand in for it here.)
    receipt, fits = planner.cut(budget * policy.low_water)
    if receipt is not None:
        outcome.range_updated = True
        outcome.receipts.append(receipt)
    if not fits or planner.view_tokens() > hard:
        # What is left is too large even so: shorten down to the budget.
        outcome.receipts.extend(
            planner.shorten(budget * policy.shortened, budget * policy.shortened)
        )
        if planner.view_tokens() > hard:
            outcome.stalled = receipt is None
    return outcome


class AutoStrategy:
    """``strategy: "auto"``: decide on the view about to be sent (see the module docstring)."""

    def prepare(
        self, state: TaskState, request: Request
    ) -> tuple[PrepareRequestResult, Sequence[Receipt]]:
        messages, model, budgeting = request.messages, request.model, request.budgeting
        assert budgeting is not None  # auto is asked for through budgeting
        sheet = state.sheet_for(model, budgeting)
        budget = state.auto.budget(model)
        outcome = AutoOutcome()
        if not request.use_auto_condense:
            before = state.overlay.version
            policy = state.auto.policy
            ts = request.ts or 0
            outcome = run_auto(state, messages, budgeting, budget, sheet, ts, policy)
            if state.overlay.version != before:
                state.mark_changed()
        result = prepared(
            state, messages, outcome.range_updated, outcome.stalled, budget, budgeting
        )
        return result, outcome.receipts
