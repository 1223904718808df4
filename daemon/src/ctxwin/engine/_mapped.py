"""A history of a native dialect kept in the engine's internal form as it grows.

The engine runs on SPEC.md §1's messages (roles ``user``/``assistant``,
``text``/``tool_use``/``tool_result`` blocks). A :class:`MappedHistory` keeps
a history of another dialect (OpenAI Chat, Anthropic, Responses, Gemini) in
that form, incrementally as it grows, remembering where every internal block
came from; :meth:`MappedHistory.view` maps the engine's view back
(:mod:`._mapped_view`). The rules are in docs/DIALECTS.md:

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

import sys
from collections.abc import Sequence
from typing import Any

from ctxwin.proto import first_other

from ._blocks import Message
from ._dialect import ASSISTANT, USER, Dialect, DialectError, Mapped
from ._mapped_view import Pieces, ViewResume, view_pieces
from ._notices import DEFAULT_NOTICES
from ._view import ViewCache, pair_needs_repair

_NEVER = sys.maxsize


class MappedHistory:
    """A dialect history and its internal form, kept in step as it grows.

    ``internal`` is the list the engine runs on; its indices are the ones the
    deleted range and the overlay of a dialect task count (docs/DIALECTS.md).
    """

    __slots__ = (
        "_call_at",
        "_fresh",
        "cache",
        "calls",
        "dialect",
        "internal",
        "mapped",
        "members",
        "merges",
        "resume",
        "source",
        "systems",
    )

    def __init__(
        self, dialect: Dialect, messages: Sequence[Any] = (), *, resume: bool = True
    ) -> None:
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
        # The last view's pieces, for the next view built on it (None: every view is
        # mapped back from its first message).
        self.resume: ViewResume | None = ViewResume() if resume else None
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
        common = first_other(held, messages, skip, limit)
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
        if self.resume is not None:
            self.resume.reset()  # kept-out messages may go: views start afresh
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
        dropped: Sequence[Sequence[int]] = (),
    ) -> list[Message]:
        """The dialect's view of an internal view of :attr:`internal` under ``deleted_range``
        (and the deleted set ``dropped``).

        Kept-out messages all come back, in their order among the others;
        those the cut moves next to a call come after its results. A call
        followed by nothing but kept-out messages is answered before them
        with ``missing_result`` (the task's notice).
        """
        source = self.source
        out: list[Message] = []
        made = self.pieces(view, deleted_range, missing_result, dropped)
        for index, message, end in made.pieces:
            if message is None:
                out.extend(source[index:end])
            else:
                out.append(message)
        return out

    def view_with_origins(
        self,
        view: Sequence[Message],
        deleted_range: Sequence[int] | None,
        missing_result: str = DEFAULT_NOTICES.missing_result,
    ) -> tuple[list[Message], list[int | None]]:
        """:meth:`view`, with the history index each of its messages stands for (None for
        one the view added), made by the plain walk (no view resumed, none kept)."""
        out: list[Message] = []
        origins: list[int | None] = []
        for index, message, end in view_pieces(self, view, deleted_range, missing_result).pieces:
            if message is None:
                assert index is not None
                out.extend(self.source[index:end])
                origins.extend(range(index, end))
            else:
                out.append(message)
                origins.append(index)
        return out, origins

    def pieces(
        self,
        view: Sequence[Message],
        deleted_range: Sequence[int] | None,
        missing_result: str = DEFAULT_NOTICES.missing_result,
        dropped: Sequence[Sequence[int]] = (),
    ) -> Pieces:
        """The dialect's view of an internal view in pieces (what :meth:`view` joins), with
        where they resume from the last view's (``ctxwin.engine.PatchMaker`` builds its
        ``order`` patch from them, resumed likewise)."""
        if self.resume is None:
            return view_pieces(self, view, deleted_range, missing_result, dropped)
        return self.resume.pieces(self, view, deleted_range, missing_result, dropped)
