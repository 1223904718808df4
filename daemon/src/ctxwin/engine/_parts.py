"""Content parts the engine does not edit, as token counts see them (docs/DIALECTS.md, Tokens).

A dialect maps every part it does not read as text, a call or a result into
an ``opaque`` internal block (sent as it is, never edited). What such a block
counts for is said here, once for every dialect:

- a reasoning part the dialect knows (a thinking block, a reasoning item) by
  its visible text, never by its signature or encrypted payload;
- an image, audio or file part (:data:`MEDIA_TYPES`) as a fixed figure, as
  an Anthropic ``image`` block is (the daemon's ``IMAGE_TOKENS``);
- any other part, whose type ctxwin does not recognise (a converter's
  ``tool_output``), by the text it holds (:func:`held_text`): never as
  nothing. Its type is kept on the block (:data:`UNREAD`), so that
  ``count_tokens`` can say which part types it did not recognise
  (:func:`unrecognised`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

__all__ = [
    "CLINE_KINDS",
    "MEDIA",
    "MEDIA_TYPES",
    "UNREAD",
    "held_text",
    "media_or_unread",
    "unrecognised",
]

MEDIA = "media"
"""Key of an opaque block standing for an image, audio or file part (counted as an image)."""
UNREAD = "unread"
"""Key of an opaque block: the type of the part it stands for, which ctxwin does not
recognise (counted by the text it holds)."""

MEDIA_TYPES = frozenset(
    {
        "image",
        "image_url",
        "input_image",
        "audio",
        "input_audio",
        "file",
        "input_file",
        "document",
        "computer_screenshot",
        "image_generation_call",
        "inlineData",
        "inline_data",
        "fileData",
        "file_data",
    }
)
"""Part types (and Gemini part keys) of images, audio and files: Anthropic's
``image`` and ``document``, Chat Completions' ``image_url``, ``input_audio`` and
``file``, Responses' ``input_image``, ``input_file``, ``computer_screenshot``
and ``image_generation_call``, Gemini's ``inlineData`` and ``fileData``. Their
data is base64 or a reference, never text the model reads as such."""

CLINE_KINDS = frozenset({"text", "tool_use", "tool_result", "thinking", "redacted_thinking"})
"""The block types of the Cline dialect (SPEC.md §1) counted by their own rules; with
:data:`MEDIA_TYPES` and the engine's ``opaque``, every other one is not recognised."""

_TEXT_KEYS = ("text", "content", "output")
"""Where a part that ctxwin does not recognise holds its text, in this order."""
_SECRET_KEYS = frozenset(
    {"signature", "thoughtSignature", "thought_signature", "encrypted_content", "data"}
)
"""Keys whose values are no text a model reads (signatures, encrypted or base64 payloads)."""
_DEPTH = 64
"""How deep :func:`held_text` follows nested lists and maps."""


def held_text(value: object, depth: int = 0) -> str:
    """The text a part holds, for counting a part ctxwin does not recognise.

    A string is itself; a list, the texts of its items, a line each; a map,
    the texts of its ``text``, ``content`` and ``output`` (any of these
    nested as deep as they go), else the map itself as compact JSON without
    its signatures and payloads. So a part never counts as nothing: at worst
    it counts as its JSON.
    """
    if isinstance(value, str):
        return value
    if value is None or depth > _DEPTH:
        return ""
    if isinstance(value, list):
        texts = (held_text(item, depth + 1) for item in value)
        return "\n".join(text for text in texts if text)
    if isinstance(value, dict):
        inner = (held_text(value[key], depth + 1) for key in _TEXT_KEYS if key in value)
        found = "\n".join(text for text in inner if text)
        if found:
            return found
        value = {key: item for key, item in value.items() if key not in _SECRET_KEYS}
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=repr)
    except (TypeError, ValueError, RecursionError):
        return ""


def media_or_unread(part: object, kind: object) -> dict[str, Any]:
    """The fields of the opaque block of a part of type ``kind`` that its dialect reads
    neither as text nor as reasoning: an image, audio or file (:data:`MEDIA`), or a
    part ctxwin does not recognise, counted by the text it holds (:data:`UNREAD`)."""
    if isinstance(kind, str) and kind in MEDIA_TYPES:
        return {"visible": "", MEDIA: True}
    name = kind if isinstance(kind, str) and kind else "(no type)"
    return {"visible": held_text(part), UNREAD: name}


def unrecognised(messages: Iterable[Any]) -> dict[str, int]:
    """The part types ctxwin does not recognise in messages of the internal form, with how
    many parts of each (tool results' contents included): the opaque blocks a dialect made
    of them (:data:`UNREAD`), and in the Cline dialect every block type besides
    :data:`CLINE_KINDS` and :data:`MEDIA_TYPES`."""
    found: dict[str, int] = {}
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            _tally(content, found)
    return found


def _tally(blocks: list[Any], found: dict[str, int]) -> None:
    for item in blocks:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "opaque":
            name = item.get(UNREAD)
        elif kind == "tool_result":
            inner = item.get("content")
            if isinstance(inner, list):
                _tally(inner, found)
            continue
        elif isinstance(kind, str) and (kind in CLINE_KINDS or kind in MEDIA_TYPES):
            continue
        else:
            name = kind if isinstance(kind, str) and kind else "(no type)"
        if isinstance(name, str):
            found[name] = found.get(name, 0) + 1
