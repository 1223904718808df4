"""The replay's pure helpers: turns, text access, overlay parsing and application."""

from __future__ import annotations

from typing import Any

import pytest

from ctxwin.client._errors import BadReplyError
from ctxwin.client.cli._corpus import default_model
from ctxwin.client.cli._dialects import chars_of, request_points
from ctxwin.client.cli.replay import (
    original_text,
    parse_updates,
    set_text,
    text_of,
    with_overlay,
)

TOOL_RESULT: dict[str, Any] = {
    "type": "tool_result",
    "tool_use_id": "t1",
    "content": [{"type": "text", "text": "file body"}, {"type": "image"}],
}


def test_a_request_follows_every_user_message() -> None:
    """Requests are made after each user message, including a trailing one."""
    roles = ["user", "assistant", "user", "assistant", "user"]
    assert [1, 3, 5] == request_points([{"role": role} for role in roles])


def test_text_of_reads_text_blocks_and_first_text_of_tool_results() -> None:
    """text_of follows SPEC.md §1; set_text writes to the same place on a copy."""
    assert "hi" == text_of({"type": "text", "text": "hi"})
    assert "file body" == text_of(TOOL_RESULT)
    assert text_of({"type": "tool_use", "input": {}}) is None
    edited = set_text(TOOL_RESULT, "notice")
    assert "notice" == text_of(edited)
    assert "file body" == text_of(TOOL_RESULT)


def test_original_text_is_the_block_an_overlay_update_replaces() -> None:
    """The text a block holds in the file; none for a notice put in a new block (-1) or a
    message or block the history does not have."""
    history: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "task"}]},
        {"role": "user", "content": [{"type": "tool_use", "id": "t1"}, TOOL_RESULT]},
        {"role": "user", "content": "a string"},
    ]
    assert "task" == original_text(history, 0, 0)
    assert "file body" == original_text(history, 1, 1)
    assert original_text(history, 1, 0) is None  # no text in a tool_use
    assert original_text(history, 1, -1) is None  # a new block replaces no text
    assert original_text(history, 1, 2) is None
    assert original_text(history, 2, 0) is None
    assert original_text(history, 3, 0) is None


def test_overlay_parses_from_the_on_disk_form_and_applies_latest_text() -> None:
    """The on-disk overlay becomes (message, block) -> texts, the latest applied; bad is refused."""
    updates = [[2, [2, [[0, [[5, "text", ["old"], []], [9, "text", ["new"], []]]]]]]]
    overlay = parse_updates(updates)
    assert {(2, 0): (2, ["old", "new"])} == overlay
    with pytest.raises(BadReplyError, match="entry 1"):
        parse_updates([*updates, ["bad"]])
    message = {"role": "user", "content": [{"type": "text", "text": "original"}], "ts": 1}
    assert [{"type": "text", "text": "new"}] == with_overlay(message, 2, overlay)["content"]
    assert "original" == message["content"][0]["text"]  # type: ignore[index]


def test_chars_count_strings_inside_content_but_not_block_types() -> None:
    """chars_of sums the strings of a content tree, leaving out ``type`` tags."""
    assert 11 == chars_of([TOOL_RESULT])  # "t1" and "file body"
    assert 5 == chars_of("hello")


def test_default_model_comes_from_model_info() -> None:
    """The model id and provider come from the first assistant's modelInfo."""
    history = [{"role": "assistant", "modelInfo": {"modelId": "m1", "providerId": "openai"}}]
    assert {"id": "m1", "provider": "openai", "context_window": 1000} == default_model(
        history, 1000
    )
    assert {"id": "unknown"} == default_model([], None)
