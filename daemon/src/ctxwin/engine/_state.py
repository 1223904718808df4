"""One task's state: its overlay, deleted range, summaries, ledger and settings, with
its view (SPEC.md §4) and the ops every request takes (§6, §7, §9).

The other operations are functions of their concept's module, taking the
state first: the strategies ``prepare_request`` picks from and ``plan`` in
``_strategy.py`` and ``_auto.py``, the cuts and their notices (``compact``,
``compact_subagent``, ``apply_truncation_notice``) in ``_cuts.py``, the
summaries path (``condense``) in ``_condense.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ctxwin.proto import (
    OptimizeFileReadsInMemoryResult,
    OptimizeFileReadsResult,
    PrepareRequestResult,
    PriceSheet,
    deleted_range_error,
    sheet_for_model,
)

from ._auto import AutoMemory
from ._blocks import Message
from ._budget import Budgeting
from ._condense import rollback_summaries
from ._dialect import CLINE_DIALECT, Dialect
from ._ledger import CacheLedger
from ._notices import DEFAULT_NOTICES, Notices
from ._optimize import (
    MessageFacts,
    Optimisation,
    optimize_file_reads,
    optimize_task,
    optimize_task_in_memory,
)
from ._overlay import CorruptStateError, Overlay
from ._reads import DEFAULT_READ_RULES, ReadRules
from ._request import Request
from ._strategy import prepare
from ._summary import Summary, carried
from ._view import ViewCache, keep_from, truncated_messages


def _check_range(value: object) -> list[int] | None:
    if isinstance(value, tuple):
        value = list(value)
    problem = deleted_range_error(value)
    if problem is not None:
        raise CorruptStateError(f"a deleted range {problem}")
    return None if value is None else [value[0], value[1]]  # type: ignore[index]


Drop = tuple[int, tuple[tuple[int, int], ...]]
"""One step of a task's deleted set: when it was made and the inclusive ranges it added."""


def _check_drops(value: object) -> list[Drop]:
    """The stored deleted set (``[{"ts": ..., "ranges": [[first, last], ...]}, ...]``).

    Raises:
        CorruptStateError: a value of another shape.
    """
    if value is None:
        return []
    if not isinstance(value, list):
        raise CorruptStateError("a deleted set must be a list")
    drops: list[Drop] = []
    for item in value:
        ts = item.get("ts") if isinstance(item, dict) else None
        ranges = item.get("ranges") if isinstance(item, dict) else None
        if not isinstance(ts, int) or isinstance(ts, bool) or not isinstance(ranges, list):
            raise CorruptStateError("a deleted set step has an unexpected shape")
        found: list[tuple[int, int]] = []
        for pair in ranges:
            if (
                not isinstance(pair, list | tuple)
                or len(pair) != 2
                or not all(isinstance(b, int) and not isinstance(b, bool) for b in pair)
                or not 2 <= pair[0] <= pair[1]
            ):
                raise CorruptStateError("a deleted set range has an unexpected shape")
            found.append((pair[0], pair[1]))
        drops.append((ts, tuple(found)))
    return drops


def merged_ranges(drops: Sequence[Drop]) -> tuple[tuple[int, int], ...]:
    """The union of the steps' ranges, ascending and disjoint (touching ones joined)."""
    pairs = sorted(pair for _, ranges in drops for pair in ranges)
    out: list[list[int]] = []
    for first, last in pairs:
        if out and first <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], last)
        else:
            out.append([first, last])
    return tuple((first, last) for first, last in out)


def _reads_for(dialect: Dialect, reads: ReadRules | None) -> ReadRules | None:
    """The read tools a task of ``dialect`` counts: None for Cline's text reads."""
    if not dialect.native:
        if reads is not None:
            raise ValueError(f"the {dialect.name} dialect's file reads are its text headers")
        return None
    return DEFAULT_READ_RULES if reads is None else reads


class TaskState:
    """A task's overlay and deleted range, what else it keeps, and its view.

    The history itself is never stored or changed here: every operation takes
    the caller's messages and returns new lists. ``revision`` grows with each
    change that should be written to disk, so a persister can tell what it has
    written.
    """

    __slots__ = (
        "_basis",
        "_deleted_range",
        "_dialect",
        "_dropped",
        "_drops",
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
        self.reads = _reads_for(dialect, reads)
        # The view cache of the history the ops are given (its owner's), or None.
        self.cache: ViewCache | None = None
        self.overlay = Overlay()
        self._deleted_range: list[int] | None = None
        # The deleted set (``auto`` only): the steps that made it, and their union.
        self._drops: list[Drop] = []
        self._dropped: tuple[tuple[int, int], ...] = ()
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
        self.reads = _reads_for(dialect, reads)
        if dialect is not self._dialect:
            self._dialect = dialect
            self.revision += 1

    def cache_for(self, messages: Sequence[Message]) -> ViewCache | None:
        """:attr:`cache` when it is the one of ``messages`` (a view built with it is built
        faster, the same), else None."""
        cache = self.cache
        return cache if cache is not None and cache.messages is messages else None

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
            and not self._drops
            and self._basis is None
            and self._dialect is CLINE_DIALECT
            and self._pricing is None
            and not self.summaries
        )

    @property
    def summary(self) -> Summary | None:
        """The summary the view carries (:func:`~._summary.carried`)."""
        return carried(self.summaries, self._deleted_range, self._dropped)

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
    def dropped(self) -> tuple[tuple[int, int], ...]:
        """The deleted set: inclusive ranges after the deleted range that are not sent either,
        ascending and disjoint (the ``auto`` strategy's; docs/STRATEGIES.md)."""
        return self._dropped

    @property
    def drops(self) -> list[Drop]:
        """The steps of the deleted set, oldest first: ``(ts, ranges added)``."""
        return list(self._drops)

    def drop(self, ranges: Sequence[Sequence[int]], ts: int) -> None:
        """Add inclusive ranges (each within ``2..``) to the deleted set, stamped ``ts``
        (a rollback to before ``ts`` puts them back)."""
        added = tuple((int(first), int(last)) for first, last in ranges if 2 <= first <= last)
        if not added:
            return
        self._drops.append((ts, added))
        self._dropped = merged_ranges(self._drops)
        self.revision += 1

    def dump_drops(self) -> list[dict[str, Any]]:
        """The deleted set's steps in their stored form (``ctxwin.json``), oldest first."""
        return [{"ts": ts, "ranges": [list(pair) for pair in ranges]} for ts, ranges in self._drops]

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
        if self._dropped:
            end = max(end, self._dropped[-1][1] + 1)
        indices = self.overlay.indices()
        return max(end, indices[-1] + 1 if indices else 0)

    def start_over(self) -> None:
        """The history is not the one the range and the overlay were made on: a restart or a
        rewind under the same task. The range, every edit and the summaries of what the range
        removed go (which of the messages they were made on still stand is not known); the
        next view is built afresh.
        """
        self._deleted_range = None
        self._drops = []
        self._dropped = ()
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
        drops: object = None,
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
            drops: the stored deleted set (:meth:`dump_drops`), or None.

        Raises:
            CorruptStateError: when a value does not have its stored shape.
        """
        state = cls(notices, reads, dialect)
        if updates is not None:
            state.overlay = Overlay.load(updates)
        state._deleted_range = _check_range(deleted_range)
        state._drops = _check_drops(drops)
        state._dropped = merged_ranges(state._drops)
        try:
            state.summaries = Summary.load_all(summaries)
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
            cache=self.cache_for(messages),
            dropped=self._dropped,
        )

    # §6 -----------------------------------------------------------------

    def optimize(self, messages: Sequence[Message], ts: int, whole: bool = False) -> Optimisation:
        """Replace superseded file reads after the range (``whole``: from message 2) in the
        overlay, with no write asked for (SPEC.md §6)."""
        start = 2 if whole else keep_from(self._deleted_range)
        return optimize_file_reads(
            messages, start, self.overlay, ts, self.notices, self._facts_of(messages), self.reads
        )

    def _facts_of(self, messages: Sequence[Message]) -> MessageFacts | None:
        """The parse results kept beside ``messages``, when :attr:`cache` is theirs."""
        cache = self.cache_for(messages)
        return None if cache is None else cache.facts

    def optimize_file_reads(self, messages: Sequence[Message], ts: int) -> OptimizeFileReadsResult:
        """Replace superseded file reads after the range and persist (SPEC.md §6)."""
        return optimize_task(self, messages, ts)

    def optimize_file_reads_in_memory(
        self, messages: Sequence[Message], ts: int
    ) -> OptimizeFileReadsInMemoryResult:
        """As :meth:`optimize_file_reads` without asking for a write (SPEC.md §8)."""
        return optimize_task_in_memory(self, messages, ts)

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
        """Decide whether to cut before the next request and build its view (SPEC.md §7):
        the request's strategy decides (``_strategy.prepare``; the arguments are
        :class:`~._request.Request`'s; ``budgeting`` None is SPEC.md exactly)."""
        request = Request(messages, previous_request, model, use_auto_condense, budgeting, ts)
        return prepare(self, request)

    def clone(self) -> TaskState:
        """An independent copy: changes to either never show in the other."""
        copy = TaskState(self.notices, self.reads, self._dialect)
        copy.cache = self.cache
        copy.overlay = self.overlay.copy()
        copy._deleted_range = self.deleted_range
        copy._drops = list(self._drops)
        copy._dropped = self._dropped
        copy._basis = self._basis
        copy.revision = self.revision
        copy._pricing = self._pricing
        copy.ledger = self.ledger.copy()
        copy.auto = self.auto.copy()
        copy.summaries = list(self.summaries)  # summaries are never changed in place
        return copy

    # §9 -----------------------------------------------------------------

    def rollback(self, ts: int) -> int:
        """Undo every edit newer than ``ts`` (SPEC.md §9); returns how many were removed.

        Summaries stored after ``ts`` go too, and the range comes back to the
        one the first of them replaced (docs/SUMMARIES.md); so do the deleted
        set's steps made after ``ts``.
        """
        removed = self.overlay.rollback(ts) + rollback_summaries(self, ts)
        kept = [drop for drop in self._drops if drop[0] <= ts]
        if len(kept) != len(self._drops):
            removed += len(self._drops) - len(kept)
            self._drops = kept
            self._dropped = merged_ranges(kept)
        if removed:
            self.mark_changed()
        return removed
