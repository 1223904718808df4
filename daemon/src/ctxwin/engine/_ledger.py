"""A task's cache ledger: what each view sent would cost under a provider's prompt cache.

The model (docs/PRICING.md): a request's cached part is the longest run of
its leading messages identical to the previous request's; the rest is
written to the cache. Sending everything is priced the same way over the
history itself, so every view's cost stands beside what it would have cost
to send the whole history.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxwin.proto import PriceSheet

from ._blocks import Message

__all__ = ["CacheEntry", "CacheLedger", "Receipt", "common_prefix"]


def common_prefix(before: Sequence[Message], after: Sequence[Message]) -> int:
    """How many leading messages of ``after`` are identical to those of ``before``."""
    count = 0
    for old, new in zip(before, after, strict=False):
        if old is not new and old != new:
            break
        count += 1
    return count


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One request: its cached and written tokens, its cost and sending everything's."""

    cached_tokens: int
    written_tokens: int
    cost: float
    keep_all_cost: float

    def wire(self) -> dict[str, Any]:
        return {
            "cached_tokens": self.cached_tokens,
            "written_tokens": self.written_tokens,
            "cost": round(self.cost, 3),
            "keep_all_cost": round(self.keep_all_cost, 3),
        }


@dataclass(frozen=True, slots=True)
class Receipt:
    """What one edit bought: tokens it saves each turn, the rewrite it causes, the payback.

    ``rewrite_tokens``: the view's tokens from the first changed message on,
    written again instead of read from the cache. ``payback_turns``: turns
    until the savings cover the rewrite's extra cost (0 when it costs nothing
    extra, None when it never pays back under the task's sheet).
    """

    ts: int
    kind: str
    index: int
    saved_tokens: int
    rewrite_tokens: int
    payback_turns: float | None

    def wire(self) -> dict[str, Any]:
        return {
            "ts": self.ts,
            "kind": self.kind,
            "index": self.index,
            "saved_tokens": self.saved_tokens,
            "rewrite_tokens": self.rewrite_tokens,
            "payback_turns": None if self.payback_turns is None else round(self.payback_turns, 1),
        }


def payback_turns(sheet: PriceSheet, saved: int, rewrite: int) -> float | None:
    """Turns for ``saved`` tokens a turn, read from the cache, to pay for rewriting ``rewrite``."""
    extra = (sheet.cache_write - sheet.cache_read) * max(rewrite - saved, 0)
    if extra <= 0:
        return 0.0
    per_turn = sheet.cache_read * saved
    return None if per_turn <= 0 else extra / per_turn


RECEIPTS_KEPT = 200
"""Receipts a task remembers (the newest); older ones are dropped from memory."""


class CacheLedger:
    """The views a task returned and their running totals under its price sheet."""

    __slots__ = (
        "_history",
        "_view",
        "cached_tokens",
        "cost",
        "keep_all_cost",
        "receipts",
        "requests",
        "summary_cost",
        "summary_requests",
        "written_tokens",
    )

    def __init__(self) -> None:
        self._view: list[Message] = []
        self._history: list[Message] = []
        self.requests = 0
        self.cached_tokens = 0
        self.written_tokens = 0
        self.cost = 0.0
        self.keep_all_cost = 0.0
        self.summary_requests = 0
        self.summary_cost = 0.0
        self.receipts: list[Receipt] = []

    def copy(self) -> CacheLedger:
        twin = CacheLedger()
        twin._view = self._view
        twin._history = self._history
        twin.requests = self.requests
        twin.cached_tokens = self.cached_tokens
        twin.written_tokens = self.written_tokens
        twin.cost = self.cost
        twin.keep_all_cost = self.keep_all_cost
        twin.summary_requests = self.summary_requests
        twin.summary_cost = self.summary_cost
        twin.receipts = list(self.receipts)
        return twin

    def cached_prefix(self, view: Sequence[Message]) -> int:
        """How many leading messages of ``view`` the last view sent shares."""
        return common_prefix(self._view, view)

    def record(
        self,
        view: Sequence[Message],
        history: Sequence[Message],
        count: Callable[[Message], int],
        sheet: PriceSheet,
        fixed: int = 0,
    ) -> CacheEntry:
        """Price ``view`` against the last view recorded and add it to the totals.

        ``fixed``: tokens sent before the messages with every view (a system
        prompt), cached from the second request on.
        """
        first = self.requests == 0
        shared = common_prefix(self._view, view)
        cached = (0 if first else fixed) + sum(count(message) for message in view[:shared])
        written = (fixed if first else 0) + sum(count(message) for message in view[shared:])
        kept = common_prefix(self._history, history)
        all_cached = (0 if first else fixed) + sum(count(message) for message in history[:kept])
        all_written = (fixed if first else 0) + sum(count(message) for message in history[kept:])
        entry = CacheEntry(
            cached, written, sheet.cost(written, cached), sheet.cost(all_written, all_cached)
        )
        self._view = list(view)
        self._history = list(history)
        self.requests += 1
        self.cached_tokens += entry.cached_tokens
        self.written_tokens += entry.written_tokens
        self.cost += entry.cost
        self.keep_all_cost += entry.keep_all_cost
        return entry

    def add_summary(self, usage: Mapping[str, Any], sheet: PriceSheet) -> float:
        """Add a summary request's reported usage to the totals; returns its cost.

        Its input as the provider reported it: uncached tokens at the input
        price, cache writes and reads at theirs (the output is not priced,
        as for the views). Sending everything needs no summary, so
        ``keep_all_cost`` is left as it is.
        """
        cost = (
            int(usage.get("tokens_in") or 0) * sheet.input
            + int(usage.get("cache_writes") or 0) * sheet.cache_write
            + int(usage.get("cache_reads") or 0) * sheet.cache_read
        )
        self.summary_requests += 1
        self.summary_cost += cost
        self.cost += cost
        return cost

    def add_receipts(self, receipts: Sequence[Receipt]) -> None:
        self.receipts.extend(receipts)
        del self.receipts[:-RECEIPTS_KEPT]

    def totals(self) -> dict[str, Any]:
        """The sums over every request recorded, and the receipts kept."""
        return {
            "requests": self.requests,
            "cached_tokens": self.cached_tokens,
            "written_tokens": self.written_tokens,
            "cost": round(self.cost, 3),
            "keep_all_cost": round(self.keep_all_cost, 3),
            "summary_requests": self.summary_requests,
            "summary_cost": round(self.summary_cost, 3),
            "receipts": [receipt.wire() for receipt in self.receipts],
        }
