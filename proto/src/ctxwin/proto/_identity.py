"""Where two sequences stop holding the very same objects (identity, not equality).

Delta sync, view patches and the mapped history all ask one question of two
lists: at which positions do they hold other objects? An equal message may
encode differently (``1`` and ``1.0``, key order), so the question is
identity. The scans run at C speed (``map(operator.is_not, ...)``), which
matters: they run over whole histories on every turn.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator, Sequence

__all__ = ["first_other", "other_places"]


def first_other(
    a: Sequence[object], b: Sequence[object], start: int = 0, stop: int | None = None
) -> int:
    """The first position from ``start`` at which ``a`` and ``b`` hold other objects.

    Args:
        a: one sequence.
        b: the other.
        start: the first position compared (those before it are taken as the same).
        stop: compare no position from here on.

    Returns:
        The position; when there is none, where the comparison ended: the
        shorter sequence's length, or ``stop`` when that is smaller (never
        less than ``start``).
    """
    end = min(len(a), len(b)) if stop is None else min(len(a), len(b), stop)
    if start >= end:
        return start
    return next(_places(a, b, start, end, 0), end)


def other_places(
    a: Sequence[object],
    b: Sequence[object],
    start: int = 0,
    stop: int | None = None,
    *,
    counted_from: int = 0,
) -> Iterator[int]:
    """Every position from ``start`` (to ``stop``) at which ``a`` and ``b`` hold other
    objects, in order; positions past the shorter sequence are not compared. With
    ``counted_from``, a position is numbered that much higher (``a`` and ``b`` being
    slices that begin there in the caller's numbering), at no cost per position."""
    end = min(len(a), len(b)) if stop is None else min(len(a), len(b), stop)
    return _places(a, b, start, end, counted_from)


def _places(
    a: Sequence[object], b: Sequence[object], start: int, end: int, counted_from: int
) -> Iterator[int]:
    """The positions ``start <= i < end`` where ``a[i] is not b[i]``, numbered from
    ``counted_from`` on. The positions are the selectors' data: ``compress`` stops at the
    end of that range, so from 0 nothing is copied; from further on, the two sequences are
    sliced (islice would step over the prefix one by one)."""
    if start:
        a, b = a[start:end], b[start:end]
    numbers = range(start + counted_from, max(end, start) + counted_from)
    return itertools.compress(numbers, map(operator.is_not, a, b))
