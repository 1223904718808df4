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


def _differs(
    a: Sequence[object], b: Sequence[object], start: int, stop: int | None
) -> Iterator[bool]:
    """Whether ``a[i] is not b[i]``, for ``i`` from ``start`` to ``stop`` or the shorter's end."""
    if start or stop is not None:
        # Slices, not islice: islice would step over the prefix one by one (and a slice to
        # ``stop`` copies no more than is compared).
        end = None if stop is None else max(stop, start)  # never a slice from the end
        a, b = a[start:end], b[start:end]
    return map(operator.is_not, a, b)


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
    if start or end < len(a):
        a = a[start:end]
    if start or end < len(b):
        b = b[start:end]
    return next(itertools.compress(itertools.count(start), map(operator.is_not, a, b)), end)


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
    numbers = itertools.count(start + counted_from)
    return itertools.compress(numbers, _differs(a, b, start, stop))
