"""The OpenAI Responses dialect (docs/DIALECTS.md, "openai-responses").

``input`` items: ``message`` items (``role`` system/developer kept out,
user, assistant), ``*_call`` items with a ``call_id`` (``function_call``,
``custom_tool_call``, ...) and their ``*_call_output`` items, ``reasoning``
items (opaque, with ``encrypted_content``) and any other item as an opaque
part of the assistant's turn.
"""

from __future__ import annotations

from typing import Any

from ._blocks import Block, Message
from ._dialect import (
    ASSISTANT,
    KEPT_OUT,
    SRC,
    USER,
    Dialect,
    DialectError,
    Mapped,
    MappedLike,
    block,
    originals,
)
from ._dialect_parts import (
    call_block,
    inner_blocks,
    outer_content,
    parse_arguments,
    result_block,
    text_parts,
    written_content,
)
from ._parts import media_or_unread

TEXT_KINDS = ("input_text", "output_text", "text")
ITEM = "item"


def _visible(item: dict[str, Any]) -> str:
    texts: list[str] = []
    for key in ("summary", "content"):
        parts = item.get(key)
        if isinstance(parts, list):
            for part in parts:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    texts.append(part["text"])
    return "\n".join(texts)


def _output_blocks(output: object) -> list[Block]:
    """An output item's ``output`` as internal blocks: texts, and opaque blocks for the rest.

    Raises:
        DialectError: a part of a list ``output`` is not a map.
    """
    if output is None or isinstance(output, str | list):
        return inner_blocks(output, ".output", TEXT_KINDS)
    return [{"type": "opaque", **media_or_unread(output, None)}]


class ResponsesDialect(Dialect):
    """OpenAI Responses input items."""

    name = "openai-responses"
    field = "input"

    def map_message(self, message: Any, index: int, history: MappedLike) -> Mapped:
        if not isinstance(message, dict):
            raise DialectError(" must be a map")
        kind = message.get("type")
        if kind is None or kind == "message":
            role = message.get("role")
            if role in ("system", "developer"):
                return KEPT_OUT
            if role not in (USER, ASSISTANT):
                raise DialectError(".role must be 'system', 'developer', 'user' or 'assistant'")
            return Mapped(role, text_parts(message.get("content"), index, TEXT_KINDS))
        if not isinstance(kind, str):
            raise DialectError(".type must be a string")
        call_id = message.get("call_id")
        if kind.endswith("_call_output"):
            if not isinstance(call_id, str):
                raise DialectError(".call_id must be a string")
            content = _output_blocks(message.get("output"))
            return Mapped(USER, [result_block(index, ITEM, call_id, content)])
        if kind.endswith("_call") and isinstance(call_id, str):
            name = message.get("name")
            name = name if isinstance(name, str) else kind
            arguments = parse_arguments(message.get("arguments", message.get("input")))
            call = call_block(history, index, ITEM, call_id, name, arguments)
            return Mapped(ASSISTANT, [call], True)
        if kind == "reasoning":
            fields: dict[str, Any] = {"visible": _visible(message)}
        elif kind == "item_reference":  # stands for an item the server holds
            fields = {"visible": ""}
        else:
            fields = media_or_unread(message, kind)
        return Mapped(ASSISTANT, [block("opaque", index, ITEM, **fields)])

    def joins(self, previous: Mapped, mapped: Mapped) -> bool:
        # Parallel calls are items of their own; anything else after a call is a new turn.
        return not (previous.calls and mapped.role == ASSISTANT and not mapped.calls)

    def holds_results(self, message: Message) -> bool:
        kind = message.get("type")
        return isinstance(kind, str) and kind.endswith("_call_output")

    def rebuild(
        self, source: Message, index: int, role: str, blocks: list[Block], history: MappedLike
    ) -> list[Message]:
        mapped = originals(history, index)
        new = [b for b in blocks if b.get(SRC) is None]
        own = [b for b in blocks if b.get(SRC) is not None]
        out = self.fresh(role, new, history)
        if not own:
            return out
        if self.holds_results(source):
            inner = mapped[ITEM]["content"]
            output = outer_content(source.get("output"), own[0]["content"], inner)
            out.append({**source, "output": output})
            return out
        if source.get("type", "message") == "message":
            content = written_content(source.get("content"), own, mapped)
            out.append({**source, "content": content})
            return out
        out.append(source)
        return out

    def fresh(self, role: str, blocks: list[Block], history: MappedLike) -> list[Message]:
        out: list[Message] = []
        for item in blocks:
            if item["type"] == "tool_result":
                call_id = item["tool_use_id"]
                kind = "function_call_output"
                call = history.calls.get(call_id)
                if call is not None and history.source[call[1]].get("type") == "custom_tool_call":
                    kind = "custom_tool_call_output"
                content = item.get("content")
                text = content if isinstance(content, str) else ""
                out.append({"type": kind, "call_id": call_id, "output": text})
            else:
                out.append({"type": "message", "role": role, "content": item.get("text", "")})
        return out


RESPONSES = ResponsesDialect()
