"""View patches: a view rebuilt from the caller's own history and a patch result.

A history op asked for ``view: "patch"`` (or ``"patch_prepend"``) answers with
a patch instead of the view's messages (docs/DIALECTS.md, DESIGN.md delta
sync): the caller rebuilds the view from its own message objects, so only
what the view changed crosses the wire.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def apply_view_patch(history: Sequence[Any], patch: Mapping[str, Any]) -> list[Any]:
    """Rebuild a view from the caller's own history and a patch result.

    A patch is ``{"length": n, "keep_from": k, "overrides": [[index, message], ...]}``,
    optionally with ``"prepend": [[index, [block, ...]], ...]``: the view is
    messages 0 and 1 and ``k`` to ``n - 1`` of the history (all of it when
    ``n < 2``), with each listed index replaced by its message, and each
    prepended index by the history's own message at that index with the
    blocks put before its content.

    Raises:
        ValueError: when the patch does not fit ``history``.
    """
    overrides = patch.get("overrides")
    if not isinstance(overrides, list):
        raise ValueError("view patch does not match the history it is applied to")
    return _view_of(history, patch, _overrides(history, overrides, patch.get("prepend")))


def _overrides(history: Sequence[Any], items: list[Any], prepend: object = None) -> dict[int, Any]:
    """A patch's ``overrides`` (a later index wins, as applied in turn) and ``prepend`` as a map.

    A prepended message is rebuilt from the caller's own message: the same
    fields (the same objects), the content a new list of the given blocks
    followed by the message's own blocks.
    """
    held: dict[int, Any] = {}
    for item in items:
        if not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], int):
            raise ValueError("view patch overrides an index that is not in the view")
        held[item[0]] = item[1]
    if prepend is None:
        return held
    if not isinstance(prepend, list):
        raise ValueError("view patch prepend must be a list of [index, blocks]")
    for item in prepend:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or type(item[0]) is not int
            or not isinstance(item[1], list)
        ):
            raise ValueError("view patch prepend must be a list of [index, blocks]")
        index, blocks = item
        if not 0 <= index < len(history) or index in held:
            raise ValueError("view patch prepends to an index that is not in the view")
        message = history[index]
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list | tuple):
            raise ValueError(f"view patch prepends to message {index}, which has no block list")
        held[index] = {**message, "content": [*blocks, *content]}
    return held


def prepended_blocks(original: Mapping[str, Any], message: Mapping[str, Any]) -> list[Any] | None:
    """The blocks ``message`` puts before ``original``'s content, when that is all it changes.

    That is: the same keys in the same order, every value but ``content`` the
    very object ``original`` holds, and ``content`` a list ending with
    ``original``'s own block objects. None otherwise (the whole message must
    be sent). A ``prepend`` entry of these blocks rebuilds a message equal to
    ``message`` from the caller's copy of ``original``.
    """
    content = original.get("content")
    new = message.get("content")
    if type(content) is not list or type(new) is not list or len(message) != len(original):
        return None
    added = len(new) - len(content)
    if added < 0 or list(message) != list(original):
        return None
    for key, value in message.items():
        if key != "content" and original[key] is not value:
            return None
    if any(map(operator.is_not, itertools.islice(new, added, None), content)):
        return None
    return new[:added]


def _view_of(history: Sequence[Any], patch: Mapping[str, Any], held: dict[int, Any]) -> list[Any]:
    length = patch.get("length")
    keep_from = patch.get("keep_from")
    if not isinstance(length, int) or not isinstance(keep_from, int) or length != len(history):
        raise ValueError("view patch does not match the history it is applied to")
    if "order" in patch:
        return _apply_ordered(history, patch["order"], held)
    if length < 2:
        view, start, shift = list(history), 0, 0
    else:
        start = max(keep_from, 2)
        view = [history[0], history[1], *history[start:]]
        shift = start - 2  # view position of origin i >= start is i - shift
    for origin, message in held.items():
        if 0 <= origin < 2:
            view[origin] = message
        elif start <= origin < length:
            view[origin - shift] = message
        else:
            raise ValueError("view patch overrides an index that is not in the view")
    return view


def _apply_ordered(history: Sequence[Any], order: object, replaced: dict[int, Any]) -> list[Any]:
    """A dialect view: the history indices of ``order`` (``[start, end)`` runs, in view order),
    each replaced by its override: one message, or a list of messages (docs/DIALECTS.md).

    The runs are copied as slices of the history; an override of one message is
    then put at its place, and lists are spliced in from the last one back, so a
    view costs its runs and overrides, not a step per message.
    """
    if not isinstance(order, list):
        raise ValueError("view patch order must be a list of [start, end] runs")
    view: list[Any] = []
    places: list[tuple[int, int, int]] = []  # (start, end, view position of start)
    for run in order:
        if (
            not isinstance(run, list)
            or len(run) != 2
            or type(run[0]) is not int
            or type(run[1]) is not int
            or not 0 <= run[0] <= run[1] <= len(history)
        ):
            raise ValueError("view patch order holds a run outside the history")
        if run[0] < run[1]:
            places.append((run[0], run[1], len(view)))
            view += history[run[0] : run[1]]
    if runs_overlap(places):
        raise ValueError("view patch order holds runs that overlap")
    keys = sorted(replaced)
    spliced: list[tuple[int, list[Any]]] = []
    used = 0
    for start, end, position in places:
        low = bisect.bisect_left(keys, start)
        high = bisect.bisect_left(keys, end, low)
        shift = position - start  # view position of history index i in this run: i + shift
        for index in keys[low:high]:
            value = replaced[index]
            if isinstance(value, list):
                spliced.append((index + shift, value))
            else:
                view[index + shift] = value
        used += high - low
    if used != len(replaced):
        raise ValueError("view patch overrides an index that is not in the view")
    spliced.sort(key=operator.itemgetter(0), reverse=True)
    for position, value in spliced:
        view[position : position + 1] = value
    return view


def runs_overlap(runs: Iterable[Sequence[int]]) -> bool:
    """Whether two ``[start, end)`` runs of a view patch's ``order`` share an index.

    The ordered form allows an index in one run at most: the daemon checks a
    patch with this before sending it, the caller before applying it.
    """
    spans = sorted((run[0], run[1]) for run in runs if run[0] < run[1])
    return any(spans[at][0] < spans[at - 1][1] for at in range(1, len(spans)))


class PatchReceiver:
    """A client's side of patches that reuse the overrides of an earlier one.

    Every patch carries a ``token``. A caller that sends a token it applied as
    ``patch_base`` may get ``reuse: true`` with ``base`` (that token): the
    overrides of that patch stand, except the ``dropped`` indices, and
    ``overrides`` (and ``prepend``) list only what is new or changed. Overlaid messages then
    cross the wire once, not every turn. Any mismatch (a lost reply, a daemon
    restart) makes the daemon send every override again. The overrides of the
    last few patches are kept, so that replies to calls made concurrently on
    one task apply whatever order they are read in.
    """

    __slots__ = ("_held", "token")

    KEPT = 4

    def __init__(self) -> None:
        self.token: bytes | None = None
        self._held: dict[bytes, dict[int, Any]] = {}

    def apply(self, history: Sequence[Any], patch: Mapping[str, Any]) -> list[Any]:
        """The view ``patch`` describes; remembers its overrides for later ones.

        Raises:
            ValueError: the patch does not fit ``history`` or reuses a patch not held.
        """
        overrides = patch.get("overrides")
        if not isinstance(overrides, list):
            raise ValueError("view patch without overrides")
        new = _overrides(history, overrides, patch.get("prepend"))
        if patch.get("reuse"):
            base = patch.get("base")
            dropped = patch.get("dropped")
            previous = self._held.get(base) if isinstance(base, bytes) else None
            if previous is None or not isinstance(dropped, list):
                raise ValueError("view patch reuses overrides this client does not hold")
            held = dict(previous)
            for origin in dropped:
                held.pop(origin, None)
            held.update(new)
        else:
            held = new
        view = _view_of(history, patch, held)
        token = patch.get("token")
        if isinstance(token, bytes):
            self._held[token] = held
            while len(self._held) > self.KEPT:
                del self._held[next(iter(self._held))]
            self.token = token
        return view

    def reset(self) -> None:
        """Forget the held overrides: the next patch carries them all."""
        self.token = None
        self._held = {}
