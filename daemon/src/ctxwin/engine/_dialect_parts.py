"""Helpers the native dialects share: text and content parts in and out of the internal form,
the blocks of calls and their results.

Each dialect module (``_dialect_<name>.py``) imports only :mod:`._dialect`
(the interface and the block helpers) and this module.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from ._blocks import Block
from ._dialect import PART, SRC, DialectError, MappedLike, block
from ._parts import media_or_unread

WHOLE = "content"
"""The part of a message whose content is one string."""


# (value, end) of the JSON value at a position; typeshed does not declare it.
_SCAN: Callable[[str, int], tuple[object, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def call_block(
    history: MappedLike, index: int, part: object, call_id: str, name: str, arguments: object
) -> Block:
    """The ``tool_use`` block of a call in history message ``index``, the call recorded in
    ``history.calls`` (by id: its name and that index)."""
    history.calls[call_id] = (name, index)
    # What block() makes, written out: every call of a mapped message comes here.
    return {
        "type": "tool_use",
        "id": call_id,
        "name": name,
        "input": arguments,
        SRC: index,
        PART: part,
    }


def result_block(index: int, part: object, call_id: str, content: list[Block]) -> Block:
    """The ``tool_result`` block answering call ``call_id`` in history message ``index``."""
    # What block() makes, written out: every result of a mapped message comes here.
    return {
        "type": "tool_result",
        "tool_use_id": call_id,
        "content": content,
        SRC: index,
        PART: part,
    }


def parse_arguments(arguments: object) -> object:
    """A call's ``arguments`` JSON as a value (the string itself when it is not JSON, or JSON
    nested too deep to be parsed)."""
    if not isinstance(arguments, str):
        return arguments
    # The decoder's scanner at once (a quarter of json.loads' cost, which first
    # matches whitespace around the value); json.loads decides whatever it does not
    # read whole.
    try:
        value, end = _SCAN(arguments, 0)
    except (StopIteration, ValueError, RecursionError):
        end = -1
    if end == len(arguments):
        return value
    try:
        return json.loads(arguments)
    except (ValueError, RecursionError):  # nested deeper than the daemon follows: kept as text
        return arguments


def text_parts(content: object, index: int, kinds: tuple[str, ...]) -> list[Block]:
    """Internal blocks of a string or a list of content parts; parts of ``kinds`` are texts."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content, SRC: index, PART: WHOLE}]
    if not isinstance(content, list):
        raise DialectError(".content must be a string, null or a list of parts")
    blocks: list[Block] = []
    for place, part in enumerate(content):
        if not isinstance(part, dict):
            raise DialectError(f".content[{place}] must be a map")
        text = part.get("text")
        kind = part.get("type")
        if kind in kinds and isinstance(text, str):
            blocks.append({"type": "text", "text": text, SRC: index, PART: place})
        elif kind == "refusal":
            visible = part.get("refusal")
            blocks.append(
                block("opaque", index, place, visible=visible if isinstance(visible, str) else "")
            )
        else:
            blocks.append(block("opaque", index, place, **media_or_unread(part, kind)))
    return blocks


def written_content(original: object, texts: list[Block], mapped: dict[object, Block]) -> object:
    """``original`` content with the view's text blocks written back (new ones appended)."""
    if not isinstance(original, list):
        return "\n\n".join(item["text"] for item in texts) if texts else original
    out = list(original)
    for item in texts:
        place = item.get(PART)
        if isinstance(place, int) and item.get(SRC) is not None:
            if mapped.get(place) is not item:
                out[place] = {**out[place], "text": item["text"]}
        else:
            out.insert(0, {"type": "text", "text": item["text"]})
    return out


def inner_blocks(
    content: object, where: str = ".content", kinds: tuple[str, ...] = ("text",)
) -> list[Block]:
    """A result's content as internal blocks: text (parts of ``kinds``) stays text, everything
    else is opaque (counted as :func:`~._parts.media_or_unread` says).

    Raises:
        DialectError: an item of the content is not a map (named by ``where`` and its index).
    """
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        return []
    inner: list[Block] = []
    for place, item in enumerate(content):
        if not isinstance(item, dict):
            raise DialectError(f"{where}[{place}] must be a map")
        kind = item.get("type")
        if kind in kinds and isinstance(item.get("text"), str):
            inner.append({"type": "text", "text": item["text"]})
        else:
            inner.append({"type": "opaque", **media_or_unread(item, kind)})
    return inner


def outer_content(original: object, inner: list[Block], mapped: list[Block]) -> object:
    """A result's content with the texts the engine changed written back into ``original``."""
    if isinstance(original, str):
        return inner[0]["text"] if inner and inner[0].get("type") == "text" else original
    if not isinstance(original, list):
        return original
    out = list(original)
    for place, item in enumerate(inner[: len(out)]):
        if place < len(mapped) and item is not mapped[place] and item.get("type") == "text":
            part = out[place]
            if isinstance(part, dict):
                out[place] = {**part, "text": item["text"]}
    return out
