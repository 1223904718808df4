"""The Gemini dialect (docs/DIALECTS.md, "gemini").

``contents`` of ``{"role": "user"|"model", "parts": [...]}``; a part holds
``text``, ``functionCall`` or ``functionResponse`` (REST camelCase or the
Python SDK's snake_case); thought parts, parts with a thought signature and
every other part are opaque. A function response answers the call with its
``id``, or else the first unanswered call of that name in the turn before.
"""

from __future__ import annotations

import json
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
    originals,
)
from ._dialect_parts import call_block, result_block
from ._parts import media_or_unread

MODEL = "model"
CALL_KEYS = ("functionCall", "function_call")
RESPONSE_KEYS = ("functionResponse", "function_response")
SIGNATURE_KEYS = ("thoughtSignature", "thought_signature")
TEXT_KEYS = ("output", "content", "result")
SYNTHETIC = "ctxwin-call:"


def _first(part: dict[str, Any], keys: tuple[str, ...]) -> tuple[str, Any] | None:
    for key in keys:
        if key in part:
            return key, part[key]
    return None


def _named(found: tuple[str, Any], place: int) -> tuple[dict[str, Any], str | None]:
    """The body of part ``place``'s function call or response (found under its key), which
    must name the function, and the id it gives (None: none, or an empty one)."""
    key, body = found
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        raise DialectError(f".parts[{place}].{key} needs a string name")
    given = body.get("id")
    return body, given if isinstance(given, str) and given else None


def _answered(history: MappedLike) -> tuple[list[Block], set[str]]:
    """The calls of the last model turn and the ids already answered after it."""
    internal = history.internal
    answered: set[str] = set()
    for position in range(len(internal) - 1, -1, -1):
        message = internal[position]
        if message["role"] == ASSISTANT:
            calls = [b for b in message["content"] if b["type"] == "tool_use"]
            return calls, answered
        answered.update(b["tool_use_id"] for b in message["content"] if b["type"] == "tool_result")
    return [], answered


_CODE_KEYS = (
    ("executableCode", "code"),
    ("executable_code", "code"),
    ("codeExecutionResult", "output"),
    ("code_execution_result", "output"),
)
"""Parts of Gemini's code execution, and the key of the text each holds."""
_PLAIN_KEYS = frozenset({"thought", *SIGNATURE_KEYS, "metadata", "videoMetadata", "video_metadata"})
"""Keys of a part that say nothing of its kind."""


def _opaque(part: dict[str, Any], text: object) -> dict[str, Any]:
    """The fields of the opaque block of a part that is no plain text, call or response: a
    thought (or a text with a signature) by its text, code and its result by their text,
    media, and any other part by the text it holds, named by its first key."""
    if isinstance(text, str):
        return {"visible": text}
    for key, inner in _CODE_KEYS:
        body = part.get(key)
        if isinstance(body, dict):
            found = body.get(inner)
            return {"visible": found if isinstance(found, str) else ""}
    kind = next((key for key in part if key not in _PLAIN_KEYS), None)
    if kind is None:  # nothing but a signature (or a thought flag)
        return {"visible": ""}
    return media_or_unread(part[kind], kind)


class GeminiDialect(Dialect):
    """Gemini ``contents``."""

    name = "gemini"
    field = "contents"
    calls_end_turn = True
    new_inside = True

    def map_message(self, message: Any, index: int, history: MappedLike) -> Mapped:
        if not isinstance(message, dict):
            raise DialectError(" must be a map")
        role = message.get("role")
        if role not in (USER, MODEL):
            raise DialectError(".role must be 'user' or 'model' in the gemini dialect")
        parts = message.get("parts")
        if not isinstance(parts, list):
            raise DialectError(".parts must be a list")
        blocks: list[Block] = []
        calls = False
        pending: tuple[list[Block], set[str]] | None = None
        for place, part in enumerate(parts):
            if not isinstance(part, dict):
                raise DialectError(f".parts[{place}] must be a map")
            text = part.get("text")
            if len(part) == 1 and isinstance(text, str):  # a plain text part, the commonest
                blocks.append({"type": "text", "text": text, SRC: index, PART: place})
                continue
            call = _first(part, CALL_KEYS)
            response = _first(part, RESPONSE_KEYS)
            if call is not None:
                body, call_id = _named(call, place)
                if call_id is None:
                    call_id = f"{SYNTHETIC}{index}.{place}"
                blocks.append(
                    call_block(history, index, place, call_id, body["name"], body.get("args"))
                )
                calls = True
            elif response is not None:
                body, result_id = _named(response, place)
                if result_id is None:
                    if pending is None:
                        pending = _answered(history)
                    turn, answered = pending
                    result_id = f"ctxwin-orphan:{index}.{place}"
                    for candidate in turn:
                        if candidate["name"] == body["name"] and candidate["id"] not in answered:
                            result_id = candidate["id"]
                            break
                    answered.add(result_id)
                key, inner = _response_text(body.get("response"))
                result = result_block(index, place, result_id, inner)
                result["_key"] = key
                blocks.append(result)
            elif (
                isinstance(text, str)
                and not part.get("thought")
                and _first(part, SIGNATURE_KEYS) is None
            ):
                blocks.append({"type": "text", "text": text, SRC: index, PART: place})
            else:
                blocks.append(block("opaque", index, place, **_opaque(part, text)))
        return Mapped(ASSISTANT if role == MODEL else USER, blocks, calls)

    def _part(self, item: Block, source: Message, history: MappedLike) -> dict[str, Any]:
        place = item.get(PART)
        if item.get(SRC) is None or not isinstance(place, int):
            return self._new_part(item, history)
        original: dict[str, Any] = source["parts"][place]
        mapped = originals(history, item[SRC]).get(place)
        if mapped is item:
            return original
        if item["type"] == "text":
            return {**original, "text": item["text"]}
        if item["type"] == "tool_result" and item["content"]:
            found = _first(original, RESPONSE_KEYS)
            assert found is not None
            key, body = found
            text = item["content"][0].get("text", "")
            response = body.get("response")
            field = item.get("_key")
            if isinstance(response, dict) and field is not None:
                response = {**response, field: text}
            else:
                response = {"output": text}
            return {**original, key: {**body, "response": response}}
        return original

    def _new_part(self, item: Block, history: MappedLike) -> dict[str, Any]:
        if item["type"] != "tool_result":
            return {"text": item.get("text", "")}
        call_id: str = item["tool_use_id"]
        name, index = history.calls.get(call_id, ("", -1))
        key = "functionResponse"
        if index >= 0:
            for part in history.source[index].get("parts", ()):
                if isinstance(part, dict) and "function_call" in part:
                    key = "function_response"
        content = item.get("content")
        text = content if isinstance(content, str) else ""
        body: dict[str, Any] = {"name": name, "response": {"error": text}}
        if not call_id.startswith(SYNTHETIC):
            body["id"] = call_id
        return {key: body}

    def rebuild(
        self, source: Message, index: int, role: str, blocks: list[Block], history: MappedLike
    ) -> list[Message]:
        if not blocks:
            return []
        return [{**source, "parts": [self._part(item, source, history) for item in blocks]}]

    def fresh(self, role: str, blocks: list[Block], history: MappedLike) -> list[Message]:
        parts = [self._new_part(item, history) for item in blocks]
        return [{"role": MODEL if role == ASSISTANT else USER, "parts": parts}]


def _response_text(response: object) -> tuple[str | None, list[Block]]:
    """Which field of a function response holds its text, and that text as blocks."""
    if isinstance(response, dict):
        for key in TEXT_KEYS:
            value = response.get(key)
            if isinstance(value, str):
                return key, [{"type": "text", "text": value}]
    text = json.dumps(response, ensure_ascii=False, sort_keys=True, default=repr)
    return None, [{"type": "text", "text": text}]


GEMINI = GeminiDialect()
