"""Views mapped back to the history they were made of: what each view message is, and
what changed it (a notice, a replaced file read, a repaired tool pair, a summary).

In the Cline dialect a view follows from the range (SPEC.md §4): :func:`view_state`.
In another dialect the daemon's patch gives each view message's history index
(:meth:`ctxwin.client.Task.view_origins`), and :class:`NativeViews` only says what
changed a rebuilt message. The overlay the daemon's ``inspect`` returns is read
here too (:func:`parse_updates`, :func:`parse_sources`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxwin.proto import (
    SUMMARY_MARK,
    DeletedRange,
    OverlayFormatError,
    Update,
    edit_label,
    read_overlay,
    update_text,
)

from ..._errors import BadReplyError
from .._dialects import leaves

NOTICE_EDIT = 0
"""The edit type of a notice (SPEC.md §1): every other edit replaces a file read."""

NOTICE = "notice"
FILE_READ = "file read replaced"
SHORTENED = "shortened"
"""A message too large for the budget, shortened by ``auto`` (docs/STRATEGIES.md)."""
STUBBED = "result stubbed"
"""A tool result ``auto`` replaced by a stub naming the call."""
REPAIRED = "tool pair repaired"
SUMMARY = "summary"
"""A message the view carries a summary of removed turns in (docs/SUMMARIES.md)."""


@dataclass(slots=True)
class ViewState:
    """What a turn's view does to the history: its range and the messages it alters.

    Attributes:
        deleted_range: the range in effect.
        altered: history index -> index into :attr:`ReplayReport.variants` of
            the message as the view holds it, for each message the view changed.
        order: a native dialect's view in its own order, one ``(history index,
            variant)`` per message sent: variant None for the history message
            as it is, else the index into :attr:`ReplayReport.variants` of a
            message the view rebuilt or added; None in the Cline dialect, whose
            view follows from the range.
        merged: history index -> the history index of the rebuilt message it
            went into, for each message a native view sends merged into
            another (calls split over consecutive messages, sent as one).
        dropped: a Cline view's runs ``[first, last]`` (inclusive history
            indices, ascending) after the range that it leaves out too: the
            ``auto`` strategy's deleted set (docs/STRATEGIES.md).
    """

    deleted_range: DeletedRange
    altered: dict[int, int] = field(default_factory=dict)
    order: list[tuple[int, int | None]] | None = None
    merged: dict[int, int] = field(default_factory=dict)
    dropped: list[list[int]] = field(default_factory=list)

    def sent(self, index: int, end: int) -> bool:
        """Whether a Cline view of the history's first ``end`` messages sends message
        ``index`` (as it is or altered): the first pair, and what the range and the
        deleted set leave."""
        if index >= end:
            return False
        if index < 2:
            return True
        if self.deleted_range and index <= self.deleted_range[1]:
            return False
        return not any(first <= index <= last for first, last in self.dropped)

    def removed(self, end: int) -> list[int]:
        """The history indices below ``end`` a native view neither sends, rebuilds nor
        merges into another message."""
        order = self.order or []
        sent = {index for index, variant in order if variant is None} | set(self.altered)
        sent.update(self.merged)
        return [index for index in range(end) if index not in sent]


@dataclass(slots=True)
class Variant:
    """A message as a view altered it.

    Attributes:
        index: its history index (a message the view added: the index of the
            call it answers, else of the history message it stands before).
        kinds: what changed it (:data:`NOTICE`, :data:`FILE_READ`, :data:`REPAIRED`).
        message: the message as sent.
        added: the view added it; it stands for no history message.
    """

    index: int
    kinds: list[str]
    message: dict[str, Any]
    added: bool = False


def text_of(block: Any) -> str | None:
    """The text the overlay edits in a block (SPEC.md §1), or None."""
    if not isinstance(block, Mapping):
        return None
    if block.get("type") == "text" and isinstance(block.get("text"), str):
        return str(block["text"])
    inner = block.get("content")
    if block.get("type") == "tool_result" and isinstance(inner, list) and inner:
        first = inner[0]
        if isinstance(first, Mapping) and first.get("type") == "text":
            text = first.get("text")
            return text if isinstance(text, str) else None
    return None


def original_text(history: Sequence[Mapping[str, Any]], index: int, block: int) -> str | None:
    """The text of block ``block`` of history message ``index`` as the file holds it (what
    an overlay update of that block replaces), or None: no such block, or none with text."""
    content = history[index].get("content") if 0 <= index < len(history) else None
    blocks = content if isinstance(content, list) else []
    return text_of(blocks[block]) if 0 <= block < len(blocks) else None


Overlay = dict[tuple[int, int], tuple[int, list[str]]]
"""(message, block) -> (edit type, texts of its updates in order)."""


def set_text(block: Mapping[str, Any], text: str) -> dict[str, Any]:
    """A copy of ``block`` with its text (as :func:`text_of` reads it) replaced."""
    copy = dict(block)
    if copy.get("type") == "text":
        copy["text"] = text
    elif text_of(block) is not None:
        inner = list(copy["content"])
        inner[0] = {**inner[0], "text": text}
        copy["content"] = inner
    return copy


def with_overlay(message: Mapping[str, Any], index: int, overlay: Overlay) -> dict[str, Any]:
    """A copy of message ``index`` with the latest overlay text of each block (SPEC.md §4)."""
    copy = dict(message)
    content = message.get("content")
    if not isinstance(content, list):
        return copy
    blocks = list(content)
    added = None
    for (at, block), (_, texts) in overlay.items():
        if at == index and texts and block < 0:
            added = {"type": "text", "text": texts[-1]}  # a notice the view puts in a new block
        elif at == index and texts and block < len(blocks) and isinstance(blocks[block], Mapping):
            blocks[block] = set_text(blocks[block], texts[-1])
    if added is not None:
        place = 0
        while place < len(blocks) and blocks[place].get("type") in (
            "thinking",
            "redacted_thinking",
        ):
            place += 1
        blocks.insert(place, added)
    copy["content"] = blocks
    return copy


Sources = dict[tuple[int, int], tuple[int, str]]
"""(internal message, block) -> (history index, the block's text before any edit)."""


def parse_sources(sources: Any) -> Sources:
    """``inspect``'s ``sources`` (a task of a native dialect) by overlay key.

    Raises:
        BadReplyError: ``sources`` is not a list of ``[message, block,
            history index, text]``.
    """
    if not isinstance(sources, list):
        raise BadReplyError("inspect: sources must be a list")
    found: Sources = {}
    for position, item in enumerate(sources):
        if not (
            isinstance(item, list)
            and len(item) == 4
            and all(isinstance(n, int) and not isinstance(n, bool) for n in item[:3])
            and isinstance(item[3], str)
        ):
            raise BadReplyError(
                f"inspect: sources[{position}] must be [message, block, history index, text]"
            )
        found[item[0], item[1]] = (item[2], item[3])
    return found


def parse_updates(updates: Any) -> Overlay:
    """The on-disk overlay (SPEC.md §1) as (message, block) -> (edit type, texts).

    Raises:
        BadReplyError: ``updates`` does not have the on-disk shape.
    """
    try:
        edits = read_overlay(updates)
    except OverlayFormatError as exc:
        raise BadReplyError(f"inspect: unreadable overlay: {exc}") from None

    def texts(updates: list[Update]) -> list[str]:
        return [text for text in map(update_text, updates) if text is not None]

    return {
        (message.message, block): (message.edit_type, texts(updates))
        for message in edits
        for block, updates in message.blocks.items()
    }


def view_state(
    history: Sequence[Mapping[str, Any]],
    view: Sequence[Mapping[str, Any]],
    deleted_range: DeletedRange,
    overlay: Overlay,
    variants: list[Variant],
    origins: Sequence[int | None] | None = None,
) -> ViewState:
    """How ``view`` (a view of ``history``, SPEC.md §4) differs from the history.

    ``origins`` is the history index of each view message, as the daemon
    gives it (a patch's, ``inspect``'s); the runs after the range it skips are
    the view's :attr:`ViewState.dropped`. Without it (an older daemon) the
    view is taken to be the first pair and everything after the range.
    Messages the view changed are added to ``variants`` once each (an equal
    variant of the same message is reused).

    Raises:
        ValueError: ``origins`` do not fit the view.
    """
    state = ViewState(None if deleted_range is None else list(deleted_range))
    keep = deleted_range[1] + 1 if deleted_range and len(view) >= 2 else 2
    if origins is not None:
        indices = [at for at in origins if at is not None]
        if len(indices) != len(view) or any(b <= a for a, b in itertools.pairwise(indices)):
            raise ValueError("view origins do not fit the view")
        state.dropped = [[a + 1, b - 1] for a, b in itertools.pairwise(indices[2:]) if b > a + 1]
    for position, message in enumerate(view):
        if origins is not None:
            index = indices[position]
        else:
            index = position if position < 2 else keep + position - 2
        original = history[index] if index < len(history) else None
        if message is original or message == original or original is None:
            continue
        kinds: list[str] = []
        edits = {
            edit_kind(edit, texts[-1])
            for (at, _), (edit, texts) in overlay.items()
            if at == index and texts
        }
        if edits:
            kinds.extend(kind for kind in _EDIT_KINDS if kind in edits)
        bare = _without_summary(message)
        if bare is not message:
            kinds.append(SUMMARY)
        if (not edits and bare is message) or with_overlay(original, index, overlay) != bare:
            kinds.append(REPAIRED)
        for number, variant in enumerate(variants):
            if variant.index == index and variant.message == message:
                state.altered[index] = number
                break
        else:
            variants.append(Variant(index, kinds, dict(message)))
            state.altered[index] = len(variants) - 1
    return state


class NativeViews:
    """Views of a native dialect's history mapped back to it, turn by turn.

    Each view message comes with its origin, as the daemon's patch gives it
    (:meth:`ctxwin.client.Task.view_origins`): the history index it stands for,
    or None for a message the view added. What is left to say here is what
    changed a message: one equal to its history message is sent as it is;
    another with an origin is a variant of that message, rebuilt by the view,
    whose kinds (a notice, a replaced read, a summary, a repaired pair) follow
    from the overlay texts it holds (:meth:`_kinds`); one without is a message
    the view added (a missing result, a notice of its own), shown with the
    message holding the call it answers, else before the next history message
    sent (:meth:`_stands`). History messages neither sent nor rebuilt are the
    ones the view removed.

    Args:
        history: the whole conversation, in its dialect.
        variants: where new variants go (shared by every view mapped).
    """

    def __init__(self, history: Sequence[Mapping[str, Any]], variants: list[Variant]) -> None:
        self.history = history
        self.variants = variants
        self._leaf_cache: dict[int, tuple[set[str], set[str]]] = {}
        self._by_call: dict[str, list[int]] | None = None

    def _leaves_of(self, index: int) -> tuple[set[str], set[str]]:
        found = self._leaf_cache.get(index)
        if found is None:
            found = self._leaf_cache[index] = _leaves_pair(self.history[index])
        return found

    def _holding(self, call: str) -> list[int]:
        if self._by_call is None:
            self._by_call = {}
            for index in range(len(self.history)):
                for name in self._leaves_of(index)[0]:
                    self._by_call.setdefault(name, []).append(index)
        return self._by_call.get(call, [])

    def state(
        self,
        view: Sequence[Mapping[str, Any]],
        origins: Sequence[int | None],
        end: int,
        deleted_range: DeletedRange,
        overlay: Overlay,
        sources: Sources,
    ) -> ViewState:
        """The view of the history's first ``end`` messages, mapped back to them.

        Args:
            view: the messages sent.
            origins: the history index each of them stands for (None: added by the view).
            end: how many history messages the view was made of.
            deleted_range: the range in effect (internal indices).
            overlay: the task's overlay now (:func:`parse_updates`).
            sources: where each overlay block came from (:func:`parse_sources`).

        Raises:
            ValueError: ``origins`` do not fit ``view`` and ``end``.
        """
        if len(origins) != len(view) or any(at is not None and not 0 <= at < end for at in origins):
            raise ValueError("view origins do not fit the view or the history")
        marks = _overlay_marks(overlay, sources)
        state = ViewState(None if deleted_range is None else list(deleted_range), order=[])
        assert state.order is not None
        for position, (message, at) in enumerate(zip(view, origins, strict=True)):
            if at is None:
                stands = self._stands(message, origins, position, end)
                kinds = self._kinds(message, None, marks)
                state.order.append((stands, self._variant(stands, kinds, message, added=True)))
            elif message is self.history[at] or message == self.history[at]:
                state.order.append((at, None))
            else:
                number = self._variant(at, self._kinds(message, at, marks), message, added=False)
                state.altered[at] = number
                state.order.append((at, number))
        self._merges(state, view, origins, end)
        return state

    def _merges(
        self,
        state: ViewState,
        view: Sequence[Mapping[str, Any]],
        origins: Sequence[int | None],
        end: int,
    ) -> None:
        """The history messages a rebuilt view message holds besides its own: later ones of
        its role whose every id (their calls) it carries, not sent otherwise (split calls
        the view sends as one message, docs/DIALECTS.md)."""
        assert state.order is not None
        sent = {index for index, _ in state.order}
        for message, at in zip(view, origins, strict=True):
            if at is None or at not in state.altered:
                continue
            ids = _leaves_pair(message)[0] - self._leaves_of(at)[0]
            role = self.history[at].get("role")
            for index in sorted({i for name in ids for i in self._holding(name)}):
                own = self._leaves_of(index)[0]
                if (
                    at < index < end
                    and index not in sent
                    and index not in state.merged
                    and own
                    and own <= ids
                    and self.history[index].get("role") == role
                ):
                    state.merged[index] = at

    def _kinds(self, message: Mapping[str, Any], at: int | None, marks: _Marks) -> list[str]:
        """What changed ``message``, rebuilt from history message ``at`` or added (None):
        the overlay texts it holds that its history message does not (a notice, a replaced
        read), a summary; a repair when it holds none of them, or other calls or results."""
        ids, texts = _leaves_pair(message)
        if at is None:
            return _marked(texts, marks, None) + _summary_kind(texts) or [REPAIRED]
        original_ids, original_texts = self._leaves_of(at)
        kinds = _marked(texts - original_texts, marks, at) + _summary_kind(texts)
        if not kinds or ids != original_ids:
            kinds.append(REPAIRED)
        return kinds

    def _stands(
        self, message: Mapping[str, Any], origins: Sequence[int | None], position: int, end: int
    ) -> int:
        """Where a message the view added is shown: with the message holding the call it
        answers, else before the next history message sent."""
        ids = _leaves_pair(message)[0]
        calls = sorted(i for name in ids for i in self._holding(name) if i < end)
        return calls[0] if calls else _next_origin(origins, position)

    def _variant(
        self, index: int, kinds: list[str], message: Mapping[str, Any], added: bool
    ) -> int:
        """The number of this variant, added to the list unless an equal one is there."""
        for number, variant in enumerate(self.variants):
            if variant.index == index and variant.added == added and variant.message == message:
                return number
        self.variants.append(Variant(index, kinds, dict(message), added))
        return len(self.variants) - 1


_Marks = dict[int | None, list[tuple[str, str]]]
"""The overlay's latest texts and their kinds, by the history index they stand in (None: a
notice block of its own, from no history message)."""


def _overlay_marks(overlay: Overlay, sources: Sources) -> _Marks:
    marks: _Marks = {}
    for key, (edit_type, updates) in overlay.items():
        if updates:
            kind = edit_kind(edit_type, updates[-1])
            marks.setdefault(sources[key][0] if key in sources else None, []).append(
                (updates[-1], kind)
            )
    return marks


_EDIT_KINDS = (NOTICE, FILE_READ, SHORTENED, STUBBED)


def edit_kind(edit_type: int, text: str) -> str:
    """What an overlay edit made of a message: a notice, a replaced file read, or a result
    ``auto`` shortened or stubbed (told by its text, ``ctxwin.proto.edit_label``)."""
    if edit_type == NOTICE_EDIT:
        return NOTICE
    label = edit_label(edit_type, text)
    return SHORTENED if label == "shortened" else STUBBED if label == "stubbed" else FILE_READ


def _next_origin(origins: Sequence[int | None], position: int) -> int:
    """The history index of the first message after ``position`` that has one, else of
    the last before it (0 when none has)."""
    after = (at for at in origins[position + 1 :] if at is not None)
    before = (at for at in reversed(origins[:position]) if at is not None)
    return next(after, next(before, 0))


def _leaves_pair(message: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    ids: set[str] = set()
    texts: set[str] = set()
    leaves(message, ids, texts)
    return ids, texts


def _without_summary(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """``message`` without the summary a view put into it (``message`` itself when none)."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    kept = [block for block in content if not _is_summary(block)]
    if len(kept) == len(content):
        return message
    return {**message, "content": kept}


def _is_summary(block: Any) -> bool:
    text = block.get("text") if isinstance(block, Mapping) else None
    return isinstance(text, str) and text.startswith(SUMMARY_MARK)


def _summary_kind(texts: set[str]) -> list[str]:
    return [SUMMARY] if any(text.startswith(SUMMARY_MARK) for text in texts) else []


def _marked(texts: set[str], marks: _Marks, index: int | None) -> list[str]:
    """The kinds of the overlay texts (of history message ``index``, or of none) among ``texts``."""
    found = {kind for at in {index, None} for text, kind in marks.get(at, ()) if text in texts}
    return [kind for kind in _EDIT_KINDS if kind in found]


def keeps_content(original: Mapping[str, Any], sent: Mapping[str, Any]) -> bool:
    """Whether ``sent`` holds every block of ``original`` (a repair that only added or moved).

    A tool pair repair that adds a missing-result stub, or puts results first,
    leaves the recorded run's content in the request: its usage still
    describes ctxwin's view, give or take the stub's few tokens.
    """
    before, after = original.get("content"), sent.get("content")
    if not isinstance(before, list) or not isinstance(after, list):
        return before == after
    return all(block in after for block in before)
