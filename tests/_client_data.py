"""Conversations and models shared by the client tests."""

from __future__ import annotations

from typing import Any

from ctxwin import proto
from ctxwin.proto import Model

MODEL: Model = {"id": "test-model", "context_window": 64000}
PONG: dict[str, Any] = {
    "pong": True,
    "version": "0.1.0",
    "proto": 1,
    "features": list(proto.FEATURES),
    "dialects": list(proto.DIALECTS),
}
"""What the daemon's ping answers, as both clients return it."""


def conversation(turns: int = 10, prefix: str = "") -> list[dict[str, Any]]:
    """The task pair then ``turns`` user/assistant pairs of text blocks."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": f"{prefix}the task"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "on it"}]},
    ]
    for turn in range(turns):
        messages.append({"role": "user", "content": [{"type": "text", "text": f"user {turn}"}]})
        messages.append(
            {"role": "assistant", "content": [{"type": "text", "text": f"reply {turn}"}]}
        )
    return messages


def read_file_result(path: str, body: str) -> dict[str, Any]:
    """A user message carrying a read_file tool result in the new single-block format."""
    return {
        "role": "user",
        "content": [{"type": "text", "text": f"[read_file for '{path}'] Result:\n{body}"}],
    }


def with_duplicate_reads(copies: int = 3, size: int = 4000) -> list[dict[str, Any]]:
    """A conversation that reads the same file ``copies`` times (SPEC.md §6 material)."""
    messages = conversation(1)
    for copy in range(copies):
        messages.append(read_file_result("src/app.py", f"# copy {copy}\n" + "x = 1\n" * size))
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "read"}]})
    messages.append({"role": "user", "content": [{"type": "text", "text": "go on"}]})
    return messages
