"""A message on the page: its body, preview and label, in each dialect.

A Cline message is drawn from its content blocks; a message of another
dialect from its own form (OpenAI Chat, OpenAI Responses, Anthropic,
Gemini), each part labelled, media described and never shown.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ctxwin import proto

from .._dialects import chars_of, message_chars
from ..replay import FILE_READ, NOTICE, REPAIRED, SHORTENED, STUBBED, SUMMARY

__all__ = ["message_item"]

_PREVIEW = 140
_BADGES = {
    NOTICE: "notice",
    FILE_READ: "read",
    SHORTENED: "read",
    STUBBED: "read",
    REPAIRED: "repair",
    SUMMARY: "summary",
}


def _text(value: Any) -> str:
    """A value as text: a string as it is, anything else as indented JSON (compact when
    nested too deeply to indent, a note when too deeply even for that)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, indent=1)
    except RecursionError:
        pass
    try:
        return json.dumps(value, ensure_ascii=False)
    except RecursionError:
        return "(nested too deeply to show)"


def _body(content: Any) -> str:
    """A message's content as HTML: each block a labelled, preformatted part."""
    if isinstance(content, str):
        return f"<pre>{html.escape(content)}</pre>"
    if not isinstance(content, list):
        return f"<pre>{html.escape(_text(content))}</pre>"
    parts: list[str] = []
    for block in content:
        if not isinstance(block, Mapping):
            parts.append(f"<pre>{html.escape(_text(block))}</pre>")
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append(f"<pre>{html.escape(str(block.get('text', '')))}</pre>")
        elif kind == "tool_use":
            parts.append(
                f'<div class="block">tool_use <b>{html.escape(str(block.get("name")))}</b> '
                f"<code>{html.escape(str(block.get('id')))}</code></div>"
                f"<pre>{html.escape(_text(block.get('input')))}</pre>"
            )
        elif kind == "tool_result":
            parts.append(
                '<div class="block">tool_result for '
                f"<code>{html.escape(str(block.get('tool_use_id')))}</code></div>"
                + _body(block.get("content"))
            )
        elif kind == "image":
            source = block.get("source")
            data = source.get("data") if isinstance(source, Mapping) else None
            size = len(data) if isinstance(data, str) else 0
            parts.append(f'<div class="block">image ({size:,} base64 characters, not shown)</div>')
        else:
            parts.append(
                f'<div class="block">{html.escape(str(kind))}</div>'
                f"<pre>{html.escape(_text(block))}</pre>"
            )
    return "".join(parts) or '<div class="block">(no content)</div>'


def _preview(content: Any) -> str:
    """The first words of a message: its text first, then tool calls, then tool results."""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        blocks = [block for block in content if isinstance(block, Mapping)]
        order = {"text": 0, "tool_use": 1, "image": 2, "tool_result": 3}
        pieces: list[str] = []
        for block in sorted(blocks, key=lambda block: order.get(str(block.get("type")), 4)):
            kind = block.get("type")
            if kind == "text":
                pieces.append(str(block.get("text", "")))
            elif kind == "tool_use":
                pieces.append(f"[{block.get('name')}]")
            elif kind == "tool_result":
                pieces.append("[result] " + _preview(block.get("content")))
            elif kind == "image":
                pieces.append("[image]")
            if sum(len(piece) for piece in pieces) > _PREVIEW:
                break
        text = " ".join(pieces)
    else:
        text = ""
    text = " ".join(text.split())
    return text if len(text) <= _PREVIEW else text[: _PREVIEW - 1] + "…"


# -- messages of the other dialects ---------------------------------------------

_MODEL_SIDE = {"assistant", "model"}
"""Roles of the model's own messages (drawn as the assistant's)."""


def _block(label: str, name: Any = None, code: Any = None) -> str:
    """A part's label line: its kind, a name in bold, an id in code."""
    text = html.escape(label)
    if name is not None:
        text += f" <b>{html.escape(str(name))}</b>"
    if code is not None:
        text += f" <code>{html.escape(str(code))}</code>"
    return f'<div class="block">{text}</div>'


def _pre(value: Any) -> str:
    return f"<pre>{html.escape(_text(value))}</pre>"


def _arguments(value: Any) -> str:
    """A call's arguments: a JSON string shown indented when it parses, else as it is."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):  # not JSON, or nested too deeply to parse here
            return _pre(value)
    return _pre(value)


def _other(part: Any, kind: Any) -> str:
    return _block(str(kind)) + _pre(part)


def _parts(content: Any, render: Any) -> str:
    """A string content as text, a list as each part rendered by ``render``."""
    if isinstance(content, str):
        return _pre(content)
    if content is None:
        return ""
    if not isinstance(content, list):
        return _pre(content)
    return "".join(render(part) if isinstance(part, Mapping) else _pre(part) for part in content)


def _media(label: str, part: Mapping[str, Any]) -> str:
    """An image, audio or file part: what it is, never its data."""
    for key in ("source", "image_url", "input_audio", "file", "inlineData", "inline_data"):
        inner = part.get(key)
        if isinstance(inner, Mapping):
            data = inner.get("data") or inner.get("file_data")
            if isinstance(data, str):
                return _block(f"{label} ({len(data):,} base64 characters, not shown)")
            url = inner.get("url") or inner.get("file_id") or inner.get("fileUri")
            if isinstance(url, str):
                return _block(label, code=url[:200])
        elif isinstance(inner, str):
            return _block(label, code=inner[:200])
    return _block(f"{label} (not shown)")


def _chat_part(part: Mapping[str, Any]) -> str:
    kind = part.get("type")
    if kind == "text":
        return _pre(part.get("text", ""))
    if kind == "refusal":
        return _block("refusal") + _pre(part.get("refusal", ""))
    if kind in ("image_url", "input_audio", "file"):
        return _media(str(kind).replace("_url", "").replace("input_", ""), part)
    return _other(part, kind)


def _chat_body(message: Mapping[str, Any]) -> str:
    """An OpenAI Chat message: its content, reasoning, tool calls, or the call it answers."""
    parts: list[str] = []
    if message.get("role") == "tool":
        parts.append(_block("result for", code=message.get("tool_call_id")))
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        parts.append(_block("reasoning") + _pre(reasoning))
    parts.append(_parts(message.get("content"), _chat_part))
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        parts.append(_block("refusal") + _pre(refusal))
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        if not isinstance(call, Mapping):
            continue
        inner = call.get("function") or call.get("custom")
        inner = inner if isinstance(inner, Mapping) else {}
        parts.append(_block("tool call", inner.get("name"), call.get("id")))
        parts.append(_arguments(inner.get("arguments", inner.get("input"))))
    return "".join(parts)


def _anthropic_part(part: Mapping[str, Any]) -> str:
    kind = part.get("type")
    if kind == "text":
        return _pre(part.get("text", ""))
    if kind in ("tool_use", "server_tool_use"):
        return _block(str(kind), part.get("name"), part.get("id")) + _pre(part.get("input"))
    if kind == "tool_result" or str(kind).endswith("_tool_result"):
        error = " (error)" if part.get("is_error") else ""
        return _block(f"{kind}{error} for", code=part.get("tool_use_id")) + _parts(
            part.get("content"), _anthropic_part
        )
    if kind == "thinking":
        return _block("thinking") + _pre(part.get("thinking", ""))
    if kind == "redacted_thinking":
        data = part.get("data")
        size = len(data) if isinstance(data, str) else 0
        return _block(f"redacted thinking ({size:,} characters, not shown)")
    if kind in ("image", "document"):
        return _media(str(kind), part)
    return _other(part, kind)


def _responses_part(part: Mapping[str, Any]) -> str:
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
        return _pre(part.get("text", ""))
    if kind == "refusal":
        return _block("refusal") + _pre(part.get("refusal", ""))
    if kind in ("input_image", "input_file", "input_audio"):
        return _media(str(kind).replace("input_", ""), part)
    return _other(part, kind)


def _responses_body(item: Mapping[str, Any]) -> str:
    """An OpenAI Responses item: a message, a call, its output, reasoning, or another item."""
    kind = item.get("type", "message")
    if kind == "message":
        return _parts(item.get("content"), _responses_part)
    if kind in ("function_call", "custom_tool_call"):
        label = kind.replace("_", " ")
        arguments = item.get("arguments", item.get("input"))
        return _block(label, item.get("name"), item.get("call_id")) + _arguments(arguments)
    if isinstance(kind, str) and kind.endswith("_call_output"):
        output = item.get("output")
        return _block(kind.replace("_", " ") + " for", code=item.get("call_id")) + _parts(
            output, _responses_part
        )
    if kind == "reasoning":
        parts = [_block("reasoning")]
        for key in ("summary", "content"):
            inner = item.get(key)
            if isinstance(inner, list):
                parts.append(_parts(inner, _responses_part))
        if item.get("encrypted_content"):
            parts.append(_block("encrypted reasoning (not shown)"))
        return "".join(parts)
    return _other(item, kind)


def _gemini_part(part: Mapping[str, Any]) -> str:
    call = part.get("functionCall", part.get("function_call"))
    if isinstance(call, Mapping):
        return _block("functionCall", call.get("name"), call.get("id")) + _pre(call.get("args"))
    answer = part.get("functionResponse", part.get("function_response"))
    if isinstance(answer, Mapping):
        return _block("functionResponse", answer.get("name"), answer.get("id")) + _pre(
            answer.get("response")
        )
    text = part.get("text")
    if isinstance(text, str):
        return (_block("thought") if part.get("thought") else "") + _pre(text)
    for key in ("inlineData", "inline_data", "fileData", "file_data"):
        if isinstance(part.get(key), Mapping):
            return _media("data", part)
    return _other(part, next(iter(part), "part"))


def _native_body(message: Mapping[str, Any], dialect: str) -> str:
    """A message of a dialect other than Cline's as HTML, each part labelled."""
    if dialect == "openai-chat":
        body = _chat_body(message)
    elif dialect == "openai-responses":
        body = _responses_body(message)
    elif dialect == "gemini":
        body = _parts(message.get("parts"), _gemini_part)
    else:
        body = _parts(message.get("content"), _anthropic_part)
    return body or '<div class="block">(no content)</div>'


def _pieces(value: Any, found: list[tuple[int, str]], result: bool = False) -> None:
    """What a preview shows of a part, with its order: texts, calls, media, results."""
    if isinstance(value, str):
        found.append((3 if result else 0, value))
        return
    if isinstance(value, list):
        for item in value:
            _pieces(item, found, result)
        return
    if not isinstance(value, Mapping):
        return
    kind = value.get("type")
    call = value.get("functionCall", value.get("function_call"))
    answer = value.get("functionResponse", value.get("function_response"))
    function = value.get("function")
    if isinstance(call, Mapping):
        found.append((1, f"[{call.get('name')}]"))
    elif isinstance(answer, Mapping):
        found.append((3, f"[result] {_text(answer.get('response'))}"))
    elif kind in ("tool_use", "server_tool_use", "function_call", "custom_tool_call"):
        found.append((1, f"[{value.get('name')}]"))
    elif isinstance(function, Mapping):
        found.append((1, f"[{function.get('name')}]"))
    elif kind == "tool_result" or (isinstance(kind, str) and kind.endswith("_output")):
        inner: list[tuple[int, str]] = []
        _pieces(value.get("content", value.get("output")), inner, True)
        found.append((3, "[result] " + " ".join(text for _, text in inner)))
    elif kind in ("image", "image_url", "input_image") or "inlineData" in value:
        found.append((2, "[image]"))
    elif kind in ("thinking", "redacted_thinking", "reasoning") or value.get("thought"):
        return  # the model's reasoning: not what the message says
    elif isinstance(value.get("text"), str):
        found.append((3 if result else 0, str(value["text"])))
    elif "content" in value:
        _pieces(value["content"], found, result)


def _native_preview(message: Mapping[str, Any], dialect: str) -> str:
    """The first words of a message of another dialect: text, then calls, then results."""
    found: list[tuple[int, str]] = []
    if dialect == "openai-chat" and message.get("role") == "tool":
        _pieces(message.get("content"), found, True)
        found = [(3, "[result] " + " ".join(text for _, text in found))]
    elif dialect == "openai-responses" and message.get("type", "message") != "message":
        _pieces(message, found)
    else:
        _pieces(message.get("parts", message.get("content")), found)
        _pieces(message.get("tool_calls"), found)
    pieces: list[str] = []
    for _, piece in sorted(found, key=lambda item: item[0]):
        pieces.append(piece)
        if sum(len(text) for text in pieces) > _PREVIEW:
            break
    text = " ".join(" ".join(pieces).split())
    return text if len(text) <= _PREVIEW else text[: _PREVIEW - 1] + "…"


def _role(message: Mapping[str, Any], dialect: str) -> tuple[str, str]:
    """A message's label and its CSS class (``assistant`` for the model's side)."""
    role = message.get("role")
    kind = message.get("type")
    label = str(role) if role is not None else str(kind or "?")
    if dialect == "openai-responses" and kind not in (None, "message"):
        label = str(kind)
        side = "user" if str(kind).endswith("_output") else "assistant"
    else:
        side = "assistant" if role in _MODEL_SIDE else str(role)
    return label, side


def message_item(
    index: int,
    message: Mapping[str, Any],
    tokens: int,
    hidden: bool,
    variant: int | None = None,
    kinds: Sequence[str] = (),
    dialect: str = proto.CLINE,
    added: bool = False,
) -> str:
    """One message as an item of the page's list: its number, role, tokens, characters,
    badges and preview, its body folded under them."""
    badges = "".join(
        f'<span class="badge {_BADGES.get(kind, "other")}">{html.escape(kind)}</span>'
        for kind in kinds
    )
    if dialect == proto.CLINE:
        role = css = str(message.get("role", "?"))
        content = message.get("content")
        chars, preview, body = chars_of(content), _preview(content), _body(content)
    else:
        role, css = _role(message, dialect)
        chars = message_chars(message, dialect)
        preview = _native_preview(message, dialect)
        body = _native_body(message, dialect)
    attributes = f'class="msg {html.escape(css)}" data-i="{index}" data-t="{tokens}"'
    if variant is not None:
        attributes += f' data-v="{variant}"'
    if hidden:
        attributes += " hidden"
    number = (
        f'<span class="idx" title="added by the view">+#{index}</span>'
        if added
        else f'<span class="idx">#{index}</span>'
    )
    return (
        f"<li {attributes}><details><summary>"
        f'{number}<span class="role">{html.escape(role)}</span>'
        f'<span class="tok">{tokens:,} tok</span>'
        f'<span class="chars">{chars:,} chars</span>{badges}'
        f'<span class="preview">{html.escape(preview)}</span>'
        f"</summary>{body}</details></li>"
    )
