"""The Anthropic Messages dialect (docs/DIALECTS.md, "anthropic").

``messages`` of ``{"role": "user"|"assistant", "content": str | [block]}``;
``tool_use`` blocks in assistant messages, ``tool_result`` blocks in user
messages; ``thinking``/``redacted_thinking`` and every other block type are
opaque parts, sent as they are or dropped with their turn.
"""

from __future__ import annotations

from typing import Any

from ._blocks import Block, Message
from ._dialect import (
    ASSISTANT,
    PART,
    SRC,
    USER,
    Dialect,
    DialectError,
    Mapped,
    MappedLike,
    block,
)
from ._dialect_parts import WHOLE, call_block, inner_blocks, outer_content, result_block
from ._parts import media_or_unread

THINKING = ("thinking", "redacted_thinking")


def _opaque(part: dict[str, Any], kind: str) -> dict[str, Any]:
    """The fields of the opaque block of a part that is no text, call, result or image."""
    if kind in THINKING:  # counted by its visible thinking, never its signature or data
        thinking = part.get("thinking")
        return {"visible": thinking if isinstance(thinking, str) else ""}
    return media_or_unread(part, kind)


class AnthropicDialect(Dialect):
    """Anthropic Messages: the internal form's own shape, with opaque parts."""

    name = "anthropic"
    new_inside = True

    def map_message(self, message: Any, index: int, history: MappedLike) -> Mapped:
        if not isinstance(message, dict):
            raise DialectError(" must be a map")
        role = message.get("role")
        if role not in (USER, ASSISTANT):
            raise DialectError(
                ".role must be 'user' or 'assistant' in the anthropic dialect "
                "(the system prompt is not a message there)"
            )
        content = message.get("content")
        if isinstance(content, str):
            return Mapped(role, [{"type": "text", "text": content, SRC: index, PART: WHOLE}])
        if not isinstance(content, list):
            raise DialectError(".content must be a string or a list of blocks")
        blocks: list[Block] = []
        calls = False
        for place, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise DialectError(f".content[{place}] must be a map with a 'type'")
            kind = part["type"]
            if kind == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise DialectError(f".content[{place}].text must be a string")
                blocks.append({"type": "text", "text": text, SRC: index, PART: place})
            elif kind == "tool_use":
                tool_id = part.get("id")
                name = part.get("name")
                if not isinstance(tool_id, str) or not isinstance(name, str):
                    raise DialectError(f".content[{place}] needs a string id and name")
                blocks.append(call_block(history, index, place, tool_id, name, part.get("input")))
                calls = True
            elif kind == "tool_result":
                tool_use_id = part.get("tool_use_id")
                if not isinstance(tool_use_id, str):
                    raise DialectError(f".content[{place}].tool_use_id must be a string")
                inner = inner_blocks(part.get("content", ""), f".content[{place}].content")
                blocks.append(result_block(index, place, tool_use_id, inner))
            elif kind == "image":
                blocks.append(block("image", index, place, source=part.get("source")))
            else:
                blocks.append(block("opaque", index, place, **_opaque(part, kind)))
        return Mapped(role, blocks, calls)

    def _part(self, item: Block, source: Message, history: MappedLike) -> dict[str, Any]:
        content = source["content"]
        place = item.get(PART)
        if place == WHOLE:
            original: dict[str, Any] = {"type": "text", "text": content}
        elif isinstance(place, int):
            original = content[place]
        else:
            return _new_part(item)
        own = history.mapped[item["_src"]].blocks
        mapped = next((b for b in own if b.get(PART) == place), None)
        if mapped is item:
            return original
        if item["type"] == "text":
            return {**original, "text": item["text"]}
        if item["type"] == "tool_result" and mapped is not None:
            inner = outer_content(original.get("content", ""), item["content"], mapped["content"])
            return {**original, "content": inner}
        return original

    def rebuild(
        self, source: Message, index: int, role: str, blocks: list[Block], history: MappedLike
    ) -> list[Message]:
        parts = [self._part(item, source, history) for item in blocks]
        if not parts:
            return []
        if isinstance(source["content"], str) and len(blocks) == 1 and blocks[0].get(PART) == WHOLE:
            return [{**source, "content": parts[0]["text"]}]
        return [{**source, "content": parts}]

    def fresh(self, role: str, blocks: list[Block], history: MappedLike) -> list[Message]:
        return [{"role": role, "content": [_new_part(item) for item in blocks]}]


def _new_part(item: Block) -> dict[str, Any]:
    """The Anthropic form of a block the view added."""
    if item["type"] == "tool_result":
        inner = item.get("content")
        text = inner if isinstance(inner, str) else ""
        if isinstance(inner, list) and inner and inner[0].get("type") == "text":
            text = inner[0]["text"]
        return {"type": "tool_result", "tool_use_id": item["tool_use_id"], "content": text}
    return {"type": "text", "text": item.get("text", "")}


ANTHROPIC = AnthropicDialect()
