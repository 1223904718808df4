"""A mapped history's view back: the engine's internal view in the dialect's form.

The rule: map each changed internal message back; runs of untouched ones
are slices of the caller's history. Kept-out messages (system, developer)
come back in their order among the others (after the results that answer a
call), and a call the view leaves answered by nothing but kept-out messages
(at the end, or among the newest message's calls) gets its missing result
before them.

:func:`view_pieces` is that rule, walked from the first view position.
:class:`ViewResume` is the same walk resumed where the last view's pieces
stop holding: it keeps the last view's pieces with a mark where each view
message begins, and a view built on the last one (the engine's view cache
says how many of its first messages are that one's) costs its changed
messages, not its length. A property test holds the two equal.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ctxwin.proto import first_other, other_places

from ._blocks import Block, Message
from ._dialect import ASSISTANT, SRC, USER, Dialect, MappedLike
from ._view import Spans, ViewCache, keep_from, span_index, span_position, view_spans

Piece = tuple[int | None, Message | None, int]
"""``(start, None, end)`` a run of history messages ``[start, end)`` as they are;
``(index, message, 0)`` a rebuilt message standing for history message ``index``, or
one the view added (index None)."""
Rebuilt = list[tuple[int | None, Message]]
"""A changed internal message as dialect messages, each with its history index."""


class ViewSource(MappedLike, Protocol):
    """What a view back reads of a mapped history (``_mapped.MappedHistory`` has it).

    Attributes:
        dialect: the history's dialect.
        members: per internal message, its history indices.
        systems: history indices of kept-out messages.
        merges: internal messages holding calls of several history messages.
        cache: the internal list's view cache.
    """

    dialect: Dialect
    members: list[list[int]]
    systems: list[int]
    merges: list[int]
    cache: ViewCache


class Pieces(NamedTuple):
    """A view's pieces as :meth:`~._mapped.MappedHistory.pieces` made them.

    Attributes:
        pieces: the view in :data:`Piece` s.
        serial: which view's pieces these are (one more each resumable view; 0
            for pieces made without a :class:`ViewResume`).
        kept: how many first pieces the next view may resume from (the
            last kept-out messages come after them).
        new_marks: the places (piece counts) where pieces of this view
            begin that no earlier view's did.
        resumed: ``(serial, pieces kept)`` when the first pieces are those of
            view ``serial``; None when made afresh.
    """

    pieces: list[Piece]
    serial: int
    kept: int
    new_marks: set[int]
    resumed: tuple[int, int] | None


Mark = tuple[int, int, int]
"""Where the pieces of one view position begin: ``(view position, pieces before it,
kept-out messages out before it)``. Made for every position walked (a plain tuple: a
named one costs more to make), bisected by position."""


def view_pieces(
    mapped: ViewSource,
    view: Sequence[Message],
    deleted_range: Sequence[int] | None,
    missing_result: str,
    dropped: Sequence[Sequence[int]] = (),
) -> Pieces:
    """The view's pieces, made by the plain walk from its first position."""
    start = view_start(mapped, view, deleted_range, dropped)
    changed = _with_merges(mapped, _changed(mapped, view, start, 0), start, 0, len(view))
    out: list[Piece] = []

    def rebuild(message: Message) -> Rebuilt:
        return rebuilt(mapped, message)

    kept = _walk(mapped, view, start, 0, changed, out, 0, None, rebuild, missing_result)
    return Pieces(out, 0, kept, set(), None)


def view_start(
    mapped: ViewSource,
    view: Sequence[Message],
    deleted_range: Sequence[int] | None,
    dropped: Sequence[Sequence[int]] = (),
) -> Spans:
    """The internal runs the view holds after its first pair (:func:`~._view.view_spans`;
    one empty run at the history's length when it has fewer than two messages).

    Raises:
        ValueError: ``view`` is not one of ``mapped.internal`` under ``deleted_range`` and
            ``dropped``.
    """
    count = len(mapped.internal)
    if count < 2:
        spans: Spans = ((count, count, 2 - count),)
        expected = count
    else:
        spans = view_spans(count, keep_from(deleted_range), dropped)
        expected = 2 + sum(high - low for low, high, _ in spans)
    if len(view) != expected:
        raise ValueError(f"a view of {len(view)} messages is not one of this history")
    return spans


def _changed(mapped: ViewSource, view: Sequence[Message], spans: Spans, scan: int) -> list[int]:
    """View positions from ``scan`` on whose message is not the internal one kept there
    (a C-speed scan)."""
    internal = mapped.internal
    if len(internal) < 2:
        kept: Sequence[Message] = internal[scan:]
    elif scan >= 2 and len(spans) == 1:
        kept = internal[scan - 2 + spans[0][0] :]
    else:
        kept = [*internal[:2], *itertools.chain(*(internal[a:b] for a, b, _ in spans))][scan:]
    return list(other_places(view[scan:], kept, counted_from=scan))


def _with_merges(
    mapped: ViewSource, changed: list[int], spans: Spans, low: int, length: int
) -> list[int]:
    """``changed`` with the view positions from ``low`` on of internal messages whose calls
    the dialect sends as one message (they are rebuilt, changed or not)."""
    if not mapped.merges:
        return changed
    merged = [k if k < 2 else span_position(spans, k) for k in mapped.merges]
    return sorted({*changed, *(p for p in merged if p is not None and low <= p < length)})


def _walk(
    mapped: ViewSource,
    view: Sequence[Message],
    runs: Spans,
    resume: int,
    changed: list[int],
    out: list[Piece],
    waiting: int,
    marks: list[Mark] | None,
    rebuild: Callable[[Message], Rebuilt],
    missing_result: str,
) -> int:
    """Make the view's pieces from position ``resume`` on, after ``out`` (the pieces so
    far, with ``mapped.systems[:waiting]`` out); a mark per position into ``marks`` when
    kept. Each position in ``changed`` (ascending) is rebuilt; untouched internal messages
    up to the next changed one are one run. Returns how many pieces come before the last
    kept-out messages (and a missing result put before them)."""
    systems, source, members = mapped.systems, mapped.source, mapped.members
    holds_results = mapped.dialect.holds_results

    def flush(before: int) -> None:
        """Put out the kept-out messages before history index ``before``."""
        nonlocal waiting
        stop = bisect.bisect_left(systems, before, waiting)
        for place in range(waiting, stop):
            out.append((systems[place], source[systems[place]], 0))
        waiting = max(waiting, stop)

    def run(first: int, end: int) -> None:
        """Put out history messages ``[first, end)``, kept-out ones among them after the
        results that open the run."""
        nonlocal waiting
        if waiting < len(systems) and systems[waiting] < first:
            results = first
            while results < end and holds_results(source[results]):
                results += 1
            if results > first:  # kept-out messages come after the results
                out.append((first, None, results))
                first = results
            flush(first)
        if first < end:
            out.append((first, None, end))
            waiting = bisect.bisect_left(systems, end, waiting)

    count = len(mapped.internal)
    spans = [(0, count)] if count < 2 else [(0, 2), *((low, high) for low, high, _ in runs)]
    offset = 0  # view position of the span's first internal message
    for low, high in spans:
        if offset + high - low <= resume:
            offset += high - low
            continue
        k = max(low, resume - offset + low)
        while k < high:
            position = offset + k - low
            if marks is not None:
                marks.append((position, len(out), waiting))
            at = bisect.bisect_left(changed, position)
            if at < len(changed) and changed[at] == position:
                for index, item in rebuild(view[position]):
                    if index is not None and not holds_results(item):
                        flush(index)
                    out.append((index, item, 0))
                k += 1
                continue
            stop = high if at == len(changed) else min(high, changed[at] - offset + low)
            first, last = k, stop - 1  # skip empty ones (unanswered calls)
            while first < stop and not members[first]:
                first += 1
            if first < stop:
                while not members[last]:
                    last -= 1
                run(members[first][0], members[last][-1] + 1)
            k = stop
        offset += high - low
    kept = len(out)
    answered: set[str] = set()
    if view and view[-1]["role"] == ASSISTANT and count:
        # Kept-out messages among the newest message's calls (a dialect that sends each
        # call as its own message, a system one after a call left unanswered): the calls
        # before them are no longer the newest, and are answered before them.
        kept, answered = _answer_before_kept_out(
            mapped, view[-1], members[count - 1], out, kept, missing_result
        )
    if waiting < len(systems) and view:
        # The history ends with kept-out messages after a call: no longer the newest
        # message, the call is answered, before them, like any other call.
        ids = [
            b["id"]
            for b in view[-1]["content"]
            if b.get("type") == "tool_use" and b["id"] not in answered
        ]
        if ids and view[-1]["role"] == ASSISTANT:
            missing: list[Block] = [
                {"type": "tool_result", "tool_use_id": tool_id, "content": missing_result}
                for tool_id in ids
            ]
            out.extend((None, item, 0) for item in mapped.dialect.fresh(USER, missing, mapped))
    flush(len(source))
    return kept


def _answer_before_kept_out(
    mapped: ViewSource,
    newest: Message,
    members: Sequence[int],
    out: list[Piece],
    kept: int,
    missing_result: str,
) -> tuple[int, set[str]]:
    """Put the missing results of the newest message's calls that come before the last
    kept-out message among its history messages just before that message, in ``out``.

    Returns:
        How many pieces come before the results put in (``kept`` when none were), and the
        ids of the calls they answer.
    """
    systems = mapped.systems
    content = newest.get("content")
    if len(members) < 2 or not isinstance(content, list):
        return kept, set()
    inside = bisect.bisect_left(systems, members[-1]) - 1
    if inside < 0 or systems[inside] <= members[0]:
        return kept, set()
    last = systems[inside]  # the last kept-out message among the newest message's
    ids = [
        block["id"]
        for block in content
        if block.get("type") == "tool_use" and block.get(SRC, last) < last
    ]
    # The piece holding the kept-out message: a run of history messages through it, or
    # the message itself (after a rebuilt one); the results go right before it. A
    # dialect that sends the calls as one message puts it out after them (not yet).
    at = len(out) if ids else 0
    while at:
        at -= 1
        start, message, end = out[at]
        if start is not None and start <= last:
            break
    else:
        return kept, set()
    if message is None and start < last < end:
        split: list[Piece] = [(start, None, last), (last, None, end)]
        out[at : at + 1] = split
        at += 1
    elif start != last:
        return kept, set()
    missing: list[Block] = [
        {"type": "tool_result", "tool_use_id": tool_id, "content": missing_result}
        for tool_id in ids
    ]
    out[at:at] = [(None, item, 0) for item in mapped.dialect.fresh(USER, missing, mapped)]
    return min(kept, at), set(ids)


@dataclass(slots=True)
class _LastView:
    """The last view a :class:`ViewResume` made pieces of."""

    key: tuple[object, ...]  # its runs (the last one's end aside)
    copy: list[Message]  # a copy of it (the caller may change the list)
    kept: int  # how many of its pieces came before the last kept-out messages
    serial: int
    view: Sequence[Message]  # the list itself (the engine's view cache names it)


class ViewResume:
    """The last view's pieces and marks, so that the next view resumes at its first change.

    The pieces and marks are cut back and extended by the next view, not copied.
    Changed messages of a view built on the last one are that one's objects, so
    their rebuilt messages are kept by object and made once.
    """

    __slots__ = ("_last", "_marks", "_out", "_rebuilds", "_serial")

    def __init__(self) -> None:
        self._last: _LastView | None = None
        self._out: list[Piece] = []
        self._marks: list[Mark] = []
        self._serial = 0
        # id(changed internal view message) -> (it, its rebuilt messages).
        self._rebuilds: dict[int, tuple[Message, Rebuilt]] = {}

    def reset(self) -> None:
        """Start the next view afresh (the history was cut: kept-out messages may go, and
        messages rebuilt from the ones cut with them)."""
        self._last = None
        self._rebuilds.clear()

    def pieces(
        self,
        mapped: ViewSource,
        view: Sequence[Message],
        deleted_range: Sequence[int] | None,
        missing_result: str,
        dropped: Sequence[Sequence[int]] = (),
    ) -> Pieces:
        """The view's pieces, the walk resumed at the last mark before its first change."""
        start = view_start(mapped, view, deleted_range, dropped)
        rebuilds = self._rebuilds
        if len(rebuilds) > 2 * len(mapped.internal) + 64:
            rebuilds.clear()  # rebuilt messages of views long gone
        resume, scan, waiting, resumed = self._resume_at(mapped, view, start)
        if resumed is None:
            self._out, self._marks = [], []
        new_marks = len(self._marks)
        changed = _changed(mapped, view, start, scan)
        if resume < scan and resume < len(view):
            kept_at = mapped.internal[span_index(start, resume)]
            if view[resume] is not kept_at:
                changed.insert(0, resume)
        if mapped.merges:
            changed = _with_merges(mapped, changed, start, resume, len(view))

        def rebuild(message: Message) -> Rebuilt:
            held = rebuilds.get(id(message))
            if held is None or held[0] is not message:
                held = rebuilds[id(message)] = (message, rebuilt(mapped, message))
            return held[1]

        out, marks = self._out, self._marks
        kept = _walk(
            mapped, view, start, resume, changed, out, waiting, marks, rebuild, missing_result
        )
        self._serial += 1
        self._last = _LastView(_key(start), list(view), kept, self._serial, view)
        return Pieces(out, self._serial, kept, {mark[1] for mark in marks[new_marks:]}, resumed)

    def _resume_at(
        self, mapped: ViewSource, view: Sequence[Message], spans: Spans
    ) -> tuple[int, int, int, tuple[int, int] | None]:
        """``(resume, scan, waiting, resumed)``: the view position to walk from, the first
        one to compare with the internal messages, the kept-out messages out before it, and
        ``(serial, pieces kept)`` of the last view resumed from (None: none, from 0)."""
        last = self._last
        if last is None or last.key != _key(spans):
            return 0, 0, 0, None
        previous = last.copy
        seam = mapped.cache.seam
        scan = 0
        if seam is not None and seam[1] is view and seam[0] is last.view:
            # The engine built this view on the last one: its first messages are that one's.
            same = min(seam[2], len(previous), len(view))
            # And the internal messages before the seam are the same objects too (a sync
            # lowers the seam to its first changed message): positions before it that
            # were no changed ones are none now.
            scan = same
        else:
            same = first_other(previous, view)
        # The last piece that began at or before the first changed position (marks are in
        # view order, one per position; no mark's other fields reach these).
        marks, out = self._marks, self._out
        at = bisect.bisect_right(marks, (same, len(out) + 1, len(mapped.systems) + 1)) - 1
        if at < 0:
            return 0, 0, 0, None
        resume, kept_pieces, waiting = marks[at]
        del out[kept_pieces:]
        del marks[at:]
        # The last mark at or before ``same`` begins a run going past ``same`` or a
        # changed message followed by no other mark: no changed position after it and
        # before ``same``.
        return resume, max(scan, resume + 1), waiting, (last.serial, kept_pieces)


def _key(spans: Spans) -> tuple[object, ...]:
    """What a view's runs must share with the last view's for the walk to resume: all but
    the last run's end, which grows with the history."""
    return (*spans[:-1], spans[-1][::2])


def rebuilt(mapped: ViewSource, message: Message) -> Rebuilt:
    """A changed internal view message as dialect messages, each with its history index."""
    dialect = mapped.dialect
    role: str = message["role"]
    runs: list[tuple[int | None, list[Block]]] = []  # (history index, blocks), by source
    inside = dialect.new_inside
    for item in message.get("content") or ():
        index = item.get(SRC)
        if runs and (runs[-1][0] == index or (index is None and inside)):
            runs[-1][1].append(item)  # new blocks join the message before them
        elif runs and inside and runs[-1][0] is None:
            runs[-1] = (index, [*runs[-1][1], item])  # or, first in the message, the next
        elif len(runs) > 1 and runs[-1][0] is None and runs[-2][0] == index:
            # New blocks inside one message of a dialect that keeps them apart: before it.
            added = runs.pop()
            runs[-1][1].append(item)
            runs.insert(len(runs) - 1, added)
        else:
            runs.append((index, [item]))
    out: Rebuilt = []
    for index, blocks in runs:
        if index is None:
            out.extend((None, item) for item in dialect.fresh(role, blocks, mapped))
            continue
        own = mapped.mapped[index].blocks
        if len(blocks) == len(own) and all(a is b for a, b in zip(blocks, own, strict=True)):
            out.append((index, mapped.source[index]))
            continue
        made = dialect.rebuild(mapped.source[index], index, role, blocks, mapped)
        out.extend((index, item) for item in made)
    return dialect.merged(out) if dialect.merges_calls else out
