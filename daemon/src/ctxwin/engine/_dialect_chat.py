"""The OpenAI Chat Completions dialect (docs/DIALECTS.md, "openai-chat").

``messages`` with roles ``system``/``developer`` (kept out), ``user``,
``assistant`` (``content`` a string, null or parts; ``tool_calls``;
``reasoning_content`` as an opaque part) and ``tool`` (one result each,
``tool_call_id``). A tool message must follow its assistant message at once,
so a message with calls ends its turn.
"""

from __future__ import annotations

from typing import Any

from ._blocks import Block, Message
from ._dialect import (
    ASSISTANT,
    KEPT_OUT,
    PART,
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
    WHOLE,
    call_block,
    inner_blocks,
    outer_content,
    parse_arguments,
    result_block,
    text_parts,
    written_content,
)

REASONING = "reasoning_content"
KEPT_OUT_ROLES = ("system", "developer")


class ChatDialect(Dialect):
    """OpenAI Chat Completions messages."""

    name = "openai-chat"
    calls_end_turn = True
    merges_calls = True

    def map_message(self, message: Any, index: int, history: MappedLike) -> Mapped:
        if not isinstance(message, dict):
            raise DialectError(" must be a map")
        role = message.get("role")
        if role in KEPT_OUT_ROLES:
            return KEPT_OUT
        if role == USER:
            kinds = ("text",)
            return Mapped(USER, text_parts(message.get("content"), index, kinds))
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise DialectError(".tool_call_id must be a string")
            content = message.get("content")
            if isinstance(content, str):
                inner = [{"type": "text", "text": content}]
            elif isinstance(content, list):
                inner = inner_blocks(content)
            else:
                raise DialectError(".content must be a string or a list of parts")
            return Mapped(USER, [result_block(index, WHOLE, call_id, inner)])
        if role != ASSISTANT:
            raise DialectError(
                ".role must be 'system', 'developer', 'user', 'assistant' or 'tool' "
                "in the openai-chat dialect"
            )
        blocks: list[Block] = []
        reasoning = message.get(REASONING)
        if isinstance(reasoning, str) and reasoning:
            blocks.append(block("opaque", index, REASONING, visible=reasoning))
        blocks.extend(text_parts(message.get("content"), index, ("text",)))
        calls = message.get("tool_calls")
        if calls is None:
            return Mapped(ASSISTANT, blocks)
        if not isinstance(calls, list):
            raise DialectError(".tool_calls must be a list")
        for place, call in enumerate(calls):
            if not isinstance(call, dict) or not isinstance(call.get("id"), str):
                raise DialectError(f".tool_calls[{place}] must be a map with a string id")
            function = call.get("function") if call.get("type", "function") == "function" else None
            if function is None:
                function = call.get("custom")
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise DialectError(
                    f".tool_calls[{place}].function must be a map with a string name"
                )
            arguments = parse_arguments(function.get("arguments", function.get("input")))
            part = ("tool_calls", place)
            blocks.append(call_block(history, index, part, call["id"], function["name"], arguments))
        return Mapped(ASSISTANT, blocks, bool(calls))

    def holds_results(self, message: Message) -> bool:
        return message.get("role") == "tool"

    def merged(self, out: list[tuple[int | None, Message]]) -> list[tuple[int | None, Message]]:
        # The API answers an assistant message's calls with the tool messages right after
        # it: calls split over consecutive assistant messages go out as one message.
        joined: list[tuple[int | None, Message]] = []
        for index, message in out:
            if joined and _calls_of(message) and _calls_of(joined[-1][1]):
                first, held = joined[-1]
                joined[-1] = (first, _joined(held, message))
            else:
                joined.append((index, message))
        return joined

    def joins(self, previous: Mapped, mapped: Mapped) -> bool:
        # Calls split over consecutive assistant messages (as logs converted from
        # other agents have them) are one turn, answered by the tool messages
        # after the last; an assistant message without calls after a call starts
        # a new turn, and the call without a result is answered before it.
        return not (previous.calls and mapped.role == ASSISTANT and not mapped.calls)

    def rebuild(
        self, source: Message, index: int, role: str, blocks: list[Block], history: MappedLike
    ) -> list[Message]:
        mapped = originals(history, index)
        if source.get("role") == "tool":
            out = self.fresh(role, [b for b in blocks if b.get(SRC) is None], history)
            own = [b for b in blocks if b.get(SRC) is not None]
            if own:
                inner = outer_content(source.get("content"), own[0]["content"], _inner(mapped))
                out.append({**source, "content": inner})
            return out
        if role == USER:
            new = [b for b in blocks if b["type"] == "tool_result"]
            out = self.fresh(role, new, history)
            texts = [b for b in blocks if b["type"] == "text"]
            kept = [b for b in blocks if b.get(SRC) is not None]
            if kept:
                content = written_content(source.get("content"), texts, mapped)
                if isinstance(content, list):
                    present = {b.get(PART) for b in kept}
                    content = [
                        part
                        for place, part in enumerate(content)
                        if place in present or place not in mapped
                    ]
                out.append({**source, "content": content})
            return out
        texts = [b for b in blocks if b["type"] == "text"]
        rebuilt = {**source, "content": written_content(source.get("content"), texts, mapped)}
        return [rebuilt]

    def fresh(self, role: str, blocks: list[Block], history: MappedLike) -> list[Message]:
        out: list[Message] = []
        for item in blocks:
            if item["type"] == "tool_result":
                out.append(
                    {"role": "tool", "tool_call_id": item["tool_use_id"], "content": _text(item)}
                )
            else:
                out.append({"role": role, "content": item.get("text", "")})
        return out


def _calls_of(message: Message) -> bool:
    return message.get("role") == ASSISTANT and bool(message.get("tool_calls"))


def _joined(first: Message, second: Message) -> Message:
    """Two assistant messages with calls as one: contents and reasoning joined, calls in order."""
    joined = {**first, "tool_calls": [*first["tool_calls"], *second["tool_calls"]]}
    content = _joined_content(first.get("content"), second.get("content"))
    if content is not None or "content" in first:
        joined["content"] = content
    reasoning = [m.get(REASONING) for m in (first, second) if isinstance(m.get(REASONING), str)]
    if reasoning:
        joined[REASONING] = "\n\n".join(text for text in reasoning if text)
    return joined


def _joined_content(first: object, second: object) -> object:
    if first is None or first == "" or first == []:
        return second
    if second is None or second == "" or second == []:
        return first
    if isinstance(first, str) and isinstance(second, str):
        return first + "\n\n" + second
    parts: list[Any] = []
    for content in (first, second):
        if isinstance(content, str):
            parts.append({"type": "text", "text": content})
        elif isinstance(content, list):
            parts.extend(content)
    return parts


def _inner(mapped: dict[object, Block]) -> list[Block]:
    found = mapped.get(WHOLE)
    return found["content"] if found is not None else []


def _text(item: Block) -> str:
    """The text of a result block the view made (its content is a string)."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and content[0].get("type") == "text":
        text: str = content[0]["text"]
        return text
    return ""


CHAT = ChatDialect()
