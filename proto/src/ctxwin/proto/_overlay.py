"""The overlay's on-disk form (SPEC.md §1): its edit types and a strict reader.

The form is ``[[message_index, [edit_type, [[block_index, [update, ...]], ...]]], ...]``
with each update ``[ts, kind, [text, ...], metadata]``. ``inspect`` answers with
it, task files store it; both sides read it here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

EDIT_UNDEFINED = 0
EDIT_NO_FILE_READ = 1
EDIT_READ_FILE = 2
EDIT_FILE_CHANGE = 3
EDIT_FILE_MENTION = 4

EDIT_TYPES = {
    EDIT_UNDEFINED: "notice",
    EDIT_NO_FILE_READ: "no file read",
    EDIT_READ_FILE: "read_file",
    EDIT_FILE_CHANGE: "file change",
    EDIT_FILE_MENTION: "file mention",
}
"""What each edit type marks, as a person reads it."""

SHORTENED_NOTICE = "[ctxwin] This content was shortened to fit the model's context window"
"""How the text of a message too large for the budget begins its notice, in the middle of
what is left of it (``auto``, docs/STRATEGIES.md; edit type :data:`EDIT_NO_FILE_READ`)."""
STUB_START = "[ctxwin] The result of "
STUB_END = " was removed to save context ("
"""A tool result ``auto`` stubbed says ``[ctxwin] The result of TOOL(ARGS) was removed to
save context (N tokens); ...`` (edit type :data:`EDIT_NO_FILE_READ`)."""


def edit_label(edit_type: int, text: str | None = None) -> str:
    """What an edit did, as a person reads it: ``shortened`` or ``stubbed`` when its text
    (the latest update's) says so, else what its edit type marks (:data:`EDIT_TYPES`)."""
    if text is not None:
        if SHORTENED_NOTICE in text:
            return "shortened"
        start = text.find(STUB_START)
        if start >= 0 and STUB_END in text[start:]:
            return "stubbed"
    return EDIT_TYPES.get(edit_type, str(edit_type))


Update = list[Any]
"""One edit as stored: ``[ts, kind, [text, ...], metadata]``."""


class OverlayFormatError(ValueError):
    """Overlay data that does not have the on-disk shape of SPEC.md §1."""


@dataclass(frozen=True, slots=True)
class MessageEdits:
    """The edits of one message.

    Attributes:
        message: the message's index in the history.
        edit_type: the message's edit type (``EDIT_*``).
        blocks: each edited block's updates as stored, oldest first, by block index.
    """

    message: int
    edit_type: int
    blocks: dict[int, list[Update]]


def update_text(update: Update) -> str | None:
    """The text a ``"text"`` update sets, or None for any other kind."""
    if update[1] == "text":
        text: str = update[2][0]
        return text
    return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _int_and_list(value: object) -> bool:
    """Whether ``value`` is ``[int, list]``."""
    return (
        isinstance(value, list)
        and len(value) == 2
        and _is_int(value[0])
        and isinstance(value[1], list)
    )


def check_update(update: object, where: str) -> Update:
    """``update`` if it has the stored shape of an update.

    Raises:
        OverlayFormatError: it does not.
    """
    if (
        not isinstance(update, list)
        or len(update) < 3
        or not _is_number(update[0])
        or not isinstance(update[1], str)
        or not isinstance(update[2], list)
    ):
        raise OverlayFormatError(f"{where}: an update must be [ts, kind, [text, ...], metadata]")
    if update[1] == "text" and (not update[2] or not isinstance(update[2][0], str)):
        raise OverlayFormatError(f"{where}: a text update must carry its text first")
    return update


def read_overlay(data: object) -> list[MessageEdits]:
    """The messages an on-disk overlay edits, in stored order.

    Args:
        data: the overlay as stored or as ``inspect`` returns it (``updates``).

    Raises:
        OverlayFormatError: ``data`` does not have the shape of SPEC.md §1.
    """
    if not isinstance(data, list):
        raise OverlayFormatError("the overlay must be a list of [message_index, entry]")
    found: list[MessageEdits] = []
    for position, item in enumerate(data):
        where = f"entry {position}"
        if not isinstance(item, list) or len(item) != 2 or not _is_int(item[0]):
            raise OverlayFormatError(f"{where}: expected [message_index, [type, blocks]]")
        index, body = item
        if not _int_and_list(body):
            raise OverlayFormatError(f"{where}: expected [edit_type, [[block, updates], ...]]")
        edits = MessageEdits(index, body[0], {})
        for block_item in body[1]:
            if not _int_and_list(block_item):
                raise OverlayFormatError(f"{where}: expected [block_index, [update, ...]]")
            block, updates = block_item
            edits.blocks[block] = [check_update(u, f"{where} block {block}") for u in updates]
        found.append(edits)
    return found
