"""The settings of the ``auto`` strategy: a leaf, read by ``_auto.py`` and its planner."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_POLICY", "AutoPolicy"]


@dataclass(frozen=True, slots=True)
class AutoPolicy:
    """The settings of the ``auto`` strategy (docs/STRATEGIES.md says why each is what it is).

    Attributes:
        reserve: tokens kept free for the response (at least; a quarter more
            than the largest response reported so far when that is larger).
        recent_turns: results of the last this many user messages are not masked.
        tail_turns: a rebuild keeps the last this many turns whole.
        pin_share: the latest reads kept by a rebuild take at most this share of the budget.
        ledger_share: the ledger takes at most this share of the budget.
        rent_multiple: a rebuild is due when the rent reaches this many times its rewrite
            cost (1, the order-quantity optimum).
        governor: a rebuild the budget does not force is made only while the task's
            cache-hit rate (cache reads over input tokens) stays at or above this.
        big_message: a message above this share of the budget is shortened to
            ``shortened`` of the budget before anything is cut for it.
        shortened: see ``big_message``.
    """

    reserve: int = 2048
    recent_turns: int = 1
    tail_turns: int = 1
    pin_share: float = 0.15
    ledger_share: float = 0.10
    rent_multiple: float = 1.0
    governor: float = 0.92
    big_message: float = 0.5
    shortened: float = 0.25


DEFAULT_POLICY = AutoPolicy()
