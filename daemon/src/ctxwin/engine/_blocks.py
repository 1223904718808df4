"""Reading and writing the text of content blocks (SPEC.md §1)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from ctxwin.proto import Message as WireMessage

Block = dict[str, Any]
Message = dict[str, Any]


def wire_view(view: list[Message]) -> list[WireMessage]:
    """A view as a result carries it: the same messages, typed as ``ctxwin.proto``'s."""
    return cast("list[WireMessage]", view)


def text_of(block: Mapping[str, Any]) -> str | None:
    """The text of a block: a text block's ``text``, or a tool result's first text block's.

    Returns:
        The text, or None for every other block (SPEC.md §1).
    """
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        return text if isinstance(text, str) else None
    if kind == "tool_result":
        content = block.get("content")
        if isinstance(content, list) and content:
            first = content[0]
            if isinstance(first, dict) and first.get("type") == "text":
                text = first.get("text")
                return text if isinstance(text, str) else None
    return None


def with_text(block: Block, text: str) -> Block:
    """A copy of ``block`` whose text (as :func:`text_of` reads it) is ``text``.

    Blocks without such a text come back as they are (not copied).
    """
    kind = block.get("type")
    if kind == "text":
        return {**block, "text": text}
    if kind == "tool_result":
        content = block.get("content")
        if isinstance(content, list) and content:
            first = content[0]
            if isinstance(first, dict) and first.get("type") == "text":
                return {**block, "content": [{**first, "text": text}, *content[1:]]}
    return block


def tool_calls(message: Message) -> dict[str, tuple[object, object]]:
    """An assistant message's tool calls: ``name`` and ``input`` by ``tool_use`` id.

    Returns:
        One entry per ``tool_use`` block with a string id; empty for any other message.
    """
    content = message.get("content")
    if message.get("role") != "assistant" or not isinstance(content, list):
        return {}
    return {
        block["id"]: (block.get("name"), block.get("input"))
        for block in content
        if block.get("type") == "tool_use" and isinstance(block.get("id"), str)
    }


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units: characters outside the BMP count 2 (SPEC.md §6)."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-16-le")) // 2
