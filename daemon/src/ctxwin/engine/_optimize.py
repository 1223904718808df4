"""Duplicate file read optimisation and its savings (SPEC.md §6), and the two ops that
run it on a task."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ctxwin.proto import OptimizeFileReadsInMemoryResult, OptimizeFileReadsResult

from ._blocks import Message, text_of, utf16_len, wire_view
from ._notices import Notices
from ._overlay import (
    EDIT_FILE_CHANGE,
    EDIT_FILE_MENTION,
    EDIT_READ_FILE,
    Overlay,
    replaced_paths,
    update_metadata,
    update_text,
)
from ._reads import ReadRules, native_reads

# JavaScript's \s, spelled out so that the header rule reads the same characters
# as the reference strategy (Python's \s differs on \ufeff and \x1c-\x1f, \x85).
_JS_SPACE = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
TOOL_HEADER = re.compile(rf"\[([^{_JS_SPACE}]+) for '([^']+)'\] Result:")
FINAL_FILE_CONTENT = re.compile(
    r'(<final_file_content path="[^"]*">)([\s\S]*?)(</final_file_content>)'
)
FILE_CONTENT = re.compile(r'<file_content path="([^"]*)">[\s\S]*?</file_content>')
# The two element rules above, found the same way but faster: the lazy
# ``[\s\S]*?`` steps through an element's body one character at a time, while
# str.find jumps to the closing tag (3-10x less time on file-sized bodies).
_FINAL_OPEN = re.compile(r'<final_file_content path="[^"]*">')
_FINAL_CLOSE = "</final_file_content>"
_MENTION_OPEN = re.compile(r'<file_content path="([^"]*)">')
_MENTION_CLOSE = "</file_content>"
MENTION_BLOCKS = 3
SAVINGS_NEEDED = 0.3


@dataclass(slots=True)
class Candidate:
    """One place that a duplicate read could be replaced.

    For edit types 2 and 3 ``replacement`` is the block's new text; for type 4
    it replaces ``search`` (one whole ``<file_content>`` element) in the text.
    """

    index: int
    edit_type: int
    block: int
    replacement: str
    path: str = ""
    search: str = ""


@dataclass(slots=True)
class Scan:
    """What a scan of the history found: candidates per path, files per mention message."""

    by_path: dict[str, list[Candidate]] = field(default_factory=dict)
    mention_files: dict[int, list[str]] = field(default_factory=dict)

    def add(self, path: str, candidate: Candidate) -> None:
        self.by_path.setdefault(path, []).append(candidate)


def final_body(text: str) -> tuple[int, int] | None:
    """Where ``FINAL_FILE_CONTENT.search(text)`` finds the body: ``(start(2), end(2))``.

    The first opening tag decides: any later one also ends later, so it cannot
    reach a closing tag that the first one cannot.
    """
    opening = _FINAL_OPEN.search(text)
    if opening is None:
        return None
    end = text.find(_FINAL_CLOSE, opening.end())
    return None if end < 0 else (opening.end(), end)


def mention_elements(text: str) -> list[tuple[str, str]]:
    """``(path, whole element)`` for each match of ``FILE_CONTENT.finditer(text)``."""
    elements: list[tuple[str, str]] = []
    position = 0
    while (opening := _MENTION_OPEN.search(text, position)) is not None:
        end = text.find(_MENTION_CLOSE, opening.end())
        if end < 0:
            break  # no later opening tag can be closed either
        position = end + len(_MENTION_CLOSE)
        elements.append((opening.group(1), text[opening.start() : position]))
    return elements


@dataclass(frozen=True, slots=True)
class ReadFacts:
    """What one message holds for the duplicate-read pass, whatever the overlay says.

    ``candidate``: the read or write result it is (its header found once);
    ``tool_read``: it is a tool result, so file mentions in it do not count;
    ``mention_block`` and ``mentions``: the first of its first blocks that
    holds ``<file_content>`` elements, and those elements as ``(path, element)``.
    """

    candidate: tuple[str, Candidate] | None = None
    tool_read: bool = False
    mention_block: int = -1
    mentions: tuple[tuple[str, str], ...] = ()


NO_READS = ReadFacts()


def read_facts(message: Message, index: int, notice: str) -> ReadFacts:
    """Parse one message for the duplicate-read pass (SPEC.md §6), once."""
    if message.get("role") != "user":
        return NO_READS
    content = message.get("content")
    if not isinstance(content, list) or not content:
        return NO_READS
    text = text_of(content[0])
    if not text:
        return NO_READS
    header = TOOL_HEADER.match(text) if text.startswith("[") else None
    if header is not None:
        tool, path = header.group(1), header.group(2)
        block = 0 if len(text) > header.end() else 1
        if tool == "read_file":
            replacement = notice if block == 1 else f"{header.group(0)}\n{notice}"
            read = Candidate(index, EDIT_READ_FILE, block, replacement)
            return ReadFacts((path, read), tool_read=True)
        if tool in ("write_to_file", "replace_in_file"):
            edited: str | None = None
            if content[0].get("type") == "tool_result" or block == 0:
                edited = text
            elif len(content) > 1 and content[1].get("type") == "text":
                edited = text_of(content[1])
            if edited is not None:
                body = final_body(edited) if "<final_file_content" in edited else None
                if body is None:
                    return ReadFacts(tool_read=True)
                replacement = f"{edited[: body[0]]} {notice} {edited[body[1] :]}"
                change = Candidate(index, EDIT_FILE_CHANGE, block, replacement)
                return ReadFacts((path, change), tool_read=True)
    for block_index in range(min(MENTION_BLOCKS, len(content))):
        block_text = text_of(content[block_index])
        if not block_text or "<file_content" not in block_text:
            continue
        elements = mention_elements(block_text)
        if elements:
            return ReadFacts(mention_block=block_index, mentions=tuple(elements))
    return NO_READS


class MessageFacts:
    """Per-message parse results, kept by a history while its messages are unchanged.

    A plain list of messages has none: its facts are parsed on every call,
    through the same functions, so both give the same results.
    """

    __slots__ = ("_chars", "_native", "_reads")

    def __init__(self) -> None:
        self._reads: list[tuple[str, ReadFacts] | None] = []
        self._chars: list[MessageChars | None] = []
        self._native: list[tuple[ReadRules, tuple[tuple[str, int], ...]] | None] = []

    def truncate(self, length: int) -> None:
        """Forget the facts of messages from ``length`` on."""
        del self._reads[length:]
        del self._chars[length:]
        del self._native[length:]

    def native(
        self, messages: Sequence[Message], index: int, rules: ReadRules
    ) -> tuple[tuple[str, int], ...]:
        cache = self._native
        if len(cache) < len(messages):
            cache.extend([None] * (len(messages) - len(cache)))
        held = cache[index]
        if held is None or held[0] is not rules:
            held = cache[index] = (rules, native_reads(messages, index, rules))
        return held[1]

    def reads(self, messages: Sequence[Message], index: int, notice: str) -> ReadFacts:
        cache = self._reads
        if len(cache) < len(messages):
            cache.extend([None] * (len(messages) - len(cache)))
        held = cache[index]
        if held is None or held[0] != notice:
            held = cache[index] = (notice, read_facts(messages[index], index, notice))
        return held[1]

    def chars(self, messages: Sequence[Message], index: int) -> MessageChars:
        cache = self._chars
        if len(cache) < len(messages):
            cache.extend([None] * (len(messages) - len(cache)))
        held = cache[index]
        if held is None:
            held = cache[index] = message_chars(messages[index])
        return held


def scan(
    messages: Sequence[Message],
    start: int,
    overlay: Overlay,
    notice: str,
    facts: MessageFacts | None = None,
) -> Scan:
    """Find every file read from ``start`` on that a later read could supersede.

    ``facts``: the history's parse results, when it keeps them (else parsed here).
    """
    found = Scan()
    edits = overlay.messages
    for index in range(max(start, 0), len(messages)):
        replaced: list[str] = []
        entry = edits.get(index)
        if entry is not None:
            if entry.edit_type != EDIT_FILE_MENTION or not entry.blocks:
                continue
            first = next(iter(entry.blocks.values()))
            if not first:
                continue
            metadata = update_metadata(first[-1])
            if len(metadata) >= 2 and len(metadata[0]) == len(metadata[1]):
                continue
            replaced = replaced_paths(first[-1])
        reads = (
            facts.reads(messages, index, notice)
            if facts is not None
            else read_facts(messages[index], index, notice)
        )
        if reads.candidate is not None:
            found.add(*reads.candidate)
        if reads.tool_read or not reads.mentions:
            continue
        found.mention_files[index] = [path for path, _ in reads.mentions]
        for path, element in reads.mentions:
            if path in replaced:
                continue
            found.add(
                path,
                Candidate(
                    index,
                    EDIT_FILE_MENTION,
                    reads.mention_block,
                    f'<file_content path="{path}">{notice}</file_content>',
                    path=path,
                    search=element,
                ),
            )
    return found


def scan_native(
    messages: Sequence[Message],
    start: int,
    overlay: Overlay,
    notice: str,
    rules: ReadRules,
    facts: MessageFacts | None = None,
) -> Scan:
    """Find every native tool read from ``start`` on (docs/DIALECTS.md, "File reads").

    A result block that was already replaced is no candidate any more; the
    other reads in its message still are (a message can answer parallel reads).
    """
    found = Scan()
    edits = overlay.messages
    for index in range(max(start, 0), len(messages)):
        reads = (
            facts.native(messages, index, rules)
            if facts is not None
            else native_reads(messages, index, rules)
        )
        if not reads:
            continue
        entry = edits.get(index)
        for key, block in reads:
            if entry is not None and block in entry.blocks:
                continue
            found.add(key, Candidate(index, EDIT_READ_FILE, block, notice))
    return found


def apply(found: Scan, messages: Sequence[Message], overlay: Overlay, ts: int | float) -> set[int]:
    """Replace every candidate but the last of each path read more than once.

    Returns:
        The indices of the messages changed.
    """
    changed: set[int] = set()
    mentions: dict[int, list[Candidate]] = {}
    for candidates in found.by_path.values():
        for candidate in candidates[:-1]:
            if candidate.edit_type == EDIT_FILE_MENTION:
                mentions.setdefault(candidate.index, []).append(candidate)
                continue
            overlay.append(
                candidate.index,
                candidate.edit_type,
                candidate.block,
                [ts, "text", [candidate.replacement], []],
            )
            changed.add(candidate.index)
    for index, candidates in mentions.items():
        block = candidates[0].block
        entry = overlay.get(index)
        previous = entry.blocks.get(block) if entry is not None else None
        latest_text = update_text(previous[-1]) if previous else None
        if previous and latest_text is not None:
            text = latest_text
            replaced = replaced_paths(previous[-1])
        else:
            original = text_of(messages[index]["content"][block])
            text = original or ""
            replaced = []
        for candidate in candidates:
            text = text.replace(candidate.search, candidate.replacement, 1)
            replaced.append(candidate.path)
        all_files = list(found.mention_files.get(index, []))
        overlay.append(index, EDIT_FILE_MENTION, block, [ts, "text", [text], [replaced, all_files]])
        changed.add(index)
    return changed


@dataclass(frozen=True, slots=True)
class MessageChars:
    """A message's characters as the savings count reads them (SPEC.md §6).

    ``total``: UTF-16 units of its block texts plus base64 image data, list
    content only; ``blocks``: the units of each block that has a text.
    """

    total: int
    blocks: dict[int, int]


def message_chars(message: Message) -> MessageChars:
    """Count one message's characters for the savings count, once."""
    content = message.get("content")
    if not isinstance(content, list):
        return MessageChars(0, {})
    total = 0
    blocks: dict[int, int] = {}
    for block_index, block in enumerate(content):
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if not text or not isinstance(text, str):
                continue
        elif kind == "tool_result":
            text = text_of(block)
            if not text:
                continue
        else:
            if kind == "image":
                source = block.get("source")
                if isinstance(source, dict) and source.get("type") == "base64":
                    data = source.get("data")
                    if isinstance(data, str):
                        total += len(data)
            continue
        units = len(text) if text.isascii() else utf16_len(text)
        blocks[block_index] = units
        total += units
    return MessageChars(total, blocks)


def savings(
    messages: Sequence[Message],
    start: int,
    overlay: Overlay,
    changed: set[int],
    facts: MessageFacts | None = None,
) -> tuple[int, int]:
    """Characters (UTF-16 units) in the view's range and how many this run saved.

    Counts messages 0 and 1 and ``start`` to the end, list content only (SPEC.md §6).

    Returns:
        ``(total, saved)``.
    """
    total = 0
    saved = 0
    edits = overlay.messages
    indices = [*range(min(2, len(messages))), *range(max(start, 2), len(messages))]
    for index in indices:
        chars = (
            facts.chars(messages, index) if facts is not None else message_chars(messages[index])
        )
        entry = edits.get(index)
        if entry is None:
            total += chars.total
            continue
        total += chars.total - sum(chars.blocks.values())  # images
        for block_index, units in chars.blocks.items():
            updates = entry.blocks.get(block_index)
            latest_text = update_text(updates[-1]) if updates else None
            if updates is None or latest_text is None:
                total += units
                continue
            latest = utf16_len(latest_text)
            if index in changed:
                previous = update_text(updates[-2]) if len(updates) > 1 else None
                before = units if previous is None else utf16_len(previous)
                total += before
                saved += before - latest
            else:
                total += latest
    return total, saved


@dataclass(frozen=True, slots=True)
class Optimisation:
    """The outcome of one optimisation run."""

    changed: bool
    need_to_truncate: bool
    percent_saved: float
    indices: frozenset[int]


def optimize_file_reads(
    messages: Sequence[Message],
    start: int,
    overlay: Overlay,
    ts: int | float,
    notices: Notices,
    facts: MessageFacts | None = None,
    rules: ReadRules | None = None,
) -> Optimisation:
    """Replace superseded file reads from ``start`` on, in ``overlay`` (SPEC.md §6).

    ``facts``: the parse results the history keeps for its messages, if it
    does (:class:`~ctxwin.engine.History`); a plain list is parsed each call.
    ``rules``: None reads Cline's result headers (SPEC.md §6); otherwise
    native tool calls are the reads (docs/DIALECTS.md).

    Returns:
        Whether anything changed and whether truncation is still needed
        (nothing changed, or less than 30% of the characters saved).
    """
    notice = notices.duplicate_file_read
    if rules is None:
        found = scan(messages, start, overlay, notice, facts)
    else:
        found = scan_native(messages, start, overlay, notice, rules, facts)
    indices = apply(found, messages, overlay, ts)
    if not indices:
        return Optimisation(False, True, 0.0, frozenset())
    total, saved = savings(messages, start, overlay, indices, facts)
    percent = saved / total if total else 0.0
    return Optimisation(True, percent < SAVINGS_NEEDED, percent, frozenset(indices))


class OptimizeTask(Protocol):
    """What the optimisation ops use of a task's state (``TaskState`` has it)."""

    def optimize(self, messages: Sequence[Message], ts: int, whole: bool = False) -> Optimisation:
        """Replace superseded file reads in the overlay, with no write asked for."""
        ...

    def mark_changed(self) -> None:
        """Ask for a write."""
        ...

    def truncated_messages(self, messages: Sequence[Message]) -> list[Message]:
        """The view of ``messages``."""
        ...


def optimize_task(
    state: OptimizeTask, messages: Sequence[Message], ts: int
) -> OptimizeFileReadsResult:
    """``optimize_file_reads``: replace superseded file reads after the task's range and
    persist (SPEC.md §6)."""
    result = state.optimize(messages, ts)
    if result.changed:
        state.mark_changed()
    return {
        "changed": result.changed,
        "need_to_truncate": result.need_to_truncate,
        "percent_saved": result.percent_saved,
    }


def optimize_task_in_memory(
    state: OptimizeTask, messages: Sequence[Message], ts: int
) -> OptimizeFileReadsInMemoryResult:
    """``optimize_file_reads_in_memory``: as :func:`optimize_task` without asking for a
    write (SPEC.md §8); the view when something changed, else ``messages`` untouched."""
    result = state.optimize(messages, ts)
    view = state.truncated_messages(messages) if result.changed else list(messages)
    need = result.need_to_truncate
    return {"changed": result.changed, "need_to_truncate": need, "messages": wire_view(view)}
