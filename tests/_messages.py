"""Messages of the internal (Anthropic-shaped) form, written by hand in tests."""

from __future__ import annotations

from typing import Any

__all__ = ["Message", "call", "result", "user"]

Message = dict[str, Any]


def user(text: str) -> Message:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def call(tool_id: str, name: str, arguments: dict[str, Any]) -> Message:
    return {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": tool_id, "name": name, "input": arguments}],
    }


def result(tool_id: str, text: str) -> Message:
    return {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": tool_id,
                "content": [{"type": "text", "text": text}],
            }
        ],
    }
