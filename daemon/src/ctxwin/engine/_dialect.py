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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._blocks import Block, Message
from ._view import KnownPairs, find_repairs, keep_from

SRC = "_src"
"""Key of an internal block: the history index of the message it came from."""
PART = "_part"
"""Key of an internal block: which part of that message it stands for (per dialect)."""
USER = "user"
ASSISTANT = "assistant"


class DialectError(ValueError):
    """A history the task's dialect cannot carry; the message names the place (``messages[3]``)."""


@dataclass(frozen=True, slots=True)
class Mapped:
    """One message of a dialect in the internal form.

    Attributes:
        role: ``user`` or ``assistant``; None for a kept-out message (system).
        blocks: the internal blocks, each with :data:`SRC` and :data:`PART`.
        calls: whether it holds tool calls (see :attr:`Dialect.calls_end_turn`).
    """

    role: str | None
    blocks: list[Block]
    calls: bool = False


KEPT_OUT = Mapped(None, [])


class Dialect:
    """How one dialect's messages map to the internal form and back.

    Attributes:
        name: the dialect's wire name.
        calls_end_turn: a message with calls must be answered by the next
            message (OpenAI Chat, Gemini), so it ends its internal message.
        new_inside: blocks the view adds (a missing result, a notice) go inside
            the neighbouring message (Anthropic, Gemini) rather than into
            messages of their own (OpenAI Chat, Responses).
    """

    name = ""
    calls_end_turn = False
    new_inside = False

    def map_message(self, message: Any, index: int, history: MappedHistory) -> Mapped:
        """The internal form of history message ``index``.

        Raises:
            DialectError: the message is not one this dialect can carry.
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

    def holds_results(self, message: Message) -> bool:
        """Whether ``message`` answers calls (no kept-out message may come before it)."""
        return False

    def joins(self, previous: Mapped, mapped: Mapped) -> bool:
        """Whether a message of the same role as the one before joins its internal message."""
        return not (self.calls_end_turn and previous.calls and mapped.role == ASSISTANT)


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
        "_rebuilds",
        "calls",
        "dialect",
        "internal",
        "mapped",
        "members",
        "source",
        "systems",
    )

    def __init__(self, dialect: Dialect, messages: Sequence[Any] = ()) -> None:
        self.dialect = dialect
        self.source: list[Message] = []
        self.mapped: list[Mapped] = []
        self.internal = KnownPairs(strict=True)
        self.members: list[list[int]] = []  # per internal message, its history indices
        self.systems: list[int] = []  # history indices of kept-out messages
        # Tool call id -> (name, history index), for dialects whose results need the name.
        self.calls: dict[str, tuple[str, int]] = {}
        # id(changed internal view message) -> (it, its rebuilt messages): a view built
        # on the last one shares its changed messages, so they are rebuilt once.
        self._rebuilds: dict[int, tuple[Message, list[tuple[int | None, Message]]]] = {}
        self.sync(messages)

    def __len__(self) -> int:
        return len(self.source)

    def sync(self, messages: Sequence[Any]) -> None:
        """Take the caller's whole history; only what differs from the last one is mapped.

        Raises:
            DialectError: a message the dialect cannot carry (nothing is changed then
                but the prefix before it).
        """
        held = self.source
        limit = min(len(held), len(messages))
        # The first message that is not the same object (a C-speed scan), then equal ones.
        common = next(
            itertools.compress(itertools.count(), map(operator.is_not, held, messages)), limit
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
        try:
            for offset in range(common, len(messages)):
                dirty = min(dirty, self._append(messages[offset], offset))
        finally:
            self._settle(dirty)  # what was mapped stands, up to a message that failed

    def _settle(self, dirty: int) -> None:
        """Tell the internal list that messages from ``dirty`` on changed."""
        internal = self.internal
        internal.changed_from(dirty)
        first_pair = max(dirty - 1, 0)
        repairs = internal.repairs
        while repairs and repairs[-1] >= first_pair:
            repairs.pop()
        repairs.extend(find_repairs(internal, first_pair, True))

    def _cut(self, length: int) -> int:
        """Drop history messages from ``length`` on; returns the first internal index changed."""
        members = self.members
        count = len(members)
        if length >= len(self.source):
            return count
        # Every internal message holding a member >= length goes, and an empty one
        # standing last; the remaining members of a partly cut one are placed again.
        group = count
        while group > 0 and (not members[group - 1] or members[group - 1][-1] >= length):
            group -= 1
        again = [index for index in members[group] if index < length] if group < count else []
        del self.internal[group:]
        del members[group:]
        if self.calls and len(self.source) > length:
            self.calls = {key: call for key, call in self.calls.items() if call[1] < length}
        del self.source[length:]
        del self.mapped[length:]
        systems = self.systems
        while systems and systems[-1] >= length:
            systems.pop()
        for index in again:
            self._place(index)
        return group

    def _append(self, message: Any, index: int) -> int:
        mapped = self.dialect.map_message(message, index, self)
        self.source.append(message)
        self.mapped.append(mapped)
        return self._place(index)

    def _place(self, index: int) -> int:
        """Put history message ``index`` into the internal sequence; returns the index changed."""
        mapped = self.mapped[index]
        role = mapped.role
        if role is None:
            self.systems.append(index)
            return len(self.internal)
        internal = self.internal
        members = self.members
        last = len(members) - 1
        first = last + 1
        if last >= 0 and internal[last]["role"] == role and members[last]:
            if self.dialect.joins(self.mapped[members[last][-1]], mapped):
                members[last].append(index)
                content = internal[last]["content"]
                internal[last] = {"role": role, "content": [*content, *mapped.blocks]}
                return last
            # A call with no result: the view answers it in an empty user message.
            members.append([])
            internal.append({"role": USER, "content": []})
        members.append([index])
        internal.append({"role": role, "content": list(mapped.blocks)})
        return first

    def history_index(self, internal_index: int) -> int:
        """The history index of an internal message's first member (-1 for an empty one)."""
        found = self.members[internal_index]
        return found[0] if found else -1

    def view(self, view: Sequence[Message], deleted_range: Sequence[int] | None) -> list[Message]:
        """The dialect's view of an internal view of :attr:`internal` under ``deleted_range``.

        Kept-out messages all come back, in their order among the others;
        those the cut moves next to a call come after its results.
        """
        source = self.source
        out: list[Message] = []
        for index, message, end in self._pieces(view, deleted_range):
            if message is None:
                out.extend(source[index:end])
            else:
                out.append(message)
        return out

    def patch(
        self, view: Sequence[Message], deleted_range: Sequence[int] | None
    ) -> dict[str, Any] | None:
        """The dialect's view as a patch on the history (``ctxwin.proto.apply_view_patch``).

        ``order`` lists the history indices the view is made of, as
        ``[start, end)`` runs in view order; ``overrides`` replaces an index by
        one message, or by a list of messages (a rebuilt message with the ones
        the view added before it; an empty list drops it). None when the view
        holds no message of the history at all (send it whole).
        """
        source = self.source
        order: list[list[int]] = []
        replaced: dict[int, list[Message]] = {}
        pending: list[Message] = []
        for index, message, end in self._pieces(view, deleted_range):
            if index is None:
                pending.append(message)  # type: ignore[arg-type]
                continue
            if message is None:  # a run of the history's own messages
                if pending:
                    replaced[index] = [*pending, source[index]]
                    pending = []
                if order and order[-1][1] == index:
                    order[-1][1] = end
                else:
                    order.append([index, end])
                continue
            held = replaced.get(index)
            if held is not None and order and order[-1][1] == index + 1:
                held.extend((*pending, message))
            else:
                if order and order[-1][1] == index:
                    order[-1][1] = index + 1
                else:
                    order.append([index, index + 1])
                if pending or message is not source[index]:
                    replaced[index] = [*pending, message]
            pending = []
        if pending:  # messages added after the last one of the history
            if not order:
                return None
            last = order[-1][1] - 1
            replaced[last] = [*replaced.get(last, [source[last]]), *pending]
        overrides: list[list[Any]] = [
            [index, messages[0] if len(messages) == 1 else messages]
            for index, messages in replaced.items()
        ]
        return {"length": len(source), "keep_from": 0, "order": order, "overrides": overrides}

    def _pieces(
        self, view: Sequence[Message], deleted_range: Sequence[int] | None
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
        kept: list[Message] = [*internal[:2], *internal[start:]] if count >= 2 else list(internal)
        if len(kept) != len(view):
            raise ValueError(f"a view of {len(view)} messages is not one of this history")
        changed = list(itertools.compress(range(len(view)), map(operator.is_not, view, kept)))
        source = self.source
        systems = self.systems
        members = self.members
        holds_results = self.dialect.holds_results
        rebuilds = self._rebuilds
        if len(rebuilds) > 2 * count + 64:
            rebuilds.clear()  # rebuilt messages of views long gone
        out: list[tuple[int | None, Message | None, int]] = []
        waiting = 0  # systems[:waiting] are out

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
                    waiting = bisect.bisect_left(systems, results, waiting)
                    first = results
                flush(first)
            if first < end:
                out.append((first, None, end))
                waiting = bisect.bisect_left(systems, end, waiting)

        offset = 0  # view position of the span's first internal message
        for low, high in spans:
            k = low
            while k < high:
                position = offset + k - low
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
                first = next((members[g][0] for g in range(k, stop) if members[g]), -1)
                if first >= 0:
                    last = next(members[g][-1] for g in range(stop - 1, k - 1, -1) if members[g])
                    run(first, last + 1)
                k = stop
            offset += high - low
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
        return out
