"""Duplicate file read optimisation and its savings (SPEC.md §6)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ._blocks import Message, text_of, utf16_len
from ._notices import Notices
from ._overlay import EDIT_FILE_CHANGE, EDIT_FILE_MENTION, EDIT_READ_FILE, Overlay, update_text

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


def _mentions(
    scan: Scan, index: int, content: list[dict[str, object]], replaced: list[str], notice: str
) -> None:
    for block_index in range(min(MENTION_BLOCKS, len(content))):
        text = text_of(content[block_index])
        if not text or "<file_content" not in text:
            continue
        elements = mention_elements(text)
        if not elements:
            continue
        scan.mention_files[index] = [path for path, _ in elements]
        for path, element in elements:
            if path in replaced:
                continue
            scan.add(
                path,
                Candidate(
                    index,
                    EDIT_FILE_MENTION,
                    block_index,
                    f'<file_content path="{path}">{notice}</file_content>',
                    path=path,
                    search=element,
                ),
            )
        return


def scan(messages: Sequence[Message], start: int, overlay: Overlay, notice: str) -> Scan:
    """Find every file read from ``start`` on that a later read could supersede."""
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
            metadata = first[-1][3] if len(first[-1]) > 3 else []
            if len(metadata) >= 2 and len(metadata[0]) == len(metadata[1]):
                continue
            replaced = list(metadata[0]) if metadata else []
        message = messages[index]
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if not isinstance(content, list) or not content:
            continue
        text = text_of(content[0])
        if not text:
            continue
        tool_read = False
        header = TOOL_HEADER.match(text) if text.startswith("[") else None
        if header is not None:
            tool, path = header.group(1), header.group(2)
            block = 0 if len(text) > header.end() else 1
            if tool == "read_file":
                replacement = notice if block == 1 else f"{header.group(0)}\n{notice}"
                found.add(path, Candidate(index, EDIT_READ_FILE, block, replacement))
                tool_read = True
            elif tool in ("write_to_file", "replace_in_file"):
                edited: str | None = None
                if content[0].get("type") == "tool_result" or block == 0:
                    edited = text
                elif len(content) > 1 and content[1].get("type") == "text":
                    edited = text_of(content[1])
                if edited is not None:
                    tool_read = True
                    body = final_body(edited) if "<final_file_content" in edited else None
                    if body is not None:
                        replacement = f"{edited[: body[0]]} {notice} {edited[body[1] :]}"
                        found.add(path, Candidate(index, EDIT_FILE_CHANGE, block, replacement))
        if not tool_read:
            _mentions(found, index, content, replaced, notice)
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
            metadata = previous[-1][3] if len(previous[-1]) > 3 else []
            replaced = list(metadata[0]) if metadata else []
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


def savings(
    messages: Sequence[Message], start: int, overlay: Overlay, changed: set[int]
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
        content = messages[index].get("content")
        if not isinstance(content, list):
            continue
        entry = edits.get(index)
        blocks = entry.blocks if entry is not None else None
        for block_index, block in enumerate(content):
            # text_of() inlined for text blocks: this loop visits every block.
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
            updates = blocks.get(block_index) if blocks is not None else None
            latest_text = update_text(updates[-1]) if updates else None
            if updates is None or latest_text is None:
                total += len(text) if text.isascii() else utf16_len(text)
                continue
            latest = utf16_len(latest_text)
            if index in changed:
                previous = update_text(updates[-2]) if len(updates) > 1 else None
                before = utf16_len(text if previous is None else previous)
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
) -> Optimisation:
    """Replace superseded file reads from ``start`` on, in ``overlay`` (SPEC.md §6).

    Returns:
        Whether anything changed and whether truncation is still needed
        (nothing changed, or less than 30% of the characters saved).
    """
    found = scan(messages, start, overlay, notices.duplicate_file_read)
    indices = apply(found, messages, overlay, ts)
    if not indices:
        return Optimisation(False, True, 0.0, frozenset())
    total, saved = savings(messages, start, overlay, indices)
    percent = saved / total if total else 0.0
    return Optimisation(True, percent < SAVINGS_NEEDED, percent, frozenset(indices))
