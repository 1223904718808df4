"""Saved conversations in the shapes agents write them, and the dialect each shape is in.

- a JSON array of messages (Cline's ``api_conversation_history.json``, or any
  dialect's message list);
- a JSON object holding ``messages`` (OpenAI Chat or Anthropic), ``input``
  (OpenAI Responses) or ``contents`` (Gemini);
- a Claude Code JSONL event log: ``user``/``assistant`` lines hold an
  Anthropic ``message``; the lines of one API response share ``message.id``
  and are merged into one message; bookkeeping lines are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["About", "detect_dialect", "load_conversation", "parse_conversation", "user_side"]

_CLAUDE_CODE_TYPES = ("user", "assistant")


class ConversationFormatError(ValueError):
    """A file that holds no conversation in a known shape."""


@dataclass(slots=True)
class About:
    """What a file says besides its messages.

    Attributes:
        model: the model it names (an object's ``model``, a Claude Code log's
            ``message.model``, a Cline message's ``modelInfo.modelId``), or None.
        notes: what was left out of it, for people (a JSONL log's last line cut short).
    """

    model: str | None = None
    notes: list[str] = field(default_factory=list)


def _model_of(data: Mapping[str, Any], messages: Sequence[Any]) -> str | None:
    """The model a file names: its own ``model``, else the first message's that names one."""
    named = data.get("model")
    if isinstance(named, str) and named:
        return named
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        info = message.get("modelInfo")
        if isinstance(info, Mapping) and isinstance(info.get("modelId"), str):
            return str(info["modelId"])
    return None


def _log_model(lines: list[Any]) -> str | None:
    """The model of a Claude Code log's first assistant line that names a real one."""
    for line in lines:
        message = line.get("message") if isinstance(line, dict) else None
        model = message.get("model") if isinstance(message, dict) else None
        if isinstance(model, str) and model and not model.startswith("<"):
            return model  # "<synthetic>" marks lines the agent made up itself
    return None


def _claude_code_log(lines: list[Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    last_id: object = None
    for line in lines:
        if not isinstance(line, dict) or line.get("type") not in _CLAUDE_CODE_TYPES:
            continue
        message = line.get("message")
        if not isinstance(message, dict) or message.get("role") not in _CLAUDE_CODE_TYPES:
            continue
        content = message.get("content")
        blocks = list(content) if isinstance(content, list) else content
        message_id = message.get("id") if message.get("role") == "assistant" else None
        if message_id is not None and message_id == last_id and isinstance(blocks, list):
            previous = messages[-1]["content"]
            if isinstance(previous, list):
                previous.extend(blocks)
                continue
        last_id = message_id
        messages.append({"role": message["role"], "content": blocks})
    return messages


def detect_dialect(messages: Sequence[Any], hint: str = "") -> str:
    """The dialect a message list is in, from its shape (``hint``: the key it was under)."""
    if hint == "contents":
        return "gemini"
    if hint == "input":
        return "openai-responses"
    kinds: set[str] = set()
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        if "parts" in message:
            return "gemini"
        kind = message.get("type")
        if isinstance(kind, str) and kind != "message":
            return "openai-responses"
        if message.get("role") in ("tool", "system", "developer") or "tool_calls" in message:
            return "openai-chat"
        content = message.get("content")
        if isinstance(content, list):
            kinds.update(str(block.get("type")) for block in content if isinstance(block, Mapping))
    if kinds & {"input_text", "output_text"}:
        return "openai-responses"
    if hint == "messages":
        return "anthropic"  # an object with Anthropic-shaped messages, not Cline's file
    return "cline"


def _jsonl(text: str, about: About | None) -> list[Any]:
    """The lines of a JSONL file. A last line cut short with no newline after it (a log
    being written) is left out, with a note; any other bad line is refused by its number."""
    lines = text.splitlines()
    last = max((number for number, line in enumerate(lines) if line.strip()), default=-1)
    parsed: list[Any] = []
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            parsed.append(json.loads(line))
        except ValueError as exc:
            where = f"line {number + 1}"
            if isinstance(exc, json.JSONDecodeError):
                where += f", column {exc.colno}: {exc.msg}"
            if number == last and not text.endswith("\n") and parsed:
                if about is not None:
                    about.notes.append(
                        f"the last line ({where}) is cut short (still being written?): left out"
                    )
                continue
            raise ConversationFormatError(f"not JSON, nor a JSONL event log ({where})") from None
    return parsed


def _checked(messages: list[Any], key: str) -> list[dict[str, Any]]:
    """``messages`` when each one is an object.

    Raises:
        ConversationFormatError: naming the first that is not, or Cline's UI file.
    """
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            shown = "null" if message is None else type(message).__name__
            raise ConversationFormatError(f"{key}[{index}] is {shown}, not a message object")
    if messages and all(
        "role" not in message and message.get("type") in ("say", "ask") for message in messages
    ):
        raise ConversationFormatError(
            "this is Cline's ui_messages.json (the task's UI events, no model messages); "
            "replay the api_conversation_history.json next to it"
        )
    return messages


def parse_conversation(text: str, about: About | None = None) -> tuple[list[dict[str, Any]], str]:
    """The messages of a saved conversation and their dialect.

    Args:
        text: the file's text.
        about: filled in with what the file says besides (the model it names, what
            was left out of it).

    Raises:
        ConversationFormatError: the text holds no conversation in a known shape (naming
            the message or the line at fault).
    """
    stripped = text.lstrip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
        if not stripped.startswith("{"):
            raise ConversationFormatError("not JSON, nor a JSONL event log") from None
    about = about if about is not None else About()
    if data is None:
        lines = _jsonl(text, about)
        messages = _claude_code_log(lines)
        if not messages:
            raise ConversationFormatError("a JSONL file with no user or assistant lines")
        about.model = _log_model(lines)
        return messages, "anthropic"
    if isinstance(data, list):
        about.model = _model_of({}, data)
        return _checked(data, "messages"), detect_dialect(data)
    if isinstance(data, dict):
        for key in ("messages", "input", "contents"):
            found = data.get(key)
            if isinstance(found, list):
                about.model = _model_of(data, found)
                return _checked(found, key), detect_dialect(found, key)
        if isinstance(data.get("message"), dict):  # a JSONL log of one line
            about.model = _log_model([data])
            return _claude_code_log([data]), "anthropic"
    raise ConversationFormatError(
        "expected a list of messages, an object with messages, input or contents, "
        "or a Claude Code JSONL log"
    )


def load_conversation(path: Path, about: About | None = None) -> tuple[list[dict[str, Any]], str]:
    """:func:`parse_conversation` of a file.

    Raises:
        OSError: the file cannot be read.
        ConversationFormatError: it holds no conversation in a known shape.
    """
    return parse_conversation(path.read_text(encoding="utf-8"), about)


def user_side(message: Mapping[str, Any], dialect: str) -> bool:
    """Whether ``message`` is the user's side of a turn (a model request may follow it)."""
    role = message.get("role")
    if dialect == "openai-chat":
        return role in ("user", "tool")
    if dialect == "openai-responses":
        kind = message.get("type")
        return role == "user" or (isinstance(kind, str) and kind.endswith("_output"))
    return role == "user"
