"""View patches: a view rebuilt from the caller's own history and a patch result.

A history op asked for ``view: "patch"`` (or ``"patch_prepend"``) answers with
a patch instead of the view's messages (docs/DIALECTS.md, DESIGN.md delta
sync): the caller rebuilds the view from its own message objects, so only
what the view changed crosses the wire.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._identity import first_other


def apply_view_patch(history: Sequence[Any], patch: Mapping[str, Any]) -> list[Any]:
    """Rebuild a view from the caller's own history and a patch result.

    A patch is ``{"length": n, "keep_from": k, "overrides": [[index, message], ...]}``,
    optionally with ``"prepend": [[index, [block, ...]], ...]``: the view is
    messages 0 and 1 and ``k`` to ``n - 1`` of the history (all of it when
    ``n < 2``), with each listed index replaced by its message, and each
    prepended index by the history's own message at that index with the
    blocks put before its content. With ``"skip": [[start, end], ...]``
    (ascending, disjoint runs within ``k..n``) the view leaves out the history
    messages ``start <= i < end`` of each run too: the gaps of a history with a
    deleted set (``view_patch_skip``).

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
    if first_other(new[added:], content) < len(content):
        return None
    return new[:added]


def _view_of(history: Sequence[Any], patch: Mapping[str, Any], held: dict[int, Any]) -> list[Any]:
    length = patch.get("length")
    keep_from = patch.get("keep_from")
    if not isinstance(length, int) or not isinstance(keep_from, int) or length != len(history):
        raise ValueError("view patch does not match the history it is applied to")
    if "order" in patch:
        return _apply_ordered(history, patch["order"], held)
    if "skip" in patch:
        if any(isinstance(message, list) for message in held.values()):
            raise ValueError("view patch with skip runs overrides an index with a list")
        return _apply_ordered(history, _kept_runs(length, keep_from, patch["skip"]), held)
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


def _kept_runs(length: int, keep_from: int, skip: object) -> list[list[int]]:
    """The history runs a ``keep_from`` patch with ``skip`` keeps, as ``order`` runs: the
    first pair, then ``keep_from..length`` less each skipped ``[start, end)`` run.

    Raises:
        ValueError: ``skip`` is not a list of ascending, disjoint, non-empty runs
            within ``keep_from..length``.
    """
    if not isinstance(skip, list):
        raise ValueError("view patch skip must be a list of [start, end] runs")
    if length < 2:
        if skip:
            raise ValueError("view patch skip holds a run outside the view")
        return [[0, length]]
    runs = [[0, 2]]
    low = max(keep_from, 2)
    for run in skip:
        if not _is_run(run) or not low <= run[0] < run[1] <= length:
            raise ValueError(
                "view patch skip holds a run that is empty, out of order or outside the view"
            )
        runs.append([low, run[0]])
        low = run[1]
    runs.append([low, length])
    return runs


def _is_run(run: object) -> bool:
    """Whether ``run`` is a ``[start, end]`` pair of integers (a patch's ``order`` or ``skip``)."""
    return isinstance(run, list) and len(run) == 2 and type(run[0]) is int and type(run[1]) is int


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
        if not _is_run(run) or not 0 <= run[0] <= run[1] <= len(history):
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


def view_origins(
    length: int, patch: Mapping[str, Any], held: Mapping[int, Any], marks: Mapping[int, Any]
) -> list[int | None]:
    """The history index each message of a patch's view stands for (None: one the view added).

    ``held`` is the patch's overrides by index (with those it reuses), ``marks``
    its ``origins`` by index. A list override without ``origins`` stands for
    its index by its last message, the ones before it added by the view;
    with them, each message is the index (or None) given at its place.

    Raises:
        ValueError: an ``origins`` entry does not match its override.
    """
    if "order" not in patch:
        keep = int(patch.get("keep_from", 0))
        if "skip" in patch:
            runs = _kept_runs(length, keep, patch["skip"])
            return [index for start, end in runs for index in range(start, end)]
        if length < 2:
            return list(range(length))
        return [0, 1, *range(max(keep, 2), length)]
    found: list[int | None] = []
    for start, end in patch["order"]:
        for index in range(start, end):
            value = held.get(index)
            if not isinstance(value, list):
                found.append(index)
                continue
            marked = marks.get(index)
            if marked is None:
                found += [*([None] * (len(value) - 1)), index][: len(value)]
            elif len(marked) != len(value):
                raise ValueError(f"view patch origins of index {index} do not match its override")
            else:
                found += marked
    return found


def _marks_of(items: object) -> dict[int, list[int | None]]:
    """A patch's ``origins`` (``[[index, [origin or None, ...]], ...]``) as a map."""
    if not isinstance(items, list):
        raise ValueError("view patch origins must be a list of [index, origins]")
    marks: dict[int, list[int | None]] = {}
    for item in items:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or type(item[0]) is not int
            or not isinstance(item[1], list)
            or not all(origin is None or type(origin) is int for origin in item[1])
        ):
            raise ValueError("view patch origins must be a list of [index, origins]")
        marks[item[0]] = item[1]
    return marks


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
    one task apply whatever order they are read in. So are their ``origins``
    (which message of a list override stands for which history index), for
    :meth:`origins`.
    """

    __slots__ = ("_held", "_last", "_marks", "token")

    KEPT = 4

    def __init__(self) -> None:
        self.token: bytes | None = None
        self._held: dict[bytes, dict[int, Any]] = {}
        self._marks: dict[bytes, dict[int, list[int | None]]] = {}
        self._last: tuple[int, Mapping[str, Any], dict[int, Any], dict[int, Any]] | None = None

    def apply(self, history: Sequence[Any], patch: Mapping[str, Any]) -> list[Any]:
        """The view ``patch`` describes; remembers its overrides for later ones.

        Raises:
            ValueError: the patch does not fit ``history`` or reuses a patch not held.
        """
        overrides = patch.get("overrides")
        if not isinstance(overrides, list):
            raise ValueError("view patch without overrides")
        new = _overrides(history, overrides, patch.get("prepend"))
        given = patch.get("origins")
        marks: dict[int, list[int | None]] = {}
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
            before = self._marks.get(base)  # type: ignore[arg-type]
            if before:
                marks = dict(before)
                for origin in (*dropped, *new):
                    marks.pop(origin, None)
        else:
            held = new
        if given is not None:
            marks.update(_marks_of(given))
        view = _view_of(history, patch, held)
        self._last = (len(history), patch, held, marks)
        token = patch.get("token")
        if isinstance(token, bytes):
            self._held[token] = held
            self._marks[token] = marks
            while len(self._held) > self.KEPT:
                del self._held[next(iter(self._held))]
            while len(self._marks) > self.KEPT:
                del self._marks[next(iter(self._marks))]
            self.token = token
        return view

    def origins(self) -> list[int | None] | None:
        """The history index each message of the last view applied stands for (None: a
        message the view added); None when the last view came whole (:meth:`took_whole`).

        Raises:
            ValueError: the patch's ``origins`` do not match its overrides.
        """
        if self._last is None:
            return None
        return view_origins(*self._last)

    def took_whole(self) -> None:
        """The last view came as a list, not a patch: :meth:`origins` knows none."""
        self._last = None

    def reset(self) -> None:
        """Forget the held overrides: the next patch carries them all."""
        self.token = None
        self._held = {}
        self._marks = {}
        self._last = None
