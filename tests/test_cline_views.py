"""Cline views through the real daemon: results given as text, and the notice after a cut."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ctxwin import engine
from ctxwin.client import Client
from tests._corpus import corpus_param
from tests._shapes import conversation_file

NOTICES = engine.DEFAULT_NOTICES


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _read(call: str, path: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": call, "name": "read_file", "input": {"path": path}}


def test_a_result_given_as_text_is_filled_in_saying_so(client: Client) -> None:
    """A call answered by Cline's text header gets a filled-in result saying the result follows
    as text; a call the next message does not answer that way still gets the missing one."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [_text("<task>Fix it</task>")]},
        {"role": "assistant", "content": [_text("Reading."), _read("r1", "src/a.py")]},
        {"role": "user", "content": [_text("[read_file for 'src/a.py'] Result:\nprint(1)")]},
        {"role": "assistant", "content": [_text("And the other."), _read("r2", "src/b.py")]},
        {"role": "user", "content": [_text("[write_to_file for 'src/c.py'] Result:\nsaved")]},
        {"role": "assistant", "content": [_text("Done.")]},
    ]
    view = client.task("as-text", ephemeral=True).truncated_messages(messages)["messages"]
    first: Any = view[2]["content"]
    second: Any = view[4]["content"]
    filled = {"type": "tool_result", "tool_use_id": "r1", "content": NOTICES.result_as_text}
    assert filled == first[0]
    assert messages[2]["content"][0] == first[1]  # the text result itself follows
    assert NOTICES.missing_result == second[0]["content"]


@pytest.mark.parametrize(
    "name", ["cline_task.json", corpus_param("mra-api_conversation_history.json")]
)
def test_a_cline_task_is_never_told_a_result_is_missing_before_reading_it(
    name: str, tmp_path: Path
) -> None:
    """In a Cline task whose results come as text a call is filled in as given as text only
    where the next message's header names its tool, and nearly every call is (all 231 of the
    real task were filled in as missing); the missing-result text stays where the task was
    interrupted before a result."""
    messages = json.loads(conversation_file(name, tmp_path).read_text())
    view = engine.truncated_messages(messages, None, None, NOTICES)
    filled = {NOTICES.missing_result: 0, NOTICES.result_as_text: 0}
    for index in range(1, len(messages) - 1):
        calls = {
            block["id"]: block
            for block in messages[index]["content"]
            if isinstance(messages[index]["content"], list) and block.get("type") == "tool_use"
        }
        texts = [block.get("text", "") for block in messages[index + 1]["content"]]
        for block in view[index + 1]["content"]:
            if block.get("type") != "tool_result" or block["tool_use_id"] not in calls:
                continue
            name = calls[block["tool_use_id"]]["name"]
            named = any(text.startswith((f"[{name}]", f"[{name} for ")) for text in texts)
            assert named or block["content"] == NOTICES.missing_result, index
            filled[block["content"]] += 1
    assert filled[NOTICES.result_as_text] > 10 * filled[NOTICES.missing_result]


def test_the_truncation_notice_reaches_a_first_reply_that_opens_with_a_call(
    client: Client,
) -> None:
    """Message 1 opening with a tool_use gets the notice as a text block first after a cut."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [_text("<task>Fix it</task>")]},
        {"role": "assistant", "content": [_read("r0", "src/a.py")]},
    ]
    for turn in range(12):
        messages.append({"role": "user", "content": [_text(f"[read_file for 'f{turn}'] Result:")]})
        messages.append({"role": "assistant", "content": [_text(f"ok {turn}")]})
    task = client.task("notice-first", ephemeral=True)
    compacted = task.compact(messages, "quarter", ts=1, keep_task=True)
    assert compacted["deleted_range"] is not None
    view = task.truncated_messages(messages)["messages"]
    assert [_text(NOTICES.truncation), messages[1]["content"][0]] == view[1]["content"]
