"""The per-task overlay of block edits and its on-disk form (SPEC.md §1, §9)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

from ctxwin.proto import (
    EDIT_FILE_CHANGE,
    EDIT_FILE_MENTION,
    EDIT_NO_FILE_READ,
    EDIT_READ_FILE,
    EDIT_UNDEFINED,
    OverlayFormatError,
    Update,
    read_overlay,
    update_text,
)

__all__ = [
    "EDIT_FILE_CHANGE",
    "EDIT_FILE_MENTION",
    "EDIT_NO_FILE_READ",
    "EDIT_READ_FILE",
    "EDIT_UNDEFINED",
    "CorruptStateError",
    "MessageUpdates",
    "Overlay",
    "Update",
    "replaced_paths",
    "update_metadata",
    "update_text",
]

# An update is kept as the list it is stored as: [ts, kind, [text], metadata].
# Keeping the stored shape (rather than a parsed record) makes dump(load(x)) == x
# exact, including values this version does not interpret. The shape, the edit
# types and the reader are proto's (both sides read the on-disk form).


def update_metadata(update: Update) -> list[Any]:
    """An update's metadata: empty, or for a file mention ``[replaced_paths, all_paths]``."""
    return update[3] if len(update) > 3 else []


def replaced_paths(update: Update) -> list[str]:
    """The paths a file-mention update has replaced so far (none for other updates)."""
    metadata = update_metadata(update)
    return list(metadata[0]) if metadata else []


class CorruptStateError(OverlayFormatError):
    """Stored task state that does not have its stored shape (SPEC.md §1)."""


class MessageUpdates:
    """The edits of one message: its edit type and the update list of each block."""

    __slots__ = ("blocks", "edit_type")

    def __init__(self, edit_type: int, blocks: dict[int, list[Update]] | None = None) -> None:
        self.edit_type = edit_type
        self.blocks: dict[int, list[Update]] = blocks if blocks is not None else {}


_LOG_SIZE = 64
"""How many last changes an overlay remembers the index of (views built on the last one)."""


class Overlay:
    """``{message_index: MessageUpdates}``: edits applied to the view, never to the history."""

    __slots__ = ("_log", "_sorted", "messages", "version")

    def __init__(self) -> None:
        self.messages: dict[int, MessageUpdates] = {}
        self.version = 0  # grows with every change, so views built from it can be reused
        self._sorted: tuple[int, int, list[int]] = (-1, 0, [])
        # (version, index changed) of the last changes; index -1: any (a rollback, a discard).
        self._log: list[tuple[int, int]] = []

    def _changed(self, index: int) -> None:
        self.version += 1
        log = self._log
        log.append((self.version, index))
        if len(log) > _LOG_SIZE:
            del log[: len(log) - _LOG_SIZE]

    def lowest_since(self, version: int) -> int | None:
        """The lowest message index changed since ``version``, or None when that is not known
        (too long ago, a rollback, another overlay's version)."""
        log = self._log
        if version == self.version:
            return sys.maxsize
        if not log or log[0][0] > version + 1 or version > self.version:
            return None
        lowest = sys.maxsize
        for at, index in reversed(log):
            if at <= version:
                break
            if index < 0:
                return None
            lowest = min(lowest, index)
        return lowest

    def __len__(self) -> int:
        return len(self.messages)

    def __contains__(self, index: object) -> bool:
        return index in self.messages

    def get(self, index: int) -> MessageUpdates | None:
        return self.messages.get(index)

    def items(self) -> Iterator[tuple[int, MessageUpdates]]:
        return iter(self.messages.items())

    def indices(self) -> list[int]:
        """The indices of the edited messages, ascending (made once per version; do not change)."""
        version, count, keys = self._sorted
        if version != self.version or count != len(self.messages):
            keys = sorted(self.messages)
            self._sorted = (self.version, len(self.messages), keys)
        return keys

    def entry(self, index: int, edit_type: int) -> MessageUpdates:
        """The message's edits, created with ``edit_type`` if absent (an existing type stays)."""
        found = self.messages.get(index)
        if found is None:
            found = self.messages[index] = MessageUpdates(edit_type)
            self._changed(index)
        return found

    def append(self, index: int, edit_type: int, block: int, update: Update) -> None:
        """Add ``update`` as the newest edit of one block."""
        self.entry(index, edit_type).blocks.setdefault(block, []).append(update)
        self._changed(index)

    def copy(self) -> Overlay:
        """A copy whose block lists are its own (updates are never changed in place)."""
        twin = Overlay()
        for index, entry in self.messages.items():
            twin.messages[index] = MessageUpdates(
                entry.edit_type, {block: list(updates) for block, updates in entry.blocks.items()}
            )
        return twin

    def rollback(self, ts: float) -> int:
        """Drop every block's trailing updates newer than ``ts`` (SPEC.md §9).

        Blocks left empty and messages left without blocks are dropped too.

        Returns:
            How many updates were removed.
        """
        removed = 0
        for index in list(self.messages):
            entry = self.messages[index]
            for block in list(entry.blocks):
                updates = entry.blocks[block]
                keep = len(updates)
                while keep and updates[keep - 1][0] > ts:
                    keep -= 1
                if keep < len(updates):
                    removed += len(updates) - keep
                    del updates[keep:]
                if not updates:
                    del entry.blocks[block]
            if not entry.blocks:
                del self.messages[index]
        if removed:
            self._changed(-1)
        return removed

    def discard(self, keep: Callable[[int], bool]) -> int:
        """Drop the edits of every message whose index ``keep`` refuses; returns how many."""
        gone = [index for index in self.messages if not keep(index)]
        for index in gone:
            del self.messages[index]
        if gone:
            self._changed(-1)
        return len(gone)

    def dump(self) -> list[Any]:
        """The on-disk form: ``[[index, [edit_type, [[block, [update, ...]], ...]]], ...]``."""
        return [
            [
                index,
                [entry.edit_type, [[block, updates] for block, updates in entry.blocks.items()]],
            ]
            for index, entry in self.messages.items()
        ]

    @classmethod
    def load(cls, data: object) -> Overlay:
        """Read the on-disk form (SPEC.md §1).

        Raises:
            CorruptStateError: when ``data`` does not have that shape.
        """
        overlay = cls()
        try:
            stored = read_overlay(data)
        except OverlayFormatError as exc:
            raise CorruptStateError(str(exc)) from None
        for edits in stored:
            overlay.messages[edits.message] = MessageUpdates(edits.edit_type, edits.blocks)
        return overlay
