"""View patches: a task's view sent as a patch on the history its caller holds.

A history op asked for ``view: "patch"`` (or ``"patch_prepend"``) answers with
a patch that ``ctxwin.proto.apply_view_patch`` rebuilds the view from, out of
the caller's own message objects (DESIGN.md delta sync, docs/DIALECTS.md).
There are two forms:

- the ``keep_from`` form, for a view of the history itself (the identity
  dialect): messages 0 and 1 and those from ``keep_from`` on (less the
  ``skip`` runs a deleted set leaves out, for a caller that applies them),
  with the positions whose message is not the history's own object as
  ``overrides``;
- the ``order`` form, for a view mapped back from a dialect's internal form
  (:class:`~._mapped.MappedHistory`): runs of history indices in view
  order, with rebuilt messages (and the ones the view added) as overrides.

One :class:`PatchMaker` per task makes both, and keeps one ledger of what
was sent: the token of the last patch and its overrides. A caller that names
that token (``patch_base``) gets only the overrides it does not hold
(``reuse``, ``base``, ``dropped``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from typing import Any

from ctxwin.proto import first_other, other_places, prepended_blocks, runs_overlap

from ._blocks import Message
from ._history import History
from ._mapped import MappedHistory
from ._notices import DEFAULT_NOTICES
from ._view import Spans, keep_from, span_index, spans_length, view_length, view_spans

__all__ = ["PatchMaker", "view_patch"]


def view_patch(
    view: Sequence[Message],
    history: Sequence[Message],
    deleted_range: Sequence[int] | None,
    dropped: Sequence[Sequence[int]] = (),
) -> dict[str, Any]:
    """A view as a patch on ``history``: what ``apply_view_patch`` rebuilds it from.

    Only view messages that are not the history's own objects at their index
    are sent (``overrides``), so an untouched view costs a few bytes. The
    runs of the deleted set ``dropped`` the view leaves out go as ``skip``.
    """
    start = keep_from(deleted_range)
    return _full_patch(view, history, _Layout(len(history), start, dropped))


def _full_patch(
    view: Sequence[Message], history: Sequence[Message], layout: _Layout
) -> dict[str, Any]:
    """``view`` as a ``keep_from`` patch of ``layout`` on ``history``, every override listed."""
    length = len(history)
    if length < 2:
        kept: list[Message] = list(history)
    else:
        kept = [history[0], history[1]]
        for low, high, _ in layout.spans:
            kept += history[low:high]
    if len(kept) != len(view):
        raise ValueError(f"a view of {len(view)} messages is not one of this history")
    # Positions whose message is not the history's own object (a C-speed scan).
    changed = other_places(view, kept)
    if layout.skip:
        origin = layout.origin
        overrides = [[origin(place), view[place]] for place in changed]
    else:  # one run: a view position past the first pair is its index less one shift
        shift = layout.start - 2
        overrides = [[place if place < 2 else place + shift, view[place]] for place in changed]
    patch: dict[str, Any] = {"length": length, "keep_from": layout.start, "overrides": overrides}
    if layout.skip:
        patch["skip"] = [list(run) for run in layout.skip]
    return patch


class _Layout:
    """Which history messages a ``keep_from`` view holds: the first pair, then the
    runs ``spans`` (:func:`~._view.view_spans`) from ``start`` on; ``skip`` are the
    ``[start, end)`` runs after ``start`` it leaves out (a deleted set's gaps)."""

    __slots__ = ("key", "size", "skip", "spans", "start")

    def __init__(self, length: int, start: int, dropped: Sequence[Sequence[int]] = ()) -> None:
        self.start = start
        if not dropped:  # one run (what view_spans gives), made at no cost: the usual case
            self.spans: Spans = ((start, max(start, length), 2 - start),)
            self.skip: tuple[tuple[int, int], ...] = ()
            self.size = length if length < 2 else 2 + max(length - start, 0)  # view_length
        else:
            spans = self.spans = view_spans(length, start, dropped)
            skip = [(a[1], b[0]) for a, b in itertools.pairwise(spans) if a[1] < b[0]]
            if length >= 2 and spans[-1][1] < length:
                skip.append((spans[-1][1], length))  # a deleted set reaching the history's end
            self.skip = tuple(skip)
            self.size = length if length < 2 else 2 + spans_length(spans)
        self.key = (start, self.skip)  # what a patch's positions map by, whatever its length

    def origin(self, place: int) -> int:
        """The history index at view position ``place``."""
        return place if place < 2 else span_index(self.spans, place)

    def position_from(self, index: int) -> int:
        """The first view position whose history index is ``index`` or after it."""
        if index < 2:
            return index
        for low, high, offset in self.spans:
            if index < high:
                return max(index, low) + offset
        low, high, offset = self.spans[-1]
        return high + offset


class PatchMaker:
    """The view patches of one task, in both forms, with one ledger of what was sent.

    The ledger holds the token of the last patch made (a serial and a salt of
    this maker's own: tokens of an earlier maker never match) and the
    overrides that patch carried, as the view's own message objects (so
    keeping them costs references only).
    """

    __slots__ = ("_last", "_resume", "_salt", "_serial", "_token")

    def __init__(self) -> None:
        self._token: bytes | None = None
        self._serial = 0
        self._salt = os.urandom(8)
        self._last: _LastView | _LastOrder | None = None
        self._resume: _Resume | None = None  # the ``order`` form's pieces, for the next view

    def forget(self) -> None:
        """Forget the overrides sent (the history went): the next patch is sent whole."""
        self._last = None
        self._resume = None

    def of_history(
        self,
        view: list[Any],
        history: History,
        deleted_range: list[int] | None,
        base: bytes | None,
        *,
        prepend: bool = False,
        gaps: Sequence[Sequence[int]] | None = None,
    ) -> dict[str, Any] | None:
        """``view`` as a ``keep_from`` patch on ``history``; None when it is not a view of it.

        The overrides are worked out against the last patch made (the
        positions whose message is another object than in its view, and the
        history's messages from where it changed since), so a turn that adds
        two messages costs the few it changed, not the whole view; when
        ``base`` names that patch, only new or changed overrides are sent.
        With ``prepend``, a repaired message that only puts blocks before the
        history's own ones is sent as those blocks. A view that leaves out
        ``gaps`` (the deleted set it was made with, given when the caller applies
        ``skip`` runs) carries them as ``skip`` runs; without ``gaps`` such a view
        is not a patch (None: it is sent whole, as to a caller from before that form).
        """
        messages = history.messages
        length = len(messages)
        layout = _view_layout(view, length, deleted_range, gaps)
        unchanged = history.take_unchanged()
        if layout is None:
            self._last = None  # the next one starts afresh: changes since are not known
            return None
        if view is messages:
            view = list(view)  # kept as the last view: it must not change with the history
        last = self._last
        token = self._next_token()
        previous, self._token = self._token, token
        if (
            not isinstance(last, _LastView)
            or last.history is not history
            or last.layout.key != layout.key
            or length < 2
        ):
            patch = _full_patch(view, messages, layout)
            held = dict(patch["overrides"])
            self._last = _LastView(history, layout, view, held)
            patch["token"] = token
            return _with_prepend(patch, messages) if prepend else patch
        held, sent, dropped = _patch_step(last, layout, view, messages, unchanged)
        self._last = _LastView(history, layout, view, held)
        patch = {"length": length, "keep_from": layout.start, "overrides": sent, "token": token}
        if layout.skip:
            patch["skip"] = [list(run) for run in layout.skip]
        if base is None or base != previous:
            patch["overrides"] = [[origin, held[origin]] for origin in sorted(held)]
        else:
            patch |= {"reuse": True, "base": previous, "dropped": dropped}
        return _with_prepend(patch, messages) if prepend else patch

    def of_mapped(
        self,
        mapped: MappedHistory,
        view: Sequence[Message],
        deleted_range: Sequence[int] | None,
        base: bytes | None = None,
        missing_result: str = DEFAULT_NOTICES.missing_result,
        dropped: Sequence[Sequence[int]] = (),
    ) -> dict[str, Any] | None:
        """The dialect's view of an internal view as an ``order`` patch on the history.

        ``order`` lists the history indices the view is made of, as
        ``[start, end)`` runs in view order; ``overrides`` replaces an index by
        one message, or by a list of messages (a rebuilt message with the ones
        the view added before it; an empty list drops it). A rebuilt message
        the view holds after another one (a repair put another message's
        results between its blocks) is sent in the override of the message
        before it, so every index stands in one run at most. None when the
        view holds no message of the history at all, or runs the ordered form
        cannot carry (send it whole).

        Raises:
            ValueError: ``view`` is not a view of ``mapped``'s internal form.
        """
        patch = self._ordered(mapped, view, deleted_range, missing_result, dropped)
        return None if patch is None else self._reuse(patch, base)

    def _ordered(
        self,
        mapped: MappedHistory,
        view: Sequence[Message],
        deleted_range: Sequence[int] | None,
        missing_result: str,
        dropped: Sequence[Sequence[int]] = (),
    ) -> dict[str, Any] | None:
        """The ``order`` patch of the view's pieces, resumed from the last view's where the
        pieces were (the first pieces of a view built on the last one are that one's)."""
        source = mapped.source
        made = mapped.pieces(view, deleted_range, missing_result, dropped)
        pieces = made.pieces
        # Snapshots are taken where pieces of this view begin (older marks have theirs).
        marks = made.new_marks
        state = _OrderState()
        first = 0
        resumed = made.resumed
        held = self._resume
        if (
            resumed is not None
            and held is not None
            and held.mapped is mapped
            and held.serial == resumed[0]
        ):
            snapshot = held.state.snapshots.get(resumed[1])
            if snapshot is not None:
                # Snapshots past this one are of places that are no marks now: never read.
                state = held.state
                state.restore(snapshot)
                first = resumed[1]
        cached = made.kept
        for place in range(first, len(pieces)):
            if place == cached:
                # What follows (the last kept-out messages) is not kept: go on with a copy.
                self._resume = _Resume(mapped, made.serial, state)
                state = state.copy()
            elif place in marks:
                state.snapshots[place] = state.snapshot()
            state.add(pieces[place], source)
        if cached == len(pieces):
            self._resume = _Resume(mapped, made.serial, state)
        return state.patch(source)

    def _reuse(self, patch: dict[str, Any], base: bytes | None) -> dict[str, Any]:
        """Send only the overrides the caller does not hold from the patch it names.

        An ``order`` patch shares its first override entries with the last one
        (:class:`_OrderState` keeps them as they are made), so only the
        entries after the first that is another object are compared.
        """
        overrides: list[list[Any]] = patch["overrides"]
        last, self._last = self._last, _LastOrder(overrides)
        token = self._next_token()
        previous, self._token = self._token, token
        patch["token"] = token
        if not isinstance(last, _LastOrder) or base is None or base != previous:
            return patch
        sent = last.overrides
        # Entries are unique by index in each list: the shared ones are in neither tail.
        shared = first_other(sent, overrides)
        before = dict(sent[shared:])
        after = overrides[shared:]
        patch["overrides"] = [item for item in after if before.get(item[0]) is not item[1]]
        if "origins" in patch:  # the caller holds those of the overrides it holds
            sending = {item[0] for item in patch["overrides"]}
            marked = [item for item in patch.pop("origins") if item[0] in sending]
            if marked:
                patch["origins"] = marked
        patch["reuse"] = True
        patch["base"] = previous
        now = {item[0] for item in after}
        patch["dropped"] = [origin for origin in before if origin not in now]
        return patch

    def _next_token(self) -> bytes:
        self._serial += 1
        return self._serial.to_bytes(8, "big") + self._salt


def _view_layout(
    view: list[Any],
    length: int,
    deleted_range: list[int] | None,
    gaps: Sequence[Sequence[int]] | None,
) -> _Layout | None:
    """The layout of a view of a history of ``length``, or None when it is not one.

    Views are the first pair plus everything after the range (less the deleted
    set ``gaps``, when given); an op that answers with the history unchanged
    (nothing optimised) gives a view without a range.
    """
    start = keep_from(deleted_range)
    if gaps:
        layout = _Layout(length, start, gaps)
        if len(view) == layout.size and layout.skip:
            return layout
    for candidate in (start, 2):
        if len(view) == view_length(length, candidate):
            return _Layout(length, candidate)
    return None


class _LastView:
    """The last ``keep_from`` patch made: its history, layout, view and overrides."""

    __slots__ = ("held", "history", "layout", "view")

    def __init__(
        self, history: History, layout: _Layout, view: list[Any], held: dict[int, Any]
    ) -> None:
        self.history = history
        self.layout = layout
        self.view = view
        self.held = held


class _LastOrder:
    """The last ``order`` patch made: its full overrides, as made."""

    __slots__ = ("overrides",)

    def __init__(self, overrides: list[list[Any]]) -> None:
        self.overrides = overrides


_ABSENT = object()


def _patch_step(
    last: _LastView, layout: _Layout, view: list[Any], messages: list[Any], unchanged: int
) -> tuple[dict[int, Any], list[list[Any]], list[int]]:
    """The overrides of ``view`` worked out from the last patch's: (all, new or changed, dropped).

    ``layout`` maps positions as the last one did (the same key). A view
    position needs a look only when its message is another object than
    in the last view, when it is past that view's end, or when the history
    message it stands for changed since (index ``>= unchanged``): everywhere
    else the message and the history's are the objects they were, so it is an
    override exactly when it was one, with the same message.
    """
    old_view, old_held = last.view, last.held
    # View position to history index: one shift past the first pair in a view without
    # gaps (the usual case, worked out inline), through the runs in one with gaps.
    shift = layout.start - 2
    if layout.skip:
        origin: Callable[[int], int] | None = layout.origin
        tail = layout.position_from(unchanged)
    else:
        origin = None
        tail = unchanged if unchanged < 2 else max(unchanged - shift, 2)
    tail = min(tail, len(view), len(old_view))
    # The positions before the tail whose message is another object (a C-speed scan).
    moved = other_places(view, old_view, stop=tail)
    held = dict(old_held)
    sent: list[list[Any]] = []
    dropped: list[int] = []
    for place in itertools.chain(moved, range(tail, len(view))):
        index = (place if place < 2 else place + shift) if origin is None else origin(place)
        message = view[place]
        if message is messages[index]:
            if held.pop(index, _ABSENT) is not _ABSENT:
                dropped.append(index)
        else:
            held[index] = message
            if old_held.get(index) is not message:
                sent.append([index, message])
    # The last view's end, by the last view's own layout: its runs reach the history it was
    # made of (the same start and gaps, but another length than this one's).
    old_end = last.layout.origin(len(old_view) - 1) + 1 if old_view else 0
    for index in range(len(messages), old_end):
        # History messages past the new end (it was cut back): their overrides go.
        if held.pop(index, _ABSENT) is not _ABSENT:
            dropped.append(index)
    return held, sent, dropped


def _with_prepend(patch: dict[str, Any], messages: list[Any]) -> dict[str, Any]:
    """``patch`` with each override that only puts blocks first sent as a ``prepend`` entry."""
    overrides: list[list[Any]] = []
    prepend: list[list[Any]] = []
    for origin, message in patch["overrides"]:
        blocks = prepended_blocks(messages[origin], message)
        if blocks is None:
            overrides.append([origin, message])
        else:
            prepend.append([origin, blocks])
    patch["overrides"] = overrides
    patch["prepend"] = prepend
    return patch


_Snapshot = tuple[int, int, int, int, tuple[Message, ...]]


class _Resume:
    """The ``order`` form's state after the last view's pieces (of ``mapped``, made as
    ``serial``), with snapshots where its pieces began: the next view resumes from one."""

    __slots__ = ("mapped", "serial", "state")

    def __init__(self, mapped: MappedHistory, serial: int, state: _OrderState) -> None:
        self.mapped = mapped
        self.serial = serial
        self.state = state


class _OrderState:
    """An ``order`` patch as it is built from the view's pieces, piece by piece.

    The overrides are kept as they are made (``items``, valid up to ``fresh``),
    so a patch of a view built on the last one costs its new overrides, not all.
    ``origins`` holds, for each override (same keys, same order), the history
    index each of its messages stands for (None: one the view added).
    """

    __slots__ = (
        "fresh",
        "items",
        "keys",
        "order",
        "origins",
        "pending",
        "replaced",
        "snapshots",
    )

    def __init__(self) -> None:
        self.order: list[list[int]] = []
        self.replaced: dict[int, list[Message]] = {}
        self.origins: dict[int, list[int | None]] = {}
        self.keys: list[int] = []  # of ``replaced``, in its order
        self.items: list[list[Any]] = []  # the overrides of ``keys[:fresh]``
        self.fresh = 0
        self.pending: list[Message] = []
        self.snapshots: dict[int, _Snapshot] = {}

    def copy(self) -> _OrderState:
        twin = _OrderState()
        twin.order = [list(run) for run in self.order]
        twin.replaced = {index: list(held) for index, held in self.replaced.items()}
        twin.origins = {index: list(held) for index, held in self.origins.items()}
        twin.keys = list(self.keys)
        twin.items = list(self.items)  # items are replaced, never changed: shared
        twin.fresh = self.fresh
        twin.pending = list(self.pending)
        twin.snapshots = dict(self.snapshots)
        return twin

    def snapshot(self) -> _Snapshot:
        replaced = self.replaced
        last = replaced[self.keys[-1]] if replaced else []
        return (
            len(self.order),
            self.order[-1][1] if self.order else 0,
            len(replaced),
            len(last),
            tuple(self.pending),
        )

    def restore(self, snapshot: _Snapshot) -> None:
        runs, run_end, count, last_len, pending = snapshot
        del self.order[runs:]
        if self.order:
            self.order[-1][1] = run_end
        replaced, keys, origins = self.replaced, self.keys, self.origins
        while len(replaced) > count:
            replaced.popitem()
            origins.popitem()
        del keys[count:]
        if replaced:
            del replaced[keys[-1]][last_len:]
            del origins[keys[-1]][last_len:]
        self.fresh = min(self.fresh, max(count - 1, 0))
        self.pending[:] = pending

    def _set(self, index: int, held: list[Message], origins: list[int | None]) -> None:
        keys = self.keys
        if index in self.replaced:
            self.fresh = min(self.fresh, keys.index(index))
        else:
            keys.append(index)
            self.fresh = min(self.fresh, len(keys) - 1)
        self.replaced[index] = held
        self.origins[index] = origins

    def add(self, piece: tuple[int | None, Message | None, int], source: list[Message]) -> None:
        index, message, end = piece
        order, replaced, pending = self.order, self.replaced, self.pending
        if index is None:
            pending.append(message)  # type: ignore[arg-type]
            return
        if message is None:  # a run of the history's own messages
            if pending:
                self._set(index, [*pending, source[index]], [*_added(pending), index])
                pending.clear()
            if order and order[-1][1] == index:
                order[-1][1] = end
            else:
                order.append([index, end])
            return
        stands = index
        held = replaced.get(index)
        if held is not None and order and order[-1][1] != index + 1:
            # A rebuilt message comes back after another one (a repair put another
            # message's results between its blocks): an index stands once in the
            # order, so what follows goes after the last message placed, in its override.
            index = order[-1][1] - 1
            held = replaced.get(index)
            if held is None:
                self._set(
                    index, [source[index], *pending, message], [index, *_added(pending), stands]
                )
                pending.clear()
                return
        if held is not None and order and order[-1][1] == index + 1:
            held.extend((*pending, message))
            self.origins[index].extend((*_added(pending), stands))
            keys = self.keys
            place = len(keys) - 1 if keys[-1] == index else keys.index(index)
            self.fresh = min(self.fresh, place)
        else:
            if order and order[-1][1] == index:
                order[-1][1] = index + 1
            else:
                order.append([index, index + 1])
            if pending or message is not source[index]:
                self._set(index, [*pending, message], [*_added(pending), index])
        pending.clear()

    def patch(self, source: list[Message]) -> dict[str, Any] | None:
        """The patch so far, in lists of its own (this state goes on changing)."""
        order, replaced, keys, items = self.order, self.replaced, self.keys, self.items
        del items[self.fresh :]
        for index in keys[len(items) :]:
            held = replaced[index]
            items.append([index, held[0] if len(held) == 1 else list(held)])
        self.fresh = len(items)
        overrides = list(items)
        marked = {
            index: stands
            for index, stands in self.origins.items()
            if len(stands) > 1 and not _by_default(index, stands)
        }
        if self.pending:  # messages added after the last one of the history
            if not order:
                return None
            last = order[-1][1] - 1
            added = [last, [*replaced.get(last, [source[last]]), *self.pending]]
            marked[last] = [*self.origins.get(last, [last]), *_added(self.pending)]
            if keys and keys[-1] == last:
                overrides[-1] = added
            else:
                if last in replaced:
                    overrides = [item for item in overrides if item[0] != last]
                overrides.append(added)
        runs = [list(run) for run in order]
        if len(runs) > 1 and runs_overlap(runs):
            return None  # not a view the ordered form can carry: send it whole
        patch = {"length": len(source), "keep_from": 0, "order": runs, "overrides": overrides}
        if marked:
            patch["origins"] = [[index, marked[index]] for index in sorted(marked)]
        return patch


def _added(messages: list[Message]) -> list[int | None]:
    """The origins of messages a view added: none."""
    return [None] * len(messages)


def _by_default(index: int, origins: list[int | None]) -> bool:
    """Whether a list override's messages stand as a patch without ``origins`` says: the
    last one for ``index``, the ones before it added by the view."""
    return origins[-1] == index and origins.count(None) == len(origins) - 1
