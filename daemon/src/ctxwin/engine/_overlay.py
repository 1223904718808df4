"""The per-task overlay of block edits and its on-disk form (SPEC.md §1, §9)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

# An update is kept as the list it is stored as: [ts, kind, [text], metadata].
# Keeping the stored shape (rather than a parsed record) makes dump(load(x)) == x
# exact, including values this version does not interpret.
Update = list[Any]

EDIT_UNDEFINED = 0
EDIT_NO_FILE_READ = 1
EDIT_READ_FILE = 2
EDIT_FILE_CHANGE = 3
EDIT_FILE_MENTION = 4


def update_text(update: Update) -> str | None:
    """The text a ``"text"`` update sets, or None for any other kind."""
    if update[1] == "text":
        text: str = update[2][0]
        return text
    return None


def update_metadata(update: Update) -> list[Any]:
    """An update's metadata: empty, or for a file mention ``[replaced_paths, all_paths]``."""
    return update[3] if len(update) > 3 else []


def replaced_paths(update: Update) -> list[str]:
    """The paths a file-mention update has replaced so far (none for other updates)."""
    metadata = update_metadata(update)
    return list(metadata[0]) if metadata else []


class CorruptStateError(ValueError):
    """Stored overlay data that does not have the on-disk shape of SPEC.md §1."""


class MessageUpdates:
    """The edits of one message: its edit type and the update list of each block."""

    __slots__ = ("blocks", "edit_type")

    def __init__(self, edit_type: int, blocks: dict[int, list[Update]] | None = None) -> None:
        self.edit_type = edit_type
        self.blocks: dict[int, list[Update]] = blocks if blocks is not None else {}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_update(update: object, where: str) -> Update:
    if (
        not isinstance(update, list)
        or len(update) < 3
        or not _is_number(update[0])
        or not isinstance(update[1], str)
        or not isinstance(update[2], list)
    ):
        raise CorruptStateError(f"{where}: an update must be [ts, kind, [text, ...], metadata]")
    if update[1] == "text" and (not update[2] or not isinstance(update[2][0], str)):
        raise CorruptStateError(f"{where}: a text update must carry its text first")
    return update


class Overlay:
    """``{message_index: MessageUpdates}``: edits applied to the view, never to the history."""

    __slots__ = ("messages", "version")

    def __init__(self) -> None:
        self.messages: dict[int, MessageUpdates] = {}
        self.version = 0  # grows with every change, so views built from it can be reused

    def __len__(self) -> int:
        return len(self.messages)

    def __contains__(self, index: object) -> bool:
        return index in self.messages

    def get(self, index: int) -> MessageUpdates | None:
        return self.messages.get(index)

    def items(self) -> Iterator[tuple[int, MessageUpdates]]:
        return iter(self.messages.items())

    def entry(self, index: int, edit_type: int) -> MessageUpdates:
        """The message's edits, created with ``edit_type`` if absent (an existing type stays)."""
        found = self.messages.get(index)
        if found is None:
            found = self.messages[index] = MessageUpdates(edit_type)
            self.version += 1
        return found

    def append(self, index: int, edit_type: int, block: int, update: Update) -> None:
        """Add ``update`` as the newest edit of one block."""
        self.entry(index, edit_type).blocks.setdefault(block, []).append(update)
        self.version += 1

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
            self.version += 1
        return removed

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
        if not isinstance(data, list):
            raise CorruptStateError("the overlay must be a list of [message_index, entry]")
        for position, item in enumerate(data):
            where = f"entry {position}"
            if not isinstance(item, list) or len(item) != 2 or not _is_int(item[0]):
                raise CorruptStateError(f"{where}: expected [message_index, [type, blocks]]")
            index, body = item
            if (
                not isinstance(body, list)
                or len(body) != 2
                or not _is_int(body[0])
                or not isinstance(body[1], list)
            ):
                raise CorruptStateError(f"{where}: expected [edit_type, [[block, updates], ...]]")
            entry = MessageUpdates(body[0])
            for block_item in body[1]:
                if (
                    not isinstance(block_item, list)
                    or len(block_item) != 2
                    or not _is_int(block_item[0])
                    or not isinstance(block_item[1], list)
                ):
                    raise CorruptStateError(f"{where}: expected [block_index, [update, ...]]")
                entry.blocks[block_item[0]] = [
                    _check_update(update, f"{where} block {block_item[0]}")
                    for update in block_item[1]
                ]
            overlay.messages[index] = entry
        return overlay
