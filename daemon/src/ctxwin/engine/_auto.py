"""The ``auto`` strategy: keep the view inside the window at the least cost under a prompt cache.

Decided on the view about to be sent (estimated and calibrated), never on
the last request's usage alone (docs/STRATEGIES.md gives the reasoning and
where each constant comes from):

1. **The rolling mask.** Each turn, the tool results of the turn that just
   left the recent window (``recent_turns``) become stubs naming the tool,
   its key argument and the size, except each file's latest read. Only that
   turn is written again, right before the new messages: the cache prefix
   before it stays valid, and a result is never read from the cache again.
   A mask is made when it pays back by the next request.
2. **Pinned latest reads.** Each file's latest read is kept, wherever its
   turn stands, up to ``pin_share`` of the budget (the smallest files first:
   as many files as fit).
3. **Rebuilds by a rent rule.** Each turn adds to the rent the cached-read
   price of the tokens a rebuild would drop now; when the rent reaches
   ``rent_multiple`` times what the rebuild would cost to write again
   ((write - read) x tokens rewritten), or when the view does not fit, the
   view is rebuilt to the first pair, the ledger, the pinned turns and the
   last ``tail_turns`` turns. The turns left out join the task's deleted set.
4. **The governor.** A rebuild the budget does not force is made only
   while the task's cache-hit rate (cache reads over input tokens, as a
   provider reports it), this request included, stays at or above
   ``governor``.
5. **The ledger** of what left the view (every instruction, the calls, the
   files) is the summary the view carries after the first pair: it changes
   only at a rebuild.

Every edit is stamped with the request's time: stubs are overlay updates,
rebuilds add to the deleted set and store the ledger; all are persisted
and undone by ``rollback``. Only text is edited, and whole turns (an
assistant message to the user message that answers it) are dropped, so
tool calls and their results stay paired.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ctxwin.proto import PrepareRequestResult, PriceSheet

from ._auto_edits import HistoryFacts, PlannedTask, Planner, Result
from ._auto_policy import DEFAULT_POLICY, AutoPolicy
from ._blocks import Message
from ._budget import Budgeting
from ._ledger import Receipt, payback_turns
from ._request import Request, RequestTask, prepared
from ._summary import Summary
from ._view import keep_from
from ._window import context_window_info

__all__ = [
    "AutoMemory",
    "AutoOutcome",
    "AutoStrategy",
    "run_auto",
    "shorten_oversized",
]


@dataclass(slots=True)
class AutoMemory:
    """What ``auto`` keeps on a task between requests (not stored: a restarted task
    starts afresh, its rent at zero).

    Attributes:
        policy: the task's settings.
        max_out: the largest response reported so far (room is kept for one as large).
        block_tokens: tokens of history text blocks, by (index, block), while the
            message is the same (shared by a task's copies: a cache).
        stub_tokens: tokens of the stubs written, by text (shared the same way).
        results: the tool results of history messages, by index, while the message
            is the same (shared the same way).
        facts: where turns begin, the user messages and the latest reads (extended as the
            history grows; a copy makes its own).
        rent: what not rebuilding has cost since the last rebuild (in input tokens).
        masked_to: the mask has looked at the user messages before this index.
        seen_input: tokens of the views returned so far but the last (the governor's).
        seen_cached: tokens the views returned so far read from the cache.
        last_tokens: tokens of the last view returned (cached by the next request).
    """

    policy: AutoPolicy = DEFAULT_POLICY
    max_out: int = 0
    block_tokens: dict[tuple[int, int], tuple[Message, int]] = field(default_factory=dict)
    stub_tokens: dict[str, int] = field(default_factory=dict)
    results: dict[int, tuple[Message, list[Result]]] = field(default_factory=dict)
    facts: HistoryFacts = field(default_factory=HistoryFacts)
    rent: float = 0.0
    masked_to: int = 0
    seen_input: int = 0
    seen_cached: int = 0
    last_tokens: int = 0

    def copy(self) -> AutoMemory:
        """An independent copy that shares the token caches."""
        facts = self.facts
        own = HistoryFacts(
            facts.seen, facts.anchor, list(facts.starts), list(facts.users), dict(facts.latest)
        )
        return replace(self, facts=own)

    def budget(self, model: Mapping[str, Any]) -> float:
        """What ``auto`` lets a view use: the window less room for the response."""
        window = context_window_info(model).context_window
        return max(window - max(self.policy.reserve, round(self.max_out * 1.25)), 0)

    def share_with(self, cached: float, total: float) -> float:
        """The task's cache-hit rate with this request: of every view's input tokens
        (``total`` this one's), those read from the cache (``cached`` this one's). This is
        the rate a provider reports (cache reads over input), new messages included."""
        sent = self.seen_input + self.last_tokens + total
        return (self.seen_cached + min(cached, self.last_tokens)) / sent if sent else 1.0


class AutoTask(PlannedTask, RequestTask, Protocol):
    """What ``auto`` uses of a task's state (``TaskState`` has it)."""

    @property
    def auto(self) -> AutoMemory:
        """What ``auto`` keeps on the task between requests."""
        ...

    @property
    def summaries(self) -> list[Summary]:
        """Every summary stored and not rolled back, oldest first."""
        ...

    def drop(self, ranges: Sequence[Sequence[int]], ts: int) -> None:
        """Add inclusive ranges to the deleted set, stamped ``ts``."""
        ...

    def mark_changed(self) -> None:
        """Ask for a write."""
        ...

    def sheet_for(self, model: Mapping[str, Any], budgeting: Budgeting | None) -> PriceSheet | None:
        """The sheet a request is priced with."""
        ...


@dataclass(slots=True)
class AutoOutcome:
    """What ``auto`` did to a task before a request."""

    range_updated: bool = False
    stalled: bool = False
    receipts: list[Receipt] = field(default_factory=list)
    view: list[Message] | None = None  # the view decided on, when built (with its tokens)
    tokens: int | None = None


def shorten_oversized(
    state: AutoTask,
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
    state: AutoTask,
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
    memory = state.auto
    planner = Planner(state, messages, budgeting, sheet, policy, ts)
    turn = _Turn(planner, budget)
    read, write = planner.sheet.cache_read, planner.sheet.cache_write
    cached = float(min(memory.last_tokens, turn.total))  # the last view: the cached prefix
    # 1. The rolling mask: the turn that just left the recent window.
    every = planner.facts().users
    users = every[bisect.bisect_left(every, turn.start) :]
    recent = users[-policy.recent_turns] if len(users) >= policy.recent_turns else turn.start
    older = users[-policy.recent_turns - 1] if len(users) > policy.recent_turns else recent
    first = max(memory.masked_to or older, turn.start)
    memory.masked_to = recent
    candidates = planner.mask_candidates(first, recent, turn.latest) if first < recent else []
    if candidates:
        at = min(candidate.index for candidate in candidates)
        prefix = turn.prefix(at)
        saved = turn.ratio * sum(candidate.saved for candidate in candidates)
        # What the last view held from the first stub on is written again instead of read:
        # the mask is made when that costs no more than what it saves by the next request.
        before = max(cached - prefix, saved)
        pays = write * (before - saved) - read * before <= read * saved
        if turn.total > budget or pays:
            rewrite = round(turn.total - prefix)
            outcome.receipts.append(planner.apply(candidates, rewrite))
            turn = _Turn(planner, budget)
            cached = min(cached, prefix)
    # 2. Rebuilds by the rent rule, or when the view does not fit.
    plan = turn.plan()
    memory.rent += read * plan.dropped_tokens
    due = (
        plan.dropped_tokens > 0
        and memory.rent >= policy.rent_multiple * (write - read) * plan.rewritten
    )
    fits = turn.total <= budget
    if not fits or (due and memory.share_with(turn.head, plan.kept_tokens) >= policy.governor):
        if not fits:
            plan = turn.plan(fit=True)
        receipt = turn.rebuild(plan)
        if receipt is not None:
            outcome.range_updated = True
            outcome.receipts.append(receipt)
            cached = min(cached, turn.head)
            turn = _Turn(planner, budget)
    # 3. What still does not fit is shortened.
    if turn.total > budget:
        outcome.receipts.extend(
            planner.shorten(budget * policy.big_message, budget * policy.shortened)
        )
        if planner.view_tokens() > budget:
            outcome.receipts.extend(
                planner.shorten(budget * policy.shortened, budget * policy.shortened)
            )
        total = planner.view_tokens()
        outcome.stalled = total > budget
        cached = min(cached, turn.head)
    else:
        total = round(turn.total)
        outcome.view, outcome.tokens = planner.view(), total
    memory.seen_input += memory.last_tokens
    memory.seen_cached += round(min(cached, memory.last_tokens))
    memory.last_tokens = total
    return outcome


@dataclass(slots=True)
class _Plan:
    """A rebuild: the turns it drops (inclusive ranges), their tokens and what it rewrites."""

    ranges: list[tuple[int, int]]
    dropped_tokens: float
    kept_tokens: float
    rewritten: float


class _Turn:
    """One decision's view, its sizes and turns (made again after each edit)."""

    def __init__(self, planner: Planner[AutoTask], budget: float) -> None:
        self.planner = planner
        self.budget = budget
        state = planner.state
        budgeting = planner.budgeting
        self.ratio = budgeting.ratio
        view = planner.view()
        self.origins = planner.origins()
        self.sizes = [budgeting.count(message) for message in view]
        self.position = {index: place for place, index in enumerate(self.origins)}
        self.total = (sum(self.sizes) + budgeting.fixed) * self.ratio
        head = self.sizes[0] + (self.sizes[1] if len(self.sizes) > 1 else 0)
        self.head = (head + budgeting.fixed) * self.ratio
        self.start = keep_from(state.deleted_range)
        self.latest = planner.latest_reads(self.start)

    def prefix(self, index: int) -> float:
        """Calibrated tokens of the view before history index ``index`` (with the fixed ones)."""
        place = self.position.get(index, len(self.sizes))
        return (sum(self.sizes[:place]) + self.planner.budgeting.fixed) * self.ratio

    def plan(self, fit: bool = False) -> _Plan:
        """The rebuild now: keep the first pair, the last ``tail_turns`` turns and the turns of
        the latest reads (the smallest first, the newer of two the same size first, up to
        ``pin_share`` of the budget); with ``fit``, fewer pins (the largest left out first)
        and tail turns until the view fits the budget."""
        planner, policy = self.planner, self.planner.policy
        messages = planner.messages
        position, sizes, ratio = self.position, self.sizes, self.ratio
        starts = planner.turn_starts(self.start)
        units: list[tuple[int, int, float]] = []  # visible turns: (first, last, tokens)
        for place, low in enumerate(starts):
            high = starts[place + 1] - 1 if place + 1 < len(starts) else len(messages) - 1
            if low not in position:
                continue  # dropped already (whole turns are)
            tokens = sum(sizes[position[i]] for i in range(low, high + 1) if i in position)
            units.append((low, high, tokens * ratio))
        if len(units) <= policy.tail_turns:
            return _Plan([], 0.0, self.total, 0.0)
        lows = [unit[0] for unit in units]
        tail = set(range(len(units) - policy.tail_turns, len(units)))
        visible_head = self.total - sum(unit[2] for unit in units)
        ledger = planner.ledger_estimate(self.total)
        pins: list[int] = []
        for index, _block in sorted(self.latest.values(), reverse=True):
            if index not in position:
                continue  # left out already
            at = _unit_of(lows, index)
            if at is not None and at not in tail and at not in pins:
                pins.append(at)
        limit = self.budget * policy.pin_share
        tail_tokens = sum(units[at][2] for at in tail)
        if fit:
            room = self.budget - visible_head - ledger - tail_tokens
            while room < 0 and len(tail) > 1:  # the newest turn stays
                oldest = min(tail)
                tail.discard(oldest)
                room += units[oldest][2]
                tail_tokens -= units[oldest][2]
            limit = min(limit, max(room, 0.0))
        kept = set(tail)
        used = 0.0
        pins.sort(key=lambda at: units[at][2])
        for at in pins:
            if used + units[at][2] <= limit:
                kept.add(at)
                used += units[at][2]
        ranges: list[tuple[int, int]] = []
        dropped = 0.0
        for at, (low, high, size) in enumerate(units):
            if at in kept:
                continue
            dropped += size
            if ranges and ranges[-1][1] + 1 == low:
                ranges[-1] = (ranges[-1][0], high)
            else:
                ranges.append((low, high))
        kept_tokens = self.total - dropped + ledger
        return _Plan(ranges, dropped, kept_tokens, max(kept_tokens - self.head, 0.0))

    def rebuild(self, plan: _Plan) -> Receipt | None:
        """Drop the plan's turns and store the ledger of every turn gone; its receipt."""
        if not plan.ranges:
            return None
        planner = self.planner
        state, messages, ts = planner.state, planner.messages, planner.ts
        state.drop(plan.ranges, ts)
        gone = [
            index
            for low, high in state.dropped
            for index in range(low, min(high + 1, len(messages)))
        ]
        text = planner.ledger_text(gone, round(self.budget * planner.policy.ledger_share))
        end = state.dropped[-1][1]
        state.summaries.append(Summary(ts, text, end, state.deleted_range, "basic", len(messages)))
        state.auto.rent = 0.0
        removed = round(plan.dropped_tokens)
        rewrite = round(plan.rewritten)
        return Receipt(
            ts,
            "rebuild",
            plan.ranges[0][0],
            removed,
            rewrite,
            payback_turns(planner.sheet, removed, rewrite),
        )


def _unit_of(lows: list[int], index: int) -> int | None:
    """The visible turn holding history index ``index``, or None (the head)."""
    at = bisect.bisect_right(lows, index) - 1
    return at if at >= 0 else None


class AutoStrategy:
    """``strategy: "auto"``: decide on the view about to be sent (see the module docstring)."""

    def prepare(
        self, state: AutoTask, request: Request
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
            state,
            messages,
            outcome.range_updated,
            outcome.stalled,
            budget,
            budgeting,
            outcome.view,
            outcome.tokens,
        )
        return result, outcome.receipts
