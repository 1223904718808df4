"""One task's state, overlay plus deleted range, and the SPEC operations on it (SPEC.md §5-§9).

The strategies ``prepare_request`` picks from are ``_strategy.py``'s and
``_auto.py``'s; the summaries path (``condense``) is ``_condense.py``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from ctxwin.proto import (
    CompactResult,
    CompactSubagentResult,
    OptimizeFileReadsInMemoryResult,
    OptimizeFileReadsResult,
    PlanResult,
    PrepareRequestResult,
    PriceSheet,
    deleted_range_error,
    sheet_for_model,
)

from ._auto import AUTO, AutoMemory
from ._blocks import Message, text_of, wire_view
from ._budget import Budgeting, Strategy
from ._dialect import CLINE_DIALECT, Dialect
from ._ledger import CacheLedger
from ._notices import DEFAULT_NOTICES, Notices
from ._optimize import MessageFacts, Optimisation, optimize_file_reads
from ._overlay import EDIT_UNDEFINED, CorruptStateError, Overlay
from ._range import Keep, next_truncation_range
from ._reads import DEFAULT_READ_RULES, ReadRules
from ._strategy import FIT, SPEC, ViewStrategy, plan
from ._summary import Summary
from ._view import NEW_TEXT_BLOCK, ViewCache, keep_from, truncated_messages

STRATEGIES: dict[Strategy, ViewStrategy] = {"default": SPEC, "fit": FIT, "auto": AUTO}
"""The strategies by name (``Budgeting.strategy``; docs/STRATEGIES.md)."""


def _check_range(value: object) -> list[int] | None:
    if isinstance(value, tuple):
        value = list(value)
    problem = deleted_range_error(value)
    if problem is not None:
        raise CorruptStateError(f"a deleted range {problem}")
    return None if value is None else [value[0], value[1]]  # type: ignore[index]


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
        "auto",
        "cache",
        "ledger",
        "notices",
        "overlay",
        "reads",
        "revision",
        "summaries",
    )

    def __init__(
        self,
        notices: Notices = DEFAULT_NOTICES,
        reads: ReadRules | None = None,
        dialect: Dialect = CLINE_DIALECT,
    ) -> None:
        """A new state of a task of ``dialect``.

        Args:
            notices: the notice texts.
            reads: the read tools a native dialect's duplicate-read pass counts
                (:data:`DEFAULT_READ_RULES` when not given).
            dialect: the task's dialect; the Cline dialect (SPEC.md exactly)
                unless given. The messages a native dialect's ops take are its
                internal form (docs/DIALECTS.md).

        Raises:
            ValueError: ``reads`` given for the Cline dialect, whose reads are
                its text headers.
        """
        self.notices = notices
        self._dialect = dialect
        self.reads = self._reads_of(dialect, reads)
        # The view cache of the history the ops are given (its owner's), or None.
        self.cache: ViewCache | None = None
        self.overlay = Overlay()
        self._deleted_range: list[int] | None = None
        # (length, digest) of the history prefix the range and the overlay were made on.
        self._basis: tuple[int, bytes] | None = None
        self.revision = 0
        self._pricing: PriceSheet | None = None
        # The views returned and their cost (not stored: a restarted task starts a new ledger).
        self.ledger = CacheLedger()
        self.auto = AutoMemory()
        # Every summary stored and not rolled back, oldest first: the newest is the one
        # the view carries; the older ones come back when a rollback removes it.
        self.summaries: list[Summary] = []

    @property
    def dialect(self) -> Dialect:
        """The task's message dialect (docs/DIALECTS.md)."""
        return self._dialect

    def set_dialect(self, dialect: Dialect, reads: ReadRules | None) -> None:
        """Give the task its dialect and, for a native one, the read tools it counts."""
        self.reads = self._reads_of(dialect, reads)
        if dialect is not self._dialect:
            self._dialect = dialect
            self.revision += 1

    @staticmethod
    def _reads_of(dialect: Dialect, reads: ReadRules | None) -> ReadRules | None:
        """The read tools a task of ``dialect`` counts: None for Cline's text reads."""
        if not dialect.native:
            if reads is not None:
                raise ValueError(f"the {dialect.name} dialect's file reads are its text headers")
            return None
        return DEFAULT_READ_RULES if reads is None else reads

    def _cache_for(self, messages: Sequence[Message]) -> ViewCache | None:
        """:attr:`cache` when it is the one of ``messages`` (a view built with it is built
        faster, the same), else None."""
        cache = self.cache
        return cache if cache is not None and cache.messages is messages else None

    def _facts_of(self, messages: Sequence[Message]) -> MessageFacts | None:
        """The parse results kept beside ``messages``, when :attr:`cache` is theirs."""
        cache = self._cache_for(messages)
        return None if cache is None else cache.facts

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
            and self._dialect is CLINE_DIALECT
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
        dialect: Dialect = CLINE_DIALECT,
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

    def mark_changed(self) -> None:
        self.revision += 1

    def truncated_messages(self, messages: Sequence[Message]) -> list[Message]:
        """The view of ``messages`` under this task's range and overlay (SPEC.md §4)."""
        return truncated_messages(
            messages,
            self._deleted_range,
            self.overlay,
            self.notices,
            self.summary,
            strict=self._dialect.strict,
            cache=self._cache_for(messages),
        )

    def keep_newest(
        self, messages: Sequence[Message], before: list[int] | None, proposed: list[int] | None
    ) -> list[int] | None:
        """A native dialect's range stops short of the turn the newest message answers.

        SPEC.md §4 drops the results after a cut; when those are the newest
        message, the view would lose it, so the cut keeps that whole turn
        (docs/DIALECTS.md). The range still never shrinks.
        """
        if (
            not self._dialect.native
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
        if len(messages) > 1 and (self._dialect.native or _no_text_first(messages[1])):
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
            self.mark_changed()
        return changed

    # §6 -----------------------------------------------------------------

    def optimize(self, messages: Sequence[Message], ts: int) -> Optimisation:
        """Replace superseded file reads after the range in the overlay (SPEC.md §6)."""
        start = keep_from(self._deleted_range)
        return optimize_file_reads(
            messages, start, self.overlay, ts, self.notices, self._facts_of(messages), self.reads
        )

    def optimize_file_reads(self, messages: Sequence[Message], ts: int) -> OptimizeFileReadsResult:
        """Replace superseded file reads after the range and persist (SPEC.md §6)."""
        result = self.optimize(messages, ts)
        if result.changed:
            self.mark_changed()
        return {
            "changed": result.changed,
            "need_to_truncate": result.need_to_truncate,
            "percent_saved": result.percent_saved,
        }

    def optimize_file_reads_in_memory(
        self, messages: Sequence[Message], ts: int
    ) -> OptimizeFileReadsInMemoryResult:
        """As :meth:`optimize_file_reads` without asking for a write (SPEC.md §8).

        Returns the view when something changed, else ``messages`` untouched.
        """
        result = self.optimize(messages, ts)
        view = self.truncated_messages(messages) if result.changed else list(messages)
        need = result.need_to_truncate
        return {"changed": result.changed, "need_to_truncate": need, "messages": wire_view(view)}

    # §7 -----------------------------------------------------------------

    def prepare_request(
        self,
        messages: Sequence[Message],
        previous_request: Mapping[str, Any] | None,
        model: Mapping[str, Any],
        use_auto_condense: bool = False,
        budgeting: Budgeting | None = None,
        ts: int | None = None,
    ) -> PrepareRequestResult:
        """Decide whether to cut before the next request and build its view (SPEC.md §7).

        The request's strategy decides (:data:`STRATEGIES`); with a price sheet
        known, the view's cache figures are recorded in the ledger.

        Args:
            messages: the task's full history.
            previous_request: the last request's usage ``{ts, tokens_*}``, or None.
            model: the model of the next request.
            use_auto_condense: the agent condenses by summary; never cut here.
            budgeting: opt-in estimation, ``fit`` and ``auto`` cuts and proactive
                compaction; None keeps SPEC.md's behaviour exactly.
            ts: the time of a proactive compaction (there is no previous request).
        """
        if previous_request is not None:
            self.auto.max_out = max(self.auto.max_out, int(previous_request.get("tokens_out") or 0))
        strategy = STRATEGIES[budgeting.strategy if budgeting is not None else "default"]
        result, receipts = strategy.prepare(
            self, messages, previous_request, model, use_auto_condense, budgeting, ts
        )
        sheet = None if budgeting is None else self.sheet_for(model, budgeting)
        if budgeting is not None and sheet is not None:
            count, fixed = budgeting.count, budgeting.fixed
            view = cast("list[Message]", result["messages"])  # the engine's own view
            entry = self.ledger.record(view, messages, count, sheet, fixed)
            self.ledger.add_receipts(receipts)
            result["cache"] = entry.wire()
        if receipts:
            result["receipts"] = [receipt.wire() for receipt in receipts]
        return result

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
        return plan(self, messages, previous_request, model, budgeting, use_auto_condense, ts)

    def clone(self) -> TaskState:
        """An independent copy: changes to either never show in the other."""
        copy = TaskState(self.notices, self.reads, self._dialect)
        copy.cache = self.cache
        copy.overlay = self.overlay.copy()
        copy._deleted_range = self.deleted_range
        copy._basis = self._basis
        copy.revision = self.revision
        copy._pricing = self._pricing
        copy.ledger = self.ledger.copy()
        copy.auto = self.auto.copy()
        copy.summaries = list(self.summaries)  # summaries are never changed in place
        return copy

    # §8 -----------------------------------------------------------------

    def compact_subagent(self, messages: Sequence[Message], ts: int) -> CompactSubagentResult:
        """Make a subagent's conversation fit: optimise in memory, else cut a quarter (§8)."""
        result = optimize_file_reads(
            messages, 2, self.overlay, ts, self.notices, self._facts_of(messages), self.reads
        )
        conversation: Sequence[Message] = messages
        compacted = True
        if result.changed:
            conversation = truncated_messages(
                messages,
                None,
                self.overlay,
                self.notices,
                strict=self._dialect.strict,
                cache=self._cache_for(messages),
            )
        if not result.changed or result.need_to_truncate:
            current = self._deleted_range
            proposed = next_truncation_range(conversation, current, "quarter")
            if proposed[1] < proposed[0] or proposed == current:
                compacted = False
            else:
                self.deleted_range = self.keep_newest(messages, current, proposed)
        view = wire_view(self.truncated_messages(messages))
        return {"compacted": compacted, "deleted_range": self.deleted_range, "messages": view}

    def compact(
        self, messages: Sequence[Message], keep: Keep, ts: int, keep_task: bool = False
    ) -> CompactResult:
        """Force a cut: after a context-window error (quarter) or a summary (none) (§8).

        ``keep_task`` leaves the first user message (the task) as it is (SPEC.md §5).
        """
        before = self.revision
        proposed = next_truncation_range(messages, self._deleted_range, keep)
        self.deleted_range = self.keep_newest(messages, self._deleted_range, proposed)
        self.apply_truncation_notice(ts, messages, keep_task)
        return {"deleted_range": self.deleted_range, "changed": self.revision != before}

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
            self.mark_changed()
        return removed
