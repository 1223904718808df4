"""One task's state, overlay plus deleted range, and the operations on it (SPEC.md §5-§9)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ctxwin.proto import PriceSheet, deleted_range_error, sheet_for_model

from ._auto import DEFAULT_POLICY, AutoPolicy, run_auto, shorten_oversized
from ._blocks import Message, text_of
from ._budget import Budgeting, fit_range, largest_messages, view_origins
from ._ledger import CacheEntry, CacheLedger, Receipt
from ._notices import DEFAULT_NOTICES, Notices
from ._optimize import TOOL_HEADER, MessageFacts, Optimisation, optimize_file_reads
from ._overlay import (
    EDIT_FILE_CHANGE,
    EDIT_FILE_MENTION,
    EDIT_READ_FILE,
    EDIT_UNDEFINED,
    CorruptStateError,
    Overlay,
    replaced_paths,
)
from ._range import Keep, next_truncation_range
from ._reads import ReadRules
from ._summary import Summary, basic_summary
from ._view import NEW_TEXT_BLOCK, KnownPairs, keep_from, truncated_messages
from ._window import context_window_info, should_compact, total_tokens


def _sized_to_report(budgeting: Budgeting, reported: float, estimated: int | None) -> Budgeting:
    """Budgeting whose estimates are at least as large as the provider's report says.

    A fit triggered by a reported usage must cut enough by the provider's count:
    when the estimate of the view the report was about is lower (a provider
    that counts more, a system prompt the daemon never sees), estimates are
    scaled up to match the report for this cut (bounded like calibration).
    """
    if not estimated or reported <= estimated:
        return budgeting
    scale = min(reported / estimated, MAX_REPORT_SCALE)
    return replace(budgeting, ratio=budgeting.ratio * scale)


MAX_REPORT_SCALE = 4.0


@dataclass(frozen=True, slots=True)
class PrepareResult:
    """What ``prepare_request`` decided and the view to send.

    ``stalled`` is true when a compaction was due but could not make the view
    any smaller. The estimate fields are set only when the caller supplied a
    token counter (:class:`Budgeting`).
    """

    deleted_range: list[int] | None
    range_updated: bool
    messages: list[Message]
    stalled: bool = False
    estimated_tokens: int | None = None
    fits: bool | None = None
    largest: list[list[int]] | None = None
    cache: CacheEntry | None = None
    receipts: tuple[Receipt, ...] = ()

    def wire(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "deleted_range": self.deleted_range,
            "range_updated": self.range_updated,
            "messages": self.messages,
            "stalled": self.stalled,
        }
        if self.estimated_tokens is not None:
            result["estimated_tokens"] = self.estimated_tokens
            result["fits"] = self.fits
            if self.largest is not None:
                result["largest"] = self.largest
        if self.cache is not None:
            result["cache"] = self.cache.wire()
        if self.receipts:
            result["receipts"] = [receipt.wire() for receipt in self.receipts]
        return result


@dataclass(frozen=True, slots=True)
class PlanResult:
    """What ``prepare_request`` would do now, computed without changing the task."""

    deleted_range: list[int] | None
    range_updated: bool
    file_reads: list[dict[str, Any]]
    tokens_before: int
    tokens_after: int
    budget: int | float
    fits: bool
    stalled: bool
    largest: list[list[int]] | None

    def wire(self) -> dict[str, Any]:
        return {
            "deleted_range": self.deleted_range,
            "range_updated": self.range_updated,
            "file_reads": self.file_reads,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "budget": self.budget,
            "fits": self.fits,
            "stalled": self.stalled,
            "largest": self.largest,
        }


@dataclass(frozen=True, slots=True)
class OptimizeResult:
    """The outcome of a persisted file read optimisation."""

    changed: bool
    need_to_truncate: bool
    percent_saved: float

    def wire(self) -> dict[str, Any]:
        return {
            "changed": self.changed,
            "need_to_truncate": self.need_to_truncate,
            "percent_saved": self.percent_saved,
        }


@dataclass(frozen=True, slots=True)
class InMemoryResult:
    """The outcome of an in-memory optimisation and the conversation to use."""

    changed: bool
    need_to_truncate: bool
    messages: list[Message]

    def wire(self) -> dict[str, Any]:
        return {
            "changed": self.changed,
            "need_to_truncate": self.need_to_truncate,
            "messages": self.messages,
        }


@dataclass(frozen=True, slots=True)
class SubagentResult:
    """The outcome of compacting a subagent's conversation."""

    compacted: bool
    deleted_range: list[int] | None
    messages: list[Message]

    def wire(self) -> dict[str, Any]:
        return {
            "compacted": self.compacted,
            "deleted_range": self.deleted_range,
            "messages": self.messages,
        }


AUTO_CONDENSE_FRACTION = 0.75
"""The fraction of the window at which a summary is due (SPEC.md §8)."""
CONDENSE_GAP = 6
"""Messages (three turns) that must come between two condenses."""
CONDENSE_KEEPS: tuple[Keep, ...] = ("half", "quarter", "lastTwo", "none")
"""The cuts a condense tries, shallowest first."""
MIN_SUMMARY_BUDGET = 200


@dataclass(frozen=True, slots=True)
class CondenseResult:
    """What ``condense`` stored, or why it refused, and the view after it."""

    condensed: bool
    reason: str | None
    deleted_range: list[int] | None
    summary: Summary | None
    fallback: str | None
    tokens_before: int
    tokens_after: int
    trigger: int | float
    messages: list[Message]

    def wire(self) -> dict[str, Any]:
        return {
            "condensed": self.condensed,
            "reason": self.reason,
            "deleted_range": self.deleted_range,
            "summary": None if self.summary is None else self.summary.wire(),
            "fallback": self.fallback,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "trigger": self.trigger,
            "messages": self.messages,
        }


@dataclass(frozen=True, slots=True)
class CompactResult:
    """The range after a forced compaction and whether anything changed."""

    deleted_range: list[int] | None
    changed: bool

    def wire(self) -> dict[str, Any]:
        return {"deleted_range": self.deleted_range, "changed": self.changed}


def _check_range(value: object) -> list[int] | None:
    if isinstance(value, tuple):
        value = list(value)
    problem = deleted_range_error(value)
    if problem is not None:
        raise CorruptStateError(f"a deleted range {problem}")
    return None if value is None else [value[0], value[1]]  # type: ignore[index]


def _facts_of(messages: Sequence[Message]) -> MessageFacts | None:
    """The parse results a history keeps beside its messages, if it is one that does."""
    return messages.facts if isinstance(messages, KnownPairs) else None


def _no_text_first(message: Message) -> bool:
    """Whether a message's content is a list whose block 0 holds no text to replace."""
    content = message.get("content")
    return isinstance(content, list) and bool(content) and text_of(content[0]) is None


def _first_text_block(message: Message) -> int:
    """The index of the first text block, or :data:`NEW_TEXT_BLOCK` when there is none."""
    content = message.get("content")
    if isinstance(content, list):
        for index, block in enumerate(content):
            if block.get("type") == "text":
                return index
    return NEW_TEXT_BLOCK


class TaskState:
    """A task's overlay and deleted range, with the engine's operations on them.

    The history itself is never stored or changed here: every operation takes
    the caller's messages and returns new lists. ``revision`` grows with each
    change that should be written to disk, so a persister can tell what it has
    written.
    """

    __slots__ = (
        "_basis",
        "_deleted_range",
        "_dialect",
        "_pricing",
        "auto_checked",
        "auto_overflowed",
        "block_tokens",
        "ledger",
        "max_out",
        "notices",
        "overlay",
        "policy",
        "reads",
        "revision",
        "stub_tokens",
        "summaries",
    )

    def __init__(
        self,
        notices: Notices = DEFAULT_NOTICES,
        reads: ReadRules | None = None,
        dialect: str = "cline",
    ) -> None:
        self.notices = notices
        # None: the Cline dialect (SPEC.md exactly); otherwise a native dialect's
        # internal form, whose file reads are tool calls (docs/DIALECTS.md).
        self.reads = reads
        self._dialect = dialect
        self.overlay = Overlay()
        self._deleted_range: list[int] | None = None
        # (length, digest) of the history prefix the range and the overlay were made on.
        self._basis: tuple[int, bytes] | None = None
        self.revision = 0
        self._pricing: PriceSheet | None = None
        # The views returned and their cost (not stored: a restarted task starts a new ledger).
        self.ledger = CacheLedger()
        self.policy: AutoPolicy = DEFAULT_POLICY
        # The largest response reported so far: ``auto`` keeps room for one as large.
        self.max_out = 0
        # Tokens of history text blocks, by (index, block), while the message is the same.
        self.block_tokens: dict[tuple[int, int], tuple[Message, int]] = {}
        self.stub_tokens: dict[str, int] = {}
        # Every summary stored and not rolled back, oldest first: the newest is the one
        # the view carries; the older ones come back when a rollback removes it.
        self.summaries: list[Summary] = []
        # The view's tokens when ``auto`` last looked for a batch that pays back.
        self.auto_checked = 0
        self.auto_overflowed = False

    @property
    def dialect(self) -> str:
        """The task's message dialect (docs/DIALECTS.md); ``cline`` is SPEC.md's."""
        return self._dialect

    def set_dialect(self, dialect: str, reads: ReadRules | None) -> None:
        """Give the task its dialect and, for a native one, the read tools it counts."""
        if dialect != self._dialect:
            self._dialect = dialect
            self.revision += 1
        self.reads = reads

    @property
    def pricing(self) -> PriceSheet | None:
        """The task's price sheet (docs/PRICING.md), once a request named one."""
        return self._pricing

    @pricing.setter
    def pricing(self, sheet: PriceSheet | None) -> None:
        if sheet != self._pricing:
            self._pricing = sheet
            self.revision += 1

    def load_pricing(self, sheet: PriceSheet | None) -> None:
        """Give a loaded task its stored sheet (not a change to write)."""
        self._pricing = sheet

    def sheet_for(self, model: Mapping[str, Any], budgeting: Budgeting | None) -> PriceSheet | None:
        """The sheet a request is priced with: its own (kept), the task's, or its model's."""
        if budgeting is not None and budgeting.pricing is not None:
            self.pricing = budgeting.pricing
        return self._pricing or sheet_for_model(model)

    @property
    def empty(self) -> bool:
        """Whether the state holds nothing yet (no overlay, no range, the default dialect)."""
        return (
            not self.overlay
            and self._deleted_range is None
            and self._basis is None
            and self._dialect == "cline"
            and self._pricing is None
            and not self.summaries
        )

    @property
    def summary(self) -> Summary | None:
        """The summary the view carries: the newest, while the range covers what it stands for.

        A range moved back (a caller's range, a rewound history) below the
        summary's end shows the messages it stood for again, and not the summary.
        """
        if not self.summaries or self._deleted_range is None:
            return None
        newest = self.summaries[-1]
        return newest if self._deleted_range[1] >= newest.end else None

    @property
    def deleted_range(self) -> list[int] | None:
        """The inclusive ``[2, end]`` range of messages not sent, or None."""
        return None if self._deleted_range is None else list(self._deleted_range)

    @deleted_range.setter
    def deleted_range(self, value: Sequence[int] | None) -> None:
        new = None if value is None else [value[0], value[1]]
        if new != self._deleted_range:
            self._deleted_range = new
            self.revision += 1

    @property
    def basis(self) -> tuple[int, bytes] | None:
        """``(length, digest)`` of the history prefix the range and the overlay were made on.

        ``length`` counts the caller's history messages (kept-out ones too),
        ``digest`` is that prefix's chained digest (``ctxwin.proto.DigestChain``).
        None when the task holds neither a range nor edits, or when it was
        stored before bases were kept.
        """
        return self._basis

    @basis.setter
    def basis(self, value: tuple[int, bytes] | None) -> None:
        if value != self._basis:
            self._basis = value
            self.revision += 1

    @property
    def extent(self) -> int:
        """How many first messages (internal ones in a native dialect) the range and the
        overlay refer to: a history shorter than that is not the one they were made on."""
        end = self._deleted_range[1] + 1 if self._deleted_range else 0
        indices = self.overlay.indices()
        return max(end, indices[-1] + 1 if indices else 0)

    def start_over(self) -> None:
        """The history is not the one the range and the overlay were made on: a restart or a
        rewind under the same task. The range, every edit and the summaries of what the range
        removed go (which of the messages they were made on still stand is not known); the
        next view is built afresh.
        """
        self._deleted_range = None
        self._basis = None
        self.summaries = []
        if self.overlay:
            self.overlay.discard(lambda index: False)
        self.revision += 1

    @classmethod
    def load(
        cls,
        updates: object,
        deleted_range: object = None,
        notices: Notices = DEFAULT_NOTICES,
        reads: ReadRules | None = None,
        dialect: str = "cline",
        summaries: object = None,
        basis: tuple[int, bytes] | None = None,
    ) -> TaskState:
        """Rebuild a state from its stored form.

        Args:
            updates: the parsed ``context_history.json`` (SPEC.md §1), or None.
            deleted_range: the stored range, or None.
            notices: the notice texts to use from now on.
            summaries: the stored summaries (:meth:`dump_summaries`), or None.
            reads: the read tools of a native dialect.
            dialect: the task's dialect.
            basis: the stored :attr:`basis`, or None.

        Raises:
            CorruptStateError: when a value does not have its stored shape.
        """
        state = cls(notices, reads, dialect)
        if updates is not None:
            state.overlay = Overlay.load(updates)
        state._deleted_range = _check_range(deleted_range)
        if summaries is not None:
            if not isinstance(summaries, list):
                raise CorruptStateError("summaries must be a list")
            try:
                state.summaries = [Summary.load(item) for item in summaries]
            except ValueError as exc:
                raise CorruptStateError(str(exc)) from None
        state._basis = basis
        return state

    def dump_updates(self) -> list[Any]:
        """The overlay in on-disk form (SPEC.md §1), ready for ``json.dumps``."""
        return self.overlay.dump()

    def dump_summaries(self) -> list[dict[str, Any]]:
        """The summaries in their stored form, oldest first."""
        return [summary.dump() for summary in self.summaries]

    def _changed(self) -> None:
        self.revision += 1

    def truncated_messages(self, messages: Sequence[Message]) -> list[Message]:
        """The view of ``messages`` under this task's range and overlay (SPEC.md §4)."""
        return truncated_messages(
            messages, self._deleted_range, self.overlay, self.notices, self.summary
        )

    def _keep_newest(
        self, messages: Sequence[Message], before: list[int] | None, proposed: list[int] | None
    ) -> list[int] | None:
        """A native dialect's range stops short of the turn the newest message answers.

        SPEC.md §4 drops the results after a cut; when those are the newest
        message, the view would lose it, so the cut keeps that whole turn
        (docs/DIALECTS.md). The range still never shrinks.
        """
        if (
            self.reads is None
            or proposed is None
            or len(messages) < 2
            or proposed[1] != len(messages) - 2
        ):
            return proposed
        content = messages[-1].get("content")
        if not isinstance(content, list) or not any(
            block.get("type") == "tool_result" for block in content
        ):
            return proposed
        floor = before[1] if before else proposed[0] - 1
        return [proposed[0], max(proposed[1] - 2, floor)]

    # §5 -----------------------------------------------------------------

    def add_truncation_notice(self, ts: int, messages: Sequence[Message] = ()) -> bool:
        """Replace message 1 with the truncation notice unless it has edits already.

        In a native dialect the notice replaces message 1's first text block,
        or is added as a new text block when it has none (never into an
        opaque part, docs/DIALECTS.md). The Cline dialect edits block 0 as
        SPEC.md §5 says, unless block 0 holds no text (a ``tool_use``), where
        the edit would change nothing and the model would never read it: then
        the first text block, or a new one put first.
        """
        if 1 in self.overlay:
            return False
        block = 0
        if len(messages) > 1 and (self.reads is not None or _no_text_first(messages[1])):
            block = _first_text_block(messages[1])
        self.overlay.append(1, EDIT_UNDEFINED, block, [ts, "text", [self.notices.truncation], []])
        return True

    def add_first_user_replacement(self, ts: int, messages: Sequence[Message]) -> bool:
        """Replace message 0's first text block unless it has edits already."""
        if 0 in self.overlay or not messages:
            return False
        content = messages[0].get("content")
        if not isinstance(content, list) or not content:
            return False
        first = content[0]
        if first.get("type") != "text" or not text_of(first):
            return False
        self.overlay.append(0, EDIT_UNDEFINED, 0, [ts, "text", [self.notices.first_user], []])
        return True

    def apply_truncation_notice(
        self, ts: int, messages: Sequence[Message], keep_task: bool = False
    ) -> bool:
        """Both notices of SPEC.md §5; True when either was added.

        With ``keep_task`` only the message-1 notice: the task in message 0 stays as it is.
        """
        changed = self.add_truncation_notice(ts, messages)
        if not keep_task:
            changed = self.add_first_user_replacement(ts, messages) or changed
        if changed:
            self._changed()
        return changed

    # §6 -----------------------------------------------------------------

    def _optimize(self, messages: Sequence[Message], ts: int, whole: bool) -> Optimisation:
        start = 2 if whole else keep_from(self._deleted_range)
        return optimize_file_reads(
            messages, start, self.overlay, ts, self.notices, _facts_of(messages), self.reads
        )

    def optimize_file_reads(self, messages: Sequence[Message], ts: int) -> OptimizeResult:
        """Replace superseded file reads after the range and persist (SPEC.md §6)."""
        result = self._optimize(messages, ts, whole=False)
        if result.changed:
            self._changed()
        return OptimizeResult(result.changed, result.need_to_truncate, result.percent_saved)

    def optimize_file_reads_in_memory(self, messages: Sequence[Message], ts: int) -> InMemoryResult:
        """As :meth:`optimize_file_reads` without asking for a write (SPEC.md §8).

        Returns the view when something changed, else ``messages`` untouched.
        """
        result = self._optimize(messages, ts, whole=False)
        view = self.truncated_messages(messages) if result.changed else list(messages)
        return InMemoryResult(result.changed, result.need_to_truncate, view)

    # §7 -----------------------------------------------------------------

    def prepare_request(
        self,
        messages: Sequence[Message],
        previous_request: Mapping[str, Any] | None,
        model: Mapping[str, Any],
        use_auto_condense: bool = False,
        budgeting: Budgeting | None = None,
        ts: int | None = None,
    ) -> PrepareResult:
        """Decide whether to cut before the next request and build its view (SPEC.md §7).

        Args:
            messages: the task's full history.
            previous_request: the last request's usage ``{ts, tokens_*}``, or None.
            model: the model of the next request.
            use_auto_condense: the agent condenses by summary; never cut here.
            budgeting: opt-in estimation, ``fit`` cuts and proactive compaction;
                None keeps SPEC.md's behaviour exactly.
            ts: the time of a proactive compaction (there is no previous request).
        """
        if previous_request is not None:
            self.max_out = max(self.max_out, int(previous_request.get("tokens_out") or 0))
        if budgeting is not None and budgeting.strategy == "auto":
            result = self._prepare_auto(messages, model, use_auto_condense, budgeting, ts)
        else:
            result = self._prepare(
                messages, previous_request, model, use_auto_condense, budgeting, ts
            )
        return self._priced(result, messages, model, budgeting)

    def _prepare(
        self,
        messages: Sequence[Message],
        previous_request: Mapping[str, Any] | None,
        model: Mapping[str, Any],
        use_auto_condense: bool,
        budgeting: Budgeting | None,
        ts: int | None,
    ) -> PrepareResult:
        """SPEC.md §7, and the opt-in ``fit`` and proactive modes."""
        limit = context_window_info(model).max_allowed_size
        trigger = None
        if not use_auto_condense:
            trigger = self._trigger(
                messages, previous_request, limit=limit, budgeting=budgeting, ts=ts
            )
        range_updated = stalled = False
        if trigger is not None:
            range_updated, stalled = self._cut(
                messages,
                trigger,
                limit=limit,
                budgeting=budgeting,
                reported=previous_request is not None,
            )
        view = self.truncated_messages(messages)
        if budgeting is None:
            return PrepareResult(self.deleted_range, range_updated, view, stalled)
        return self._estimated(
            messages,
            view,
            limit=limit,
            budgeting=budgeting,
            range_updated=range_updated,
            stalled=stalled,
        )

    def auto_budget(self, model: Mapping[str, Any]) -> float:
        """What ``auto`` lets a view use: the window less room for the response."""
        window = context_window_info(model).context_window
        return max(window - max(self.policy.reserve, round(self.max_out * 1.25)), 0)

    def _prepare_auto(
        self,
        messages: Sequence[Message],
        model: Mapping[str, Any],
        use_auto_condense: bool,
        budgeting: Budgeting,
        ts: int | None,
    ) -> PrepareResult:
        """``strategy: "auto"``: decide on the view about to be sent (docs/STRATEGIES.md)."""
        sheet = self.sheet_for(model, budgeting)
        budget = self.auto_budget(model)
        range_updated = stalled = False
        receipts: tuple[Receipt, ...] = ()
        if not use_auto_condense:
            before = self.overlay.version
            outcome = run_auto(self, messages, budgeting, budget, sheet, ts or 0, self.policy)
            range_updated, stalled = outcome.range_updated, outcome.stalled
            receipts = tuple(outcome.receipts)
            if self.overlay.version != before:
                self._changed()
        view = self.truncated_messages(messages)
        result = self._estimated(
            messages,
            view,
            limit=budget,
            budgeting=budgeting,
            range_updated=range_updated,
            stalled=stalled,
        )
        return replace(result, receipts=receipts)

    def _priced(
        self,
        result: PrepareResult,
        messages: Sequence[Message],
        model: Mapping[str, Any],
        budgeting: Budgeting | None,
    ) -> PrepareResult:
        """``result`` with its cache figures, recorded in the ledger, when a sheet is known."""
        if budgeting is None:
            return result
        sheet = self.sheet_for(model, budgeting)
        if sheet is None:
            return result
        count = budgeting.count
        entry = self.ledger.record(result.messages, messages, count, sheet, budgeting.fixed)
        self.ledger.add_receipts(result.receipts)
        return replace(result, cache=entry)

    def _trigger(
        self,
        messages: Sequence[Message],
        previous_request: Mapping[str, Any] | None,
        *,
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
            estimate = budgeting.view_tokens(self.truncated_messages(messages))
            return (estimate, ts or 0) if estimate > limit else None
        return None

    def _cut(
        self,
        messages: Sequence[Message],
        trigger: tuple[float, int],
        *,
        limit: float,
        budgeting: Budgeting | None,
        reported: bool,
    ) -> tuple[bool, bool]:
        """Optimise, then cut when that is not enough (SPEC.md §7; ``fit`` sizes the cut).

        Args:
            messages: the task's full history.
            trigger: the tokens that crossed the window and their ``ts``.
            limit: the model's allowed size.
            budgeting: the request's estimation settings, if any.
            reported: the trigger is a provider's report (``fit`` scales
                estimates up to it).

        Returns:
            ``(range_updated, stalled)``.
        """
        tokens, trigger_ts = trigger
        estimate_before: int | None = None
        if budgeting is not None and reported:
            estimate_before = budgeting.view_tokens(self.truncated_messages(messages))
        keep: Keep = "quarter" if tokens / 2 > limit else "half"
        result = self._optimize(messages, trigger_ts, whole=False)
        changed = result.changed
        range_updated = stalled = False
        if result.need_to_truncate:
            changed = self.add_truncation_notice(trigger_ts, messages) or changed
            before = self._deleted_range
            if budgeting is not None and budgeting.strategy == "fit":
                budget = limit * budgeting.target
                sizing = _sized_to_report(budgeting, tokens, estimate_before)
                proposed, _ = fit_range(messages, before, self.overlay, budget, sizing)
            else:
                proposed = next_truncation_range(messages, before, keep)
            self.deleted_range = self._keep_newest(messages, before, proposed)
            range_updated = True
            stalled = not result.changed and keep_from(self._deleted_range) == keep_from(before)
        if changed:
            self._changed()
        return range_updated, stalled

    def _estimated(
        self,
        messages: Sequence[Message],
        view: list[Message],
        *,
        limit: float,
        budgeting: Budgeting,
        range_updated: bool,
        stalled: bool,
    ) -> PrepareResult:
        """The result with the view's estimate, and its largest messages when it does not fit."""
        estimated = budgeting.view_tokens(view)
        fits = estimated <= limit
        largest = None
        if not fits:
            origins = view_origins(len(messages), self._deleted_range)
            largest = largest_messages(view, origins, budgeting)
        return PrepareResult(
            self.deleted_range, range_updated, view, stalled, estimated, fits, largest
        )

    def plan(
        self,
        messages: Sequence[Message],
        previous_request: Mapping[str, Any] | None,
        model: Mapping[str, Any],
        budgeting: Budgeting,
        use_auto_condense: bool = False,
        ts: int | None = None,
    ) -> PlanResult:
        """What :meth:`prepare_request` would do now; this state is left unchanged.

        Only a ``pricing`` the request names is kept as the task's sheet.
        """
        if budgeting.pricing is not None:
            self.pricing = budgeting.pricing
        before = budgeting.view_tokens(self.truncated_messages(messages))
        probe = self.clone()
        outcome = probe.prepare_request(
            messages, previous_request, model, use_auto_condense, budgeting, ts
        )
        assert outcome.estimated_tokens is not None  # set whenever budgeting is given
        assert outcome.fits is not None
        return PlanResult(
            outcome.deleted_range,
            outcome.range_updated,
            self._new_file_reads(probe, messages),
            before,
            outcome.estimated_tokens,
            context_window_info(model).max_allowed_size,
            outcome.fits,
            outcome.stalled,
            outcome.largest,
        )

    def clone(self) -> TaskState:
        """An independent copy: changes to either never show in the other."""
        copy = TaskState(self.notices, self.reads, self._dialect)
        copy.overlay = self.overlay.copy()
        copy._deleted_range = self.deleted_range
        copy._basis = self._basis
        copy.revision = self.revision
        copy._pricing = self._pricing
        copy.ledger = self.ledger.copy()
        copy.policy = self.policy
        copy.max_out = self.max_out
        copy.block_tokens = self.block_tokens
        copy.stub_tokens = self.stub_tokens
        copy.summaries = list(self.summaries)  # summaries are never changed in place
        copy.auto_checked = self.auto_checked
        copy.auto_overflowed = self.auto_overflowed
        return copy

    def _new_file_reads(
        self, probe: TaskState, messages: Sequence[Message]
    ) -> list[dict[str, Any]]:
        """The file reads ``probe`` replaced that this state has not."""
        found: list[dict[str, Any]] = []
        for index, entry in probe.overlay.items():
            if entry.edit_type not in (EDIT_READ_FILE, EDIT_FILE_CHANGE, EDIT_FILE_MENTION):
                continue
            mine = self.overlay.get(index)
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

    # §8 -----------------------------------------------------------------

    def compact_subagent(self, messages: Sequence[Message], ts: int) -> SubagentResult:
        """Make a subagent's conversation fit: optimise in memory, else cut a quarter (§8)."""
        result = optimize_file_reads(
            messages, 2, self.overlay, ts, self.notices, _facts_of(messages), self.reads
        )
        conversation: Sequence[Message] = messages
        if result.changed:
            conversation = truncated_messages(messages, None, self.overlay, self.notices)
            if not result.need_to_truncate:
                return SubagentResult(True, self.deleted_range, self.truncated_messages(messages))
        current = self._deleted_range
        proposed = next_truncation_range(conversation, current, "quarter")
        if proposed[1] < proposed[0] or proposed == current:
            return SubagentResult(False, self.deleted_range, self.truncated_messages(messages))
        self.deleted_range = self._keep_newest(messages, current, proposed)
        return SubagentResult(True, self.deleted_range, self.truncated_messages(messages))

    def compact(
        self, messages: Sequence[Message], keep: Keep, ts: int, keep_task: bool = False
    ) -> CompactResult:
        """Force a cut: after a context-window error (quarter) or a summary (none) (§8).

        ``keep_task`` leaves the first user message (the task) as it is (SPEC.md §5).
        """
        before = self.revision
        proposed = next_truncation_range(messages, self._deleted_range, keep)
        self.deleted_range = self._keep_newest(messages, self._deleted_range, proposed)
        self.apply_truncation_notice(ts, messages, keep_task)
        return CompactResult(self.deleted_range, self.revision != before)

    def condense(
        self,
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
        messages too large for it shortened first (:meth:`fit_oversized`).

        Args:
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
            sheet = self.sheet_for(model, budgeting)
            if sheet is not None:
                self.ledger.add_summary(usage, sheet)
        info = context_window_info(model)
        trigger = min(math.floor(info.context_window * threshold), info.max_allowed_size)
        target = trigger / 2
        # A message larger than the window is shortened first: no cut removes it.
        self.fit_oversized(messages, model, budgeting, ts)
        before_tokens = budgeting.view_tokens(self.truncated_messages(messages))
        newest = self.summaries[-1] if self.summaries else None

        def refused(reason: str) -> CondenseResult:
            return CondenseResult(
                False,
                reason,
                self.deleted_range,
                None,
                None,
                before_tokens,
                before_tokens,
                trigger,
                self.truncated_messages(messages),
            )

        if newest is not None and len(messages) - newest.length < CONDENSE_GAP:
            return refused(
                f"the last condense was {len(messages) - newest.length} messages ago; "
                f"at least {CONDENSE_GAP} must come between two"
            )
        current = self._deleted_range
        candidates: list[list[int]] = []
        for keep in CONDENSE_KEEPS:
            proposed = self._keep_newest(
                messages, current, next_truncation_range(messages, current, keep)
            )
            if proposed is None or proposed[1] < proposed[0]:
                continue
            if keep_from(proposed) <= keep_from(current) or proposed in candidates:
                continue
            candidates.append(proposed)
        if not candidates:
            return refused(
                "no turn is left to remove: the view holds the task and the newest turn only"
            )
        previous = self.summary
        fallback: str | None = None
        if summary is not None and not summary.strip():
            fallback, summary = "the model's summary was empty", None
        probe = self.clone()
        probe.add_truncation_notice(ts, messages)

        def count(text: str) -> int:
            return budgeting.tokens({"role": "user", "content": [{"type": "text", "text": text}]})

        def attempt(given: str | None) -> tuple[Summary, int, list[Message]]:
            chosen: tuple[Summary, int, list[Message]] | None = None
            for proposed in candidates:
                text = given
                if text is None:
                    budget = max(int(target // 4), MIN_SUMMARY_BUDGET)
                    text = basic_summary(messages, proposed[1], budget, count, previous)
                stored = Summary(
                    ts,
                    text,
                    proposed[1],
                    current,
                    "basic" if given is None else "model",
                    len(messages),
                )
                probe._deleted_range = proposed
                probe.summaries = [*self.summaries, stored]
                view = probe.truncated_messages(messages)
                chosen = (stored, budgeting.view_tokens(view), view)
                if chosen[1] <= target:
                    break
            assert chosen is not None
            return chosen

        found = attempt(summary) if summary is not None else None
        if found is not None and found[1] >= before_tokens:
            fallback, found = "the model's summary would not make the view smaller", None
        if found is None:
            found = attempt(None)
            if found[1] >= before_tokens:
                return refused("no summary makes the view smaller")
        stored, after_tokens, _ = found
        self.add_truncation_notice(ts, messages)
        self.summaries.append(stored)
        self._deleted_range = [2, stored.end]
        self._changed()
        return CondenseResult(
            True,
            None,
            self.deleted_range,
            stored,
            fallback,
            before_tokens,
            after_tokens,
            trigger,
            self.truncated_messages(messages),
        )

    def fit_oversized(
        self,
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
        before = self.overlay.version
        receipts = shorten_oversized(
            self,
            messages,
            budgeting,
            self.auto_budget(model),
            self.sheet_for(model, budgeting),
            ts,
            self.policy,
        )
        if self.overlay.version != before:
            self._changed()
        return tuple(receipts)

    def summary_due(
        self,
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
        decision = should_compact(previous_request, model, threshold, self._deleted_range, messages)
        if not decision.compact:
            return False
        assert previous_request is not None  # should_compact is false without one
        result = self.optimize_file_reads(messages, previous_request.get("ts") or 0)
        return result.need_to_truncate

    def condensed(self, messages: Sequence[Message]) -> list[int] | None:
        """After auto-condense, also hide the summary request and its turn (SPEC.md §8)."""
        current = self._deleted_range
        if current is not None and current[1] + 2 <= len(messages) - 1:
            self.deleted_range = [current[0], current[1] + 2]
        return self.deleted_range

    # §9 -----------------------------------------------------------------

    def rollback(self, ts: int) -> int:
        """Undo every edit newer than ``ts`` (SPEC.md §9); returns how many were removed.

        Summaries stored after ``ts`` go too, and the range comes back to the
        one the first of them replaced (docs/SUMMARIES.md).
        """
        removed = self.overlay.rollback(ts)
        keep = len(self.summaries)
        while keep and self.summaries[keep - 1].ts > ts:
            keep -= 1
        if keep < len(self.summaries):
            self.deleted_range = self.summaries[keep].before
            removed += len(self.summaries) - keep
            del self.summaries[keep:]
        if removed:
            self._changed()
        return removed
