"""Saved conversations in the shapes agents write them, the dialect each shape is in, and
the model a file names (the one a replay asks for, :func:`model_for`).

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

from ctxwin.proto import Model

from ..integrations._models import known_context_window
from ._dialects import detect_dialect

__all__ = [
    "About",
    "default_model",
    "load_conversation",
    "load_history",
    "model_for",
    "parse_conversation",
]

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


def load_history(path: Path) -> list[dict[str, Any]]:
    """The messages of an ``api_conversation_history.json``.

    Raises:
        ValueError: the file is not a JSON list of ``{role, content}`` maps.
    """
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list) or not all(
        isinstance(message, dict) and message.get("role") in ("user", "assistant")
        for message in data
    ):
        raise ValueError(f"{path} is not a list of {{role, content}} messages")
    return data


def default_model(history: Sequence[Mapping[str, Any]], window: int | None) -> Model:
    """The model of the history's first assistant ``modelInfo``, with the given window."""
    model = Model(id="unknown")
    for message in history:
        info = message.get("modelInfo")
        if isinstance(info, Mapping) and isinstance(info.get("modelId"), str):
            model["id"] = str(info["modelId"])
            if isinstance(info.get("providerId"), str):
                model["provider"] = str(info["providerId"])
            break
    if window is not None:
        model["context_window"] = window
    return model


def model_for(
    history: Sequence[Mapping[str, Any]],
    window: int | None,
    named: str | None = None,
    model_id: str | None = None,
) -> tuple[Model, str]:
    """The model a replay asks for, and where its window came from.

    Args:
        history: the conversation (a Cline message's ``modelInfo`` names its model).
        window: the window given (``--model-window``): it wins.
        named: the model the file names otherwise (:class:`About`).
        model_id: the model id given (``--model``), over the file's.

    Returns:
        The model (with ``context_window`` unless the daemon's default applies) and a
        phrase saying where the window came from.
    """
    model = default_model(history, window)
    if model_id:
        model["id"] = model_id
    elif model["id"] == "unknown" and named:
        model["id"] = named
    if window is not None:
        return model, "given with --model-window"
    known = known_context_window(model["id"])
    if known is not None:
        model["context_window"] = known
        return model, f"published for {model['id']}; --model-window to change"
    return model, "the daemon's default: the model is not a known one; --model-window to change"
