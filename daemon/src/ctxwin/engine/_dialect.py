"""One engine for every message dialect: a history mapped into the internal form and back.

The engine runs on SPEC.md §1's messages (roles ``user``/``assistant``,
``text``/``tool_use``/``tool_result`` blocks). A :class:`MappedHistory` keeps
a history of another dialect (OpenAI Chat, Anthropic, Responses, Gemini) in
that form, incrementally as it grows, remembering where every internal block
came from; :meth:`MappedHistory.view` maps the engine's view back. The rules
are in docs/DIALECTS.md:

- kept-out messages (system, developer) are not in the internal sequence;
  they are never cut and come back in their place;
- consecutive messages of one role form one internal message, so internal
  indices stay stable as the history grows by appending;
- a dialect whose call must be answered by the very next message ends the
  internal message at a message with calls, and puts an empty internal user
  message between it and a following assistant message (a call without a
  result), where the view fills in the missing results;
- internal messages the view did not change come back as the caller's own
  messages; only changed ones are rebuilt, in the dialect's form, and within
  them every part the engine did not change is the caller's own object.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

from ctxwin.proto import CLINE

from ._blocks import Block, Message
from ._notices import DEFAULT_NOTICES
from ._view import ViewCache, keep_from, pair_needs_repair

SRC = "_src"
"""Key of an internal block: the history index of the message it came from."""
PART = "_part"
"""Key of an internal block: which part of that message it stands for (per dialect)."""
USER = "user"
ASSISTANT = "assistant"
_NEVER = sys.maxsize


class DialectError(ValueError):
    """A history the task's dialect cannot carry; the message names the place (``messages[3]``)."""


class Mapped(NamedTuple):
    """One message of a dialect in the internal form (a tuple: made for every message).

    Attributes:
        role: ``user`` or ``assistant``; None for a kept-out message (system).
        blocks: the internal blocks, each with :data:`SRC` and :data:`PART`.
        calls: whether it holds tool calls (see :attr:`Dialect.calls_end_turn`).
    """

    role: str | None
    blocks: list[Block]
    calls: bool = False


KEPT_OUT = Mapped(None, [])


class Pieces(NamedTuple):
    """A view's pieces as :meth:`MappedHistory.pieces` made them.

    Attributes:
        pieces: ``(start, None, end)`` a run of history messages ``[start,
            end)`` as they are; ``(index, message, 0)`` a rebuilt message
            standing for history message ``index``, or one the view added
            (index None).
        serial: which view's pieces these are (one more each view).
        kept: how many first pieces the next view may resume from (the
            last kept-out messages come after them).
        new_marks: the places (piece counts) where pieces of this view
            begin that no earlier view's did.
        resumed: ``(serial, pieces kept)`` when the first pieces are those of
            view ``serial``; None when made afresh.
    """

    pieces: list[tuple[int | None, Message | None, int]]
    serial: int
    kept: int
    new_marks: set[int]
    resumed: tuple[int, int] | None


class Dialect:
    """How one dialect's messages map to the internal form and back.

    Attributes:
        name: the dialect's wire name.
        field: the request field its history is named by in errors.
        native: its histories are mapped into the internal form
            (:class:`MappedHistory`) and their file reads are tool calls
            (``ReadRules``); false for :class:`ClineDialect`, whose history is
            the internal form itself, with Cline's text reads (SPEC.md).
        strict: results that answer no call of the message before are orphans
            wherever they stand, and the results a cut orphans are dropped
            after the overlay (an edit goes with its result) rather than
            before it as SPEC.md §4 step 3 says.
        calls_end_turn: a message with calls must be answered by the next
            message (OpenAI Chat, Gemini), so it ends its internal message.
        merges_calls: calls split over consecutive messages of one turn are sent
            as one message (OpenAI Chat: each message's calls must be answered
            right after it).
        new_inside: blocks the view adds (a missing result, a notice) go inside
            the neighbouring message (Anthropic, Gemini) rather than into
            messages of their own (OpenAI Chat, Responses).
    """

    name = ""
    field = "messages"
    native = True
    strict = True
    calls_end_turn = False
    new_inside = False
    merges_calls = False

    def map_message(self, message: Any, index: int, history: MappedHistory) -> Mapped:
        """The internal form of history message ``index``.

        Raises:
            DialectError: the message is not one this dialect can carry; its
                text names the place within the message (``.content[2] must
                be a map``), which :class:`MappedHistory` puts after the
                message's own (``messages[7]``), so that a message that maps
                builds no place names.
        """
        raise NotImplementedError

    def rebuild(
        self, source: Message, index: int, role: str, blocks: list[Block], history: MappedHistory
    ) -> list[Message]:
        """Message ``index`` rebuilt from what the view holds of it (changed or new blocks)."""
        raise NotImplementedError

    def fresh(self, role: str, blocks: list[Block], history: MappedHistory) -> list[Message]:
        """Messages for blocks the view added (missing results, a notice)."""
        raise NotImplementedError

    def merged(self, out: list[tuple[int | None, Message]]) -> list[tuple[int | None, Message]]:
        """A rebuilt internal message's messages with the calls of consecutive ones in one
        (``merges_calls``): each keeps its history index, a merged one the first's."""
        return out

    def holds_results(self, message: Message) -> bool:
        """Whether ``message`` answers calls (no kept-out message may come before it)."""
        return False

    def joins(self, previous: Mapped, mapped: Mapped) -> bool:
        """Whether a message of the same role as the one before joins its internal message."""
        return not (self.calls_end_turn and previous.calls and mapped.role == ASSISTANT)


class ClineDialect(Dialect):
    """SPEC.md's dialect: the internal form itself (an identity mapping), with Cline's
    file reads given as text and orphan results dropped as SPEC.md §4 says."""

    name = CLINE
    native = False
    strict = False


CLINE_DIALECT = ClineDialect()
"""The Cline dialect, every task's until it names another."""


def block(kind: str, index: int, part: object, **fields: Any) -> Block:
    """An internal block of ``kind`` for part ``part`` of history message ``index``."""
    return {"type": kind, **fields, SRC: index, PART: part}


def originals(history: MappedHistory, index: int) -> dict[object, Block]:
    """The internal blocks of message ``index`` by part."""
    return {item[PART]: item for item in history.mapped[index].blocks}


class MappedHistory:
    """A dialect history and its internal form, kept in step as it grows.

    ``internal`` is the list the engine runs on; its indices are the ones the
    deleted range and the overlay of a dialect task count (docs/DIALECTS.md).
    """

    __slots__ = (
        "_call_at",
        "_fresh",
        "_last",
        "_marks",
        "_new_marks",
        "_out",
        "_rebuilds",
        "_resumed",
        "_serial",
        "cache",
        "calls",
        "dialect",
        "internal",
        "mapped",
        "members",
        "merges",
        "source",
        "systems",
    )

    def __init__(self, dialect: Dialect, messages: Sequence[Any] = ()) -> None:
        self.dialect = dialect
        self.source: list[Message] = []
        self.mapped: list[Mapped] = []
        self.internal: list[Message] = []
        # The internal list's view cache, for views built from it (truncated_messages).
        self.cache = ViewCache(self.internal, dialect.strict)
        self.members: list[list[int]] = []  # per internal message, its history indices
        self.systems: list[int] = []  # history indices of kept-out messages
        # Tool call id -> (name, history index), for dialects whose results need the name.
        self.calls: dict[str, tuple[str, int]] = {}
        self._call_at: dict[Any, int] = {}  # tool call id -> internal index of its message
        # Internal messages holding calls of several history messages, ascending: sent as
        # one message in a dialect that answers each message's calls right after it.
        self.merges: list[int] = []
        # id(changed internal view message) -> (it, its rebuilt messages): a view built
        # on the last one shares its changed messages, so they are rebuilt once.
        self._rebuilds: dict[int, tuple[Message, list[tuple[int | None, Message]]]] = {}
        # The last view, for the next view that starts with the same messages: (range
        # start, a copy of the view, how many of ``_out`` came before the last flush,
        # serial, the view list itself). ``_out`` holds its pieces and ``_marks`` its marks,
        # a mark being (view position, pieces so far, kept-out messages out so far) where a
        # piece begins; both are cut back and extended by the next view, not copied.
        self._last: tuple[int, list[Message], int, int, Sequence[Message]] | None = None
        self._out: list[tuple[int | None, Message | None, int]] = []
        self._marks: list[tuple[int, int, int]] = []
        self._new_marks = 0  # _marks[_new_marks:] were made by the last view
        self._serial = 0  # of the last pieces made
        self._resumed: tuple[int, int] | None = None  # (serial, pieces kept) of the last resume
        self._fresh = _NEVER  # internal messages from here on are the running sync's own
        self.sync(messages)

    def __len__(self) -> int:
        return len(self.source)

    def sync(self, messages: Sequence[Any], unchanged: int = 0) -> None:
        """Take the caller's whole history; only what differs from the last one is mapped.

        ``unchanged``: how many first messages the caller knows to be the very
        objects of the last sync (a delta's ``base``), not scanned again.

        Raises:
            DialectError: a message the dialect cannot carry (nothing is changed then
                but the prefix before it).
        """
        held = self.source
        limit = min(len(held), len(messages))
        skip = min(unchanged, limit)
        # The first message that is not the same object (a C-speed scan over slices:
        # islice would step over the skipped prefix one by one), then equal ones.
        common = skip
        if skip < limit:
            common += next(
                itertools.compress(
                    itertools.count(),
                    map(operator.is_not, held[skip:limit], messages[skip:limit]),
                ),
                limit - skip,
            )
        while common < limit:
            mine, theirs = held[common], messages[common]
            if mine is not theirs:
                if mine != theirs:
                    break
                held[common] = theirs  # equal: views hand back the caller's object
            common += 1
        if common == len(held) == len(messages):
            return
        dirty = self._cut(common)
        map_message, place = self.dialect.map_message, self._place
        source, mapped = self.source, self.mapped
        try:
            for index in range(common, len(messages)):
                message = messages[index]
                try:
                    taken = map_message(message, index, self)
                except DialectError as exc:
                    raise DialectError(f"{self.dialect.field}[{index}]{exc}") from None
                source.append(message)
                mapped.append(taken)
                # Internal messages from ``dirty`` on are this sync's own: no view holds
                # them yet, so a message joining one is added to it in place.
                self._fresh = dirty
                changed = place(index, taken)
                if changed < dirty:
                    dirty = changed
                if taken.role is not None:
                    dirty = min(dirty, self._note_calls(taken))
        finally:
            self._fresh = _NEVER
            self._settle(dirty)  # what was mapped stands, up to a message that failed

    def _note_calls(self, taken: Mapped) -> int:
        """Note where the calls of a message just placed stand; for results that answer a
        call of an earlier turn than the one before them, the first internal message whose
        view that changes (the call's answer takes them), else ``_NEVER``."""
        here = len(self.internal) - 1
        call_at = self._call_at
        first = _NEVER
        for item in taken.blocks:
            kind = item.get("type")
            if kind == "tool_use":
                call_at[item.get("id")] = here
            elif kind == "tool_result":
                turn = call_at.get(item.get("tool_use_id"))
                if turn is not None and turn < here - 1:
                    first = min(first, turn + 1)
        return first

    def _settle(self, dirty: int) -> None:
        """Tell the internal list that messages from ``dirty`` on changed."""
        internal = self.internal
        self.cache.changed_from(dirty)
        first_pair = max(dirty - 1, 0)
        repairs = self.cache.repairs
        while repairs and repairs[-1] >= first_pair:
            repairs.pop()
        # Roles alternate in the internal form (one role's messages are one message), so
        # a pair opened by a user message is followed by an assistant one and needs no
        # repair: only pairs an assistant message opens are checked.
        strict = self.dialect.strict
        for index in range(first_pair, len(internal) - 1):
            message = internal[index]
            if message["role"] == ASSISTANT and pair_needs_repair(
                message, internal[index + 1], strict
            ):
                repairs.append(index)

    def _cut(self, length: int) -> int:
        """Drop history messages from ``length`` on; returns the first internal index changed."""
        members = self.members
        count = len(members)
        if length >= len(self.source):
            return count
        self._last = None  # kept-out messages may go: views start afresh
        # Every internal message holding a member >= length goes, and an empty one
        # standing last; the remaining members of a partly cut one are placed again.
        group = count
        while group > 0 and (not members[group - 1] or members[group - 1][-1] >= length):
            group -= 1
        again = [index for index in members[group] if index < length] if group < count else []
        del self.internal[group:]
        del members[group:]
        while self.merges and self.merges[-1] >= group:
            self.merges.pop()
        self._call_at = {key: at for key, at in self._call_at.items() if at < group}
        if self.calls and len(self.source) > length:
            self.calls = {key: call for key, call in self.calls.items() if call[1] < length}
        del self.source[length:]
        del self.mapped[length:]
        systems = self.systems
        while systems and systems[-1] >= length:
            systems.pop()
        for index in again:
            self._place(index, self.mapped[index])
            self._note_calls(self.mapped[index])
        return group

    def _place(self, index: int, mapped: Mapped) -> int:
        """Put history message ``index`` (``mapped``) into the internal sequence; returns the
        index changed."""
        role = mapped.role
        if role is None:
            self.systems.append(index)
            return len(self.internal)
        internal = self.internal
        members = self.members
        last = len(members) - 1
        first = last + 1
        held = internal[last] if last >= 0 else None
        if held is not None and held["role"] == role and members[last]:
            previous = self.mapped[members[last][-1]]
            if self.dialect.joins(previous, mapped):
                members[last].append(index)
                if self.dialect.merges_calls and previous.calls and mapped.calls:
                    merges = self.merges
                    if not merges or merges[-1] != last:
                        merges.append(last)
                if last >= self._fresh:
                    held["content"].extend(mapped.blocks)
                else:  # a message views may hold: replaced, never changed
                    internal[last] = {"role": role, "content": [*held["content"], *mapped.blocks]}
                return last
            # A call with no result: the view answers it in an empty user message.
            members.append([])
            internal.append({"role": USER, "content": []})
        members.append([index])
        internal.append({"role": role, "content": list(mapped.blocks)})
        return first

    def history_length(self, count: int) -> int:
        """How many first history messages the first ``count`` internal messages take (with
        the kept-out messages among them)."""
        members = self.members
        for index in range(count, len(members)):
            if members[index]:
                return members[index][0]
        return len(self.source)

    def history_index(self, internal_index: int) -> int:
        """The history index of an internal message's first member (-1 for an empty one)."""
        found = self.members[internal_index]
        return found[0] if found else -1

    def view(
        self,
        view: Sequence[Message],
        deleted_range: Sequence[int] | None,
        missing_result: str = DEFAULT_NOTICES.missing_result,
    ) -> list[Message]:
        """The dialect's view of an internal view of :attr:`internal` under ``deleted_range``.

        Kept-out messages all come back, in their order among the others;
        those the cut moves next to a call come after its results. A call
        followed by nothing but kept-out messages is answered before them
        with ``missing_result`` (the task's notice).
        """
        source = self.source
        out: list[Message] = []
        for index, message, end in self._pieces(view, deleted_range, missing_result):
            if message is None:
                out.extend(source[index:end])
            else:
                out.append(message)
        return out

    def pieces(
        self,
        view: Sequence[Message],
        deleted_range: Sequence[int] | None,
        missing_result: str = DEFAULT_NOTICES.missing_result,
    ) -> Pieces:
        """The dialect's view of an internal view in pieces (what :meth:`view` joins), with
        where they resume from the last view's (``ctxwin.engine.PatchMaker`` builds its
        ``order`` patch from them, resumed likewise)."""
        pieces = self._pieces(view, deleted_range, missing_result)
        assert self._last is not None
        return Pieces(
            pieces,
            self._last[3],
            self._last[2],
            {mark[1] for mark in self._marks[self._new_marks :]},
            self._resumed,
        )

    def _pieces(
        self, view: Sequence[Message], deleted_range: Sequence[int] | None, missing_result: str
    ) -> list[tuple[int | None, Message | None, int]]:
        """The dialect's view in pieces: ``(start, None, end)`` a run of history messages
        ``[start, end)`` as they are; ``(index, message, 0)`` a rebuilt message standing
        for history message ``index``, or one the view added (index None).

        Runs of internal messages the view did not change cost O(1) each, so
        a view of a long kept history costs its changed messages, not its length.
        """
        internal = self.internal
        count = len(internal)
        start = keep_from(deleted_range) if count >= 2 else count
        spans = [(0, count)] if count < 2 else [(0, 2), (start, count)]
        if len(view) != (count if count < 2 else 2 + max(count - start, 0)):
            raise ValueError(f"a view of {len(view)} messages is not one of this history")
        source = self.source
        systems = self.systems
        members = self.members
        holds_results = self.dialect.holds_results
        rebuilds = self._rebuilds
        if len(rebuilds) > 2 * count + 64:
            rebuilds.clear()  # rebuilt messages of views long gone
        waiting = 0  # systems[:waiting] are out
        resume = 0  # view position to start from
        last = self._last
        self._resumed = None
        out = self._out
        marks = self._marks
        resumed = False
        scan = 0  # view positions from here on are compared with the internal messages
        if last is not None and last[0] == start:
            previous = last[1]
            seam = self.cache.seam
            if seam is not None and seam[1] is view and seam[0] is last[4]:
                # The engine built this view on the last one: its first messages are that one's.
                same = min(seam[2], len(previous), len(view))
                # And the internal messages before the seam are the same objects too
                # (a sync lowers the seam to its first changed message): positions
                # before it that were no changed ones are none now.
                scan = same
            else:
                same = next(
                    itertools.compress(itertools.count(), map(operator.is_not, previous, view)),
                    min(len(previous), len(view)),
                )
            # The last piece that began at or before the first changed position (marks
            # are in view order, one per position; no mark's other fields reach these).
            at = bisect.bisect_right(marks, (same, len(out) + 1, len(systems) + 1)) - 1
            if at >= 0:
                resume, kept_pieces, waiting = marks[at]
                del out[kept_pieces:]
                del marks[at:]
                self._resumed = (last[3], kept_pieces)
                resumed = True
        if not resumed:
            out = self._out = []
            marks = self._marks = []
        # The last mark at or before ``same`` begins a run going past ``same`` or a
        # changed message followed by no other mark: no changed position after it and
        # before ``same``.
        scan = max(scan, resume + 1) if resumed else 0
        self._new_marks = len(marks)
        # View positions from ``resume`` on that are not the internal message kept there.
        if scan >= 2 and count >= 2:
            kept: Sequence[Message] = internal[scan - 2 + start :]
        else:
            kept = [*internal[:2], *internal[start:]] if count >= 2 else internal
            kept = kept[scan:]
        changed = list(
            itertools.compress(itertools.count(scan), map(operator.is_not, view[scan:], kept))
        )
        if resume < scan and resume < len(view):
            kept_at = internal[resume] if resume < 2 else internal[resume - 2 + start]
            if view[resume] is not kept_at:
                changed.insert(0, resume)
        if self.merges:
            # Messages whose calls the dialect sends as one message are rebuilt, changed or not.
            merged = [k if k < 2 else k - start + 2 for k in self.merges if k < 2 or k >= start]
            changed = sorted({*changed, *(p for p in merged if resume <= p < len(view))})

        def flush(before: int) -> None:
            nonlocal waiting
            stop = bisect.bisect_left(systems, before, waiting)
            for place in range(waiting, stop):
                out.append((systems[place], source[systems[place]], 0))
            waiting = max(waiting, stop)

        def run(first: int, end: int) -> None:
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

        offset = 0  # view position of the span's first internal message
        for low, high in spans:
            k = low
            if offset + high - low <= resume:
                offset += high - low
                continue
            k = max(low, resume - offset + low)
            while k < high:
                position = offset + k - low
                marks.append((position, len(out), waiting))
                at = bisect.bisect_left(changed, position)
                if at < len(changed) and changed[at] == position:
                    held = rebuilds.get(id(view[position]))
                    if held is None or held[0] is not view[position]:
                        held = (view[position], self._rebuilt(view[position]))
                        rebuilds[id(view[position])] = held
                    for index, item in held[1]:
                        if index is not None and not holds_results(item):
                            flush(index)
                        out.append((index, item, 0))
                    k += 1
                    continue
                # Untouched internal messages up to the next changed one: one run.
                stop = high if at == len(changed) else min(high, changed[at] - offset + low)
                low_group, high_group = k, stop - 1  # skip empty ones (unanswered calls)
                while low_group < stop and not members[low_group]:
                    low_group += 1
                if low_group < stop:
                    while not members[high_group]:
                        high_group -= 1
                    run(members[low_group][0], members[high_group][-1] + 1)
                k = stop
            offset += high - low
        self._serial += 1
        self._last = (start, list(view), len(out), self._serial, view)
        if waiting < len(systems) and view:
            # The history ends with kept-out messages after a call: no longer the newest
            # message, the call is answered, before them, like any other call.
            ids = [b["id"] for b in view[-1]["content"] if b.get("type") == "tool_use"]
            if ids and view[-1]["role"] == ASSISTANT:
                missing: list[Block] = [
                    {"type": "tool_result", "tool_use_id": tool_id, "content": missing_result}
                    for tool_id in ids
                ]
                out.extend((None, item, 0) for item in self.dialect.fresh(USER, missing, self))
        flush(len(source))
        return out

    def _rebuilt(self, message: Message) -> list[tuple[int | None, Message]]:
        """A changed internal view message as dialect messages, each with its history index."""
        role: str = message["role"]
        runs: list[tuple[int | None, list[Block]]] = []  # (history index, blocks), by source
        inside = self.dialect.new_inside
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
        out: list[tuple[int | None, Message]] = []
        for index, blocks in runs:
            if index is None:
                out.extend((None, item) for item in self.dialect.fresh(role, blocks, self))
                continue
            own = self.mapped[index].blocks
            if len(blocks) == len(own) and all(a is b for a, b in zip(blocks, own, strict=True)):
                out.append((index, self.source[index]))
                continue
            rebuilt = self.dialect.rebuild(self.source[index], index, role, blocks, self)
            out.extend((index, item) for item in rebuilt)
        return self.dialect.merged(out) if self.dialect.merges_calls else out
