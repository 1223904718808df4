"""The view sent to the model: range, overlay and tool pairing applied (SPEC.md §4)."""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._blocks import Block, Message, text_of, with_text
from ._notices import DEFAULT_NOTICES, Notices
from ._optimize import MessageFacts
from ._overlay import Overlay
from ._summary import Summary, place_summary

FIRST_REMOVABLE = 2
_LEADING = ("opaque", "thinking", "redacted_thinking")
"""Blocks a new text block goes after (reasoning stays first in its message)."""
NEW_TEXT_BLOCK = -1
"""The block index of an update that adds a text block (for a message with no text to edit)."""


def keep_from(deleted_range: Sequence[int] | None) -> int:
    """The first history index after the deleted range.

    A range that ends before message 1 hides nothing: the first pair is always
    in the view and never repeated.
    """
    if not deleted_range:
        return FIRST_REMOVABLE
    return max(deleted_range[1] + 1, FIRST_REMOVABLE)


def view_length(length: int, start: int) -> int:
    """How many messages the view of a history of ``length`` holds when it keeps the first
    pair and the messages from ``start`` (:func:`keep_from`) on."""
    return length if length < 2 else 2 + max(length - start, 0)


Spans = tuple[tuple[int, int, int], ...]
"""The history runs a view holds after its first pair: ``(low, high, offset)``, history
indices ``low <= i < high`` at view position ``i + offset``, in order."""


def view_spans(length: int, start: int, dropped: Sequence[Sequence[int]] = ()) -> Spans:
    """The runs of a view that keeps the first pair, the messages from ``start`` on and
    none of the inclusive ranges ``dropped`` (ascending, disjoint; docs/STRATEGIES.md),
    but the message at ``start`` itself, which is always sent."""
    spans: list[tuple[int, int, int]] = []
    position = 2
    low = start
    for first, last in dropped:
        # The first message after the range is always sent: it is the one a strict
        # provider needs to be a user message (the range ends on an assistant message).
        first = max(first, start + 1)
        if last < first:
            continue
        high = min(first, length)
        if high > low:
            spans.append((low, high, position - low))
            position += high - low
        low = max(low, last + 1)
        if low >= length:
            break
    if low < length or not spans:
        spans.append((low, max(low, length), position - low))
    return tuple(spans)


def spans_length(spans: Spans) -> int:
    """How many messages the view of ``spans`` holds after its first pair."""
    return sum(high - low for low, high, _ in spans)


def span_position(spans: Spans, index: int) -> int | None:
    """The view position of history index ``index`` (>= 2), or None when it is not sent."""
    for low, high, offset in spans:
        if low <= index < high:
            return index + offset
    return None


def span_index(spans: Spans, position: int) -> int:
    """The history index at view position ``position`` (positions 0 and 1 are their own)."""
    if position < 2:
        return position
    for _, high, offset in spans:
        if position < high + offset:
            return position - offset
    return position - spans[-1][2]


def apply_overlay(message: Message, overlay_entry: Any) -> Message:
    """A copy of ``message`` with each block's latest text update applied (SPEC.md §4 step 4)."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    blocks: list[Block] | None = None
    added: Block | None = None
    for block_index, updates in overlay_entry.blocks.items():
        if not updates:
            continue
        latest = updates[-1]
        if latest[1] != "text":
            continue
        if block_index == NEW_TEXT_BLOCK:
            added = {"type": "text", "text": latest[2][0]}
            continue
        if not 0 <= block_index < len(content):
            continue
        if blocks is None:
            blocks = list(content)
        blocks[block_index] = with_text(blocks[block_index], latest[2][0])
    if added is not None:
        # After the leading opaque parts (reasoning), which must stay first.
        blocks = list(content) if blocks is None else blocks
        place = 0
        while place < len(blocks) and blocks[place].get("type") in _LEADING:
            place += 1
        blocks.insert(place, added)
    if blocks is None:
        return message
    return {**message, "content": blocks}


def _tool_use_ids(message: Message) -> list[str]:
    content = message.get("content")
    if message.get("role") != "assistant" or not isinstance(content, list):
        return []
    ids: list[str] = []
    for block in content:
        if block.get("type") == "tool_use":
            tool_id = block.get("id")
            if isinstance(tool_id, str) and tool_id:
                ids.append(tool_id)
    return ids


def _result_id(block: Block) -> str | None:
    if block.get("type") != "tool_result":
        return None
    tool_use_id = block.get("tool_use_id")
    return tool_use_id if isinstance(tool_use_id, str) and tool_use_id else None


def repair_tool_results(
    ids: list[str],
    message: Message,
    notices: Notices,
    elsewhere: Mapping[str, Block] | None = None,
    as_text: Iterable[str] = (),
) -> Message:
    """The user message after a tool_use turn, with its results first and in order.

    ``elsewhere`` (every dialect but Cline's): results of these calls that the
    view holds in other messages, where they answer nothing and are dropped;
    a call this message does not answer takes its result from there rather
    than the missing-result text. Returns ``message`` itself when it already
    pairs (SPEC.md §4 step 5). A call in ``as_text`` (whose result this
    message gives as text, the Cline dialect's way) is filled in saying so.
    """
    content = message.get("content")
    blocks: list[Block] = content if isinstance(content, list) else []
    results: dict[str, Block] = {}
    others: list[Block] = []
    matched = 0
    result_count = 0
    in_order = True
    for block in blocks:
        result_id = _result_id(block)
        if result_id is None:
            others.append(block)
            if matched < len(ids):
                in_order = False
            continue
        results[result_id] = block
        result_count += 1
        if matched < len(ids) and in_order and result_id == ids[matched]:
            matched += 1
        else:
            in_order = False
    if isinstance(content, list) and in_order and matched == len(ids) and result_count == matched:
        return message
    found = elsewhere or {}
    in_text = set(as_text)
    ordered: list[Block] = [
        results.get(tool_id)
        or found.get(tool_id)
        or {
            "type": "tool_result",
            "tool_use_id": tool_id,
            "content": notices.result_as_text if tool_id in in_text else notices.missing_result,
        }
        for tool_id in ids
    ]
    return {**message, "content": ordered + others}


def pair_needs_repair(assistant: Message, user: Message, strict: bool = False) -> bool:
    """Whether the user message after ``assistant`` must be repaired (SPEC.md §4 step 5).

    ``strict`` (every dialect but Cline's): results after a message without
    calls are orphans too, and are dropped.
    """
    ids = _tool_use_ids(assistant)
    if (not ids and not strict) or user.get("role") != "user":
        return False
    # What repair_tool_results would keep as it is, checked without building anything:
    # list content that opens with the results of ``ids`` in their order and holds no
    # other result.
    content = user.get("content")
    count = len(ids)
    if not isinstance(content, list) or len(content) < count:
        return True
    for place in range(count):
        block = content[place]
        if block.get("type") != "tool_result" or block.get("tool_use_id") != ids[place]:
            return True
    # Mostly no other block: results stand first (and no generator is made then).
    return len(content) > count and any(
        _result_id(content[place]) is not None for place in range(count, len(content))
    )


def find_repairs(messages: Sequence[Message], first: int = 0, strict: bool = False) -> list[int]:
    """Indices ``i >= first`` whose pair ``(messages[i], messages[i + 1])`` needs repair."""
    return [
        index
        for index in range(max(first, 0), len(messages) - 1)
        if pair_needs_repair(messages[index], messages[index + 1], strict)
    ]


class ViewCache:
    """What a history keeps so that building its next view costs what changed.

    Its owner (:class:`~ctxwin.engine.History` for a Cline task,
    :class:`~ctxwin.engine.MappedHistory` for a native one) keeps it in step
    with :attr:`messages` and passes it to :func:`truncated_messages` by
    keyword; a view built without one checks every pair and builds afresh,
    with the same result.

    Attributes:
        messages: the history list this cache is of (its very object).
        strict: the dialect's :attr:`~ctxwin.engine.Dialect.strict`, which the
            pairs needing repair were found under.
        repairs: ascending indices ``i`` whose pair ``(i, i + 1)`` needs repair.
        facts: what the duplicate-read pass parsed, per message.
        view: the last view built from the history and what it depended on.
        clean_until: messages from here on changed since :attr:`view` was built.
        seam: (the view returned before, the view returned last, how many first
            messages of the last are that one's own): where a view mapped on from
            the last one resumes.
        lacking: (``strict`` only) call id -> history index of the message after
            the call, for calls whose result :attr:`view` took from another
            message or filled in: that message of the view depends on messages
            after it too.
        built: how many messages :attr:`view` was built from.
    """

    __slots__ = (
        "built",
        "clean_until",
        "facts",
        "lacking",
        "messages",
        "repairs",
        "seam",
        "strict",
        "view",
    )

    def __init__(self, messages: list[Message], strict: bool) -> None:
        self.messages = messages
        self.strict = strict
        self.repairs: list[int] = find_repairs(messages, 0, strict)
        self.facts = MessageFacts()
        self.view: tuple[tuple[Any, ...], list[Message]] | None = None
        self.clean_until = 0
        self.seam: tuple[list[Message], list[Message], int] | None = None
        self.lacking: dict[str, int] = {}
        self.built = 0

    def first_changed(self) -> int:
        """The first history index whose view message may differ from :attr:`view`'s:
        :attr:`clean_until`, or a message whose repair took a result from elsewhere, when a
        message it could take one from changed (a new result for its call, or any message
        of the last view's history replaced or cut)."""
        first, lacking = self.clean_until, self.lacking
        if not lacking:
            return first
        if first < self.built:
            return min(first, *lacking.values())
        for message in self.messages[first:]:
            content = message.get("content")
            if message.get("role") != "user" or not isinstance(content, list):
                continue
            for block in content:
                at = lacking.get(block.get("tool_use_id")) if _result_id(block) else None
                if at is not None:
                    first = min(first, at)
        return first

    def changed_from(self, index: int) -> None:
        """Note that messages from ``index`` on were replaced, cut or appended (the owner
        updates :attr:`repairs`)."""
        self.clean_until = min(self.clean_until, index)
        self.facts.truncate(index)


def truncated_messages(
    messages: Sequence[Message],
    deleted_range: Sequence[int] | None,
    overlay: Overlay | None = None,
    notices: Notices = DEFAULT_NOTICES,
    summary: Summary | None = None,
    *,
    strict: bool = False,
    cache: ViewCache | None = None,
    dropped: Sequence[Sequence[int]] = (),
) -> list[Message]:
    """The messages to send: the first pair, then everything after the range (SPEC.md §4).

    Args:
        messages: the task's full history; never mutated.
        deleted_range: ``[2, end]`` or None.
        overlay: the task's edits, applied to copies of the messages they touch.
        notices: supplies the text of an invented missing tool result.
        summary: the summary that stands for removed turns, carried right
            after the first pair (docs/SUMMARIES.md).
        strict: the dialect's :attr:`~ctxwin.engine.Dialect.strict` (every
            dialect but Cline's): results that answer no call of the message
            before are orphans wherever they stand, and the results a cut
            orphans are dropped after the overlay, not before it.
        cache: the history's :class:`ViewCache`, kept by its owner; the view
            is the same without it, built afresh.
        dropped: further inclusive ranges after the range that are not sent
            (the ``auto`` strategy's deleted set, ascending and disjoint); the
            pairs across each are repaired like the pair across the range.

    Returns:
        A new list; messages that needed no change are the caller's own objects.

    Raises:
        ValueError: ``cache`` is not of ``messages``, or was kept under another ``strict``.
    """
    if cache is not None and (cache.messages is not messages or cache.strict != strict):
        raise ValueError("the view cache is not one of this history under this dialect")
    if len(messages) < 2:
        return list(messages)
    start = keep_from(deleted_range)
    spans = view_spans(len(messages), start, dropped)
    if cache is not None and overlay is not None:
        return _cached_view(cache, spans, overlay, notices, summary)
    return _build_view(messages, spans, overlay, notices, summary, strict, cache)


def _cached_view(
    cache: ViewCache,
    spans: Spans,
    overlay: Overlay,
    notices: Notices,
    summary: Summary | None = None,
) -> list[Message]:
    """The view, reusing the last one built from this history where it still holds.

    A view message at history index ``i`` depends only on messages ``<= i``,
    the range start, the overlay and the notices; so after an append (or a cut
    back) with those unchanged, the old view up to the first changed message
    stands and only the tail is built, including the pair across the seam.
    """
    messages = cache.messages
    # The runs but the last one's end (which grows with the history) are the key's.
    fixed = (*spans[:-1], spans[-1][::2])
    key = (fixed, overlay, overlay.version, notices, summary)
    cached = cache.view
    first = cache.first_changed() if cache.lacking else cache.clean_until
    same = 0
    last_low, _, last_offset = spans[-1]
    if (
        cached is not None
        and cached[0] != key
        and cached[0][:2] + cached[0][3:]
        == (
            fixed,
            overlay,
            notices,
            summary,
        )
    ):
        # Only the overlay changed: the view stands up to the first message it changed.
        lowest = overlay.lowest_since(cached[0][2])
        if lowest is not None:
            first = min(first, lowest)
            cached = (key, cached[1])
    # A deleted set reaching the newest message leaves no last run to extend: built afresh.
    reaches_end = spans[-1][1] >= len(messages)
    if cached is not None and cached[0] == key and first > last_low + 1 and reaches_end:
        seam = first + last_offset  # view position of history index ``first``
        view = [*cached[1][:seam], *messages[first:]]
        if cache.lacking:
            cache.lacking = {call: at for call, at in cache.lacking.items() if at < first}
        _finish_view(
            messages, view, spans, first, {seam - 1}, overlay, notices, cache.strict, cache
        )
        same = seam  # _finish_view changed positions from ``seam`` on only
    else:
        if cache.lacking:
            cache.lacking = {}
        view = _build_view(messages, spans, overlay, notices, summary, cache.strict, cache)
    cache.view = (key, view)
    cache.clean_until = cache.built = len(messages)
    out = list(view)
    returned = cache.seam
    cache.seam = (returned[1] if returned is not None else [], out, same)
    return out


def _build_view(
    messages: Sequence[Message],
    spans: Spans,
    overlay: Overlay | None,
    notices: Notices,
    summary: Summary | None,
    strict: bool,
    cache: ViewCache | None,
) -> list[Message]:
    start = spans[0][0]
    view = [messages[0], messages[1]]
    for low, high, _ in spans:
        view.extend(messages[low:high])
    # Positions whose pairs are always checked afresh: the first pair's and each one
    # across a dropped range.
    changed = {0, 1, *(high + offset - 1 for _, high, offset in spans[:-1])}
    # SPEC.md §4 step 3 drops the results a cut orphans before the overlay is applied,
    # so an edit of such a result lands on the block that takes its index. In every
    # dialect but Cline's (``strict``) the repair of the pair across the cut drops
    # them instead, after the overlay: an edit goes with its result.
    if start > FIRST_REMOVABLE and len(view) > 2 and not strict:
        third = view[2]
        content = third.get("content")
        if (
            third.get("role") == "user"
            and isinstance(content, list)
            and any(block.get("type") == "tool_result" for block in content)
        ):
            view[2] = {
                **third,
                "content": [block for block in content if block.get("type") != "tool_result"],
            }
            changed.add(2)
    if overlay:
        for position, original in enumerate((0, 1)):
            entry = overlay.get(original)
            if entry is not None:
                view[position] = apply_overlay(view[position], entry)
    first = view[0]
    content = first.get("content")
    if strict and isinstance(content, list) and any(_result_id(b) for b in content):
        # Results in the first message answer no call: orphans wherever they stand.
        view[0] = {**first, "content": [b for b in content if _result_id(b) is None]}
    _finish_view(messages, view, spans, start, changed, overlay, notices, strict, cache)
    if summary is not None:
        # After the repair: the results that answer message 1 stay first in view[2].
        place_summary(view, summary.block())
    return view


def _finish_view(
    messages: Sequence[Message],
    view: list[Message],
    spans: Spans,
    first: int,
    changed: set[int],
    overlay: Overlay | None,
    notices: Notices,
    strict: bool,
    cache: ViewCache | None,
) -> None:
    """Apply the overlay to history indices ``>= first`` of ``view`` and repair its pairs.

    ``changed`` holds view positions whose pairs must be checked besides the
    ones the overlay touches (and, with a ``cache``, the pairs it knows need
    repair); without one every pair is.
    """
    start = spans[0][0]
    # One run to the history's end (a deleted set reaching the newest message ends it early).
    single = len(spans) == 1 and spans[0][1] >= len(messages)
    offset = 2 - start  # view position of history index i >= start is i + offset (one run)
    if overlay:
        # Only the edited indices from ``first`` on: a view built on the last one costs
        # the edits of its new messages, not a walk over every edit of the task.
        indices = overlay.indices()
        edits = overlay.messages
        low = bisect.bisect_left(indices, first)
        for original in indices[low : bisect.bisect_left(indices, len(messages), low)]:
            at = original + offset if single else span_position(spans, original)
            if at is None:
                continue
            view[at] = apply_overlay(view[at], edits[original])
            changed.update((at - 1, at))
    if cache is not None:
        # Pairs of two untouched history messages repair as the history's own pairs do.
        low = max(first - 1, start)
        # Only the known pairs from ``low`` on (the list is ascending: its owner keeps it
        # so), not a walk over every pair of the history each turn.
        repairs = cache.repairs[bisect.bisect_left(cache.repairs, low) :]
        if single:
            changed.update(index + offset for index in repairs)
        else:
            for index in repairs:
                at = span_position(spans, index)
                if at is not None:
                    changed.add(at)
        positions: Iterable[int] = sorted(p for p in changed if p < len(view) - 1)
    else:
        positions = range(len(view) - 1)
    elsewhere: dict[str, Block] | None = None
    crossings = {high + offset - 1 for _, high, offset in spans[:-1]}
    for position in positions:
        ids = _tool_use_ids(view[position])
        following = view[position + 1]
        if (ids or strict) and following.get("role") == "user":
            found = None
            if strict and ids and _lacks_results(ids, following):
                if elsewhere is None:
                    elsewhere = _stray_results(messages, spans, overlay)
                found = elsewhere
                if cache is not None:
                    at = span_index(spans, position + 1)
                    _note_lacking(cache, ids, following, at)
            # Across a cut (message 1, then the first message after the range) a text
            # result answers a removed call, not this one.
            across = (position == 1 and start > FIRST_REMOVABLE) or (
                not single and position in crossings
            )
            as_text = () if strict or across else _answered_in_text(view[position], following)
            view[position + 1] = repair_tool_results(ids, following, notices, found, as_text)


def _answered_in_text(assistant: Message, user: Message) -> set[str]:
    """The calls of ``assistant`` whose result ``user`` gives as text: a text block opening
    with the Cline dialect's header naming the call's tool and one of its arguments
    (``[read_file for 'a.py'] Result:``), or the tool alone (``[plan_mode_respond] Result:``)."""
    content = user.get("content")
    texts = [text_of(block) for block in content] if isinstance(content, list) else [content]
    headers: set[tuple[str, str | None]] = set()
    for text in texts:
        match = _TEXT_RESULT.match(text) if isinstance(text, str) else None
        if match is not None:
            argument = match.group(2)
            # A long argument (a question, a command) may come back shortened or escaped.
            headers.add((match.group(1), argument if argument is None else argument[:_SAME]))
    if not headers:
        return set()
    found: set[str] = set()
    for block in assistant.get("content") or ():
        if block.get("type") != "tool_use":
            continue
        name = block.get("name")
        arguments = block.get("input")
        values = (
            [value[:_SAME] for value in arguments.values() if isinstance(value, str)]
            if isinstance(arguments, dict)
            else []
        )
        if (name, None) in headers or any((name, value) in headers for value in values):
            found.add(block.get("id"))
    return found


_SAME = 40
"""How many first characters of a header's argument must be the call's."""
_TEXT_RESULT = re.compile(r"\[([^\s\]]+)(?: for '([\s\S]*?)')?\] Result:")
"""A tool result given as text, and the tool's name (the Cline dialect's header)."""


def _note_lacking(cache: ViewCache, ids: list[str], message: Message, index: int) -> None:
    """Note in ``cache`` the calls ``ids`` that ``message`` (history index ``index``) holds
    no result for."""
    content = message.get("content")
    held = {_result_id(block) for block in content} if isinstance(content, list) else set()
    for tool_id in ids:
        if tool_id not in held:
            cache.lacking[tool_id] = index


def _lacks_results(ids: list[str], message: Message) -> bool:
    """Whether ``message`` holds no result for some of the calls ``ids``."""
    content = message.get("content")
    if not isinstance(content, list):
        return True
    held = {_result_id(block) for block in content}
    return any(tool_id not in held for tool_id in ids)


def _stray_results(
    messages: Sequence[Message], spans: Spans, overlay: Overlay | None
) -> dict[str, Block]:
    """Results the view holds where they answer no call of the message before, by call id.

    Histories converted from logs put a call's result after the next message
    with calls, or before its own call; such a result is an orphan where it
    stands (the repair drops it there) but is the real result of a call the
    view sends. Blocks are taken as the view has them (with the overlay's edits).
    """
    found: dict[str, Block] = {}
    runs = (range(low, min(high, len(messages))) for low, high, _ in spans)
    indices = itertools.chain(range(min(2, len(messages))), *runs)
    previous: Message | None = None
    for index in indices:
        message = messages[index]
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, list):
            answered = set(_tool_use_ids(previous)) if previous is not None else set()
            entry = overlay.get(index) if overlay else None
            blocks = content if entry is None else apply_overlay(message, entry)["content"]
            for block in blocks:
                call = _result_id(block)
                if call is not None and call not in answered:
                    found.setdefault(call, block)
        previous = message
    return found
