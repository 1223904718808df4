"""A clone runs its tests alone: nothing read outside it, the corpus given or a stated skip."""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ctxwin.client.cli._corpus import load_conversation
from tests import _corpus
from tests._corpus import REASON, VARIABLE, corpus_file
from tests._shapes import SHAPES, conversation_file, shape_text

ROOT = Path(__file__).resolve().parents[1]
MACHINE_PATH = re.compile(r"[\"'](?:/work|/home|/root|/Users)/[^\"']*")
"""An absolute path of one machine's home or work folders, quoted."""


def test_no_test_or_bench_names_a_path_outside_the_repository() -> None:
    """No test or bench climbs above the checkout (``parents[n]`` past its root) or names
    an absolute path of one machine."""
    found = []
    for path in sorted([*ROOT.glob("tests/**/*.py"), *ROOT.glob("bench/**/*.py")]):
        depth = len(path.relative_to(ROOT).parts) - 1  # parents[depth] is the root
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"parents\[(\d+)\]", text):
            if int(match[1]) > depth:
                found.append(f"{path.relative_to(ROOT)}: {match[0]}")
        found += [f"{path.relative_to(ROOT)}: {m[0]}" for m in MACHINE_PATH.finditer(text)]
    assert [] == found


def test_the_readme_gives_the_reason_a_corpus_test_skips() -> None:
    """The README's Tests paragraph names the variable and quotes the one skip reason."""
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert "### Tests" in text
    assert f"{VARIABLE}=/path/to/folder python3 dev.py test" in text
    assert f'"{REASON}"' in text


def test_without_the_folder_a_corpus_test_skips_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unset, or set to a folder without the file, the test skips saying why (in CI the
    second fails: the folder was given for those tests to run)."""
    monkeypatch.delenv(VARIABLE, raising=False)
    monkeypatch.delenv("CTXWIN_CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=re.escape(REASON)):
        corpus_file("mra-api_conversation_history.json")
    monkeypatch.setenv(VARIABLE, str(ROOT / "tests"))
    with pytest.raises(pytest.skip.Exception, match=re.escape(REASON)):
        corpus_file("mra-api_conversation_history.json")
    monkeypatch.setenv("CTXWIN_CI", "1")
    with pytest.raises(pytest.fail.Exception, match="holds no mra-api"):
        corpus_file("mra-api_conversation_history.json")
    assert ROOT / "tests" / "_corpus.py" == corpus_file("_corpus.py")
    assert ROOT / "tests" == _corpus.corpus_folder()


def test_the_synthetic_conversations_are_made_the_same_every_time() -> None:
    """Each synthetic conversation's text is the same on every call (no randomness)."""
    for name in SHAPES:
        assert shape_text(name) == shape_text(name), name


def _calls(message: dict[str, Any]) -> list[str]:
    content = message.get("content")
    blocks = content if isinstance(content, list) else []
    return [b["id"] for b in blocks if b.get("type") == "tool_use"] + [
        call["id"] for call in message.get("tool_calls") or []
    ]


def test_the_cline_task_has_the_shapes_of_a_real_one(tmp_path: Path) -> None:
    """Native calls answered as text, several calls at once, thinking with a signature, one
    huge result, interrupted calls, and the provider's usage on every assistant message."""
    messages, dialect = load_conversation(conversation_file("cline_task.json", tmp_path))
    assert "cline" == dialect
    blocks = [block for message in messages for block in message["content"]]
    assert not [block for block in blocks if block["type"] == "tool_result"]
    headers = [b["text"] for b in blocks if b["type"] == "text" and "] Result:\n" in b["text"]]
    assert len(headers) > 50
    assert any(len(_calls(message)) > 1 for message in messages)
    assert any(block["type"] == "thinking" and block["signature"] for block in blocks)
    assert max(len(text) for text in headers) > 60_000
    resumed = [i for i, m in enumerate(messages) if "[TASK RESUMPTION]" in json.dumps(m)]
    assert len(resumed) >= 3
    assert all(_calls(messages[i - 1]) for i in resumed)
    assistants = [message for message in messages if message["role"] == "assistant"]
    assert all(message["metrics"]["tokens"]["prompt"] > 0 for message in assistants)
    prompts = [message["metrics"]["tokens"]["prompt"] for message in assistants]
    assert prompts == sorted(prompts), "the recorded run never cut its own view"


def test_the_chat_log_has_the_shapes_of_a_converted_one(tmp_path: Path) -> None:
    """Parallel calls over consecutive assistant messages (a result between them now and
    then), system messages, reads of a path read again, and a call without a result."""
    messages, dialect = load_conversation(conversation_file("chat_log.json", tmp_path))
    assert "openai-chat" == dialect
    roles = [message["role"] for message in messages]
    assert roles.count("system") >= 2
    assert roles.index("system", 1) > 10
    pairs = list(itertools.pairwise(messages))
    assert any(a.get("tool_calls") and b.get("tool_calls") for a, b in pairs)
    assert any(
        a.get("tool_calls") and b["role"] == "tool" and c.get("tool_calls")
        for a, b, c in zip(messages, messages[1:], messages[2:], strict=False)
    )
    assert all(m["content"] is None for m in messages if m.get("tool_calls") and not m["content"])
    answered = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
    calls = [call for message in messages for call in message.get("tool_calls") or []]
    assert len({call["id"] for call in calls} - answered) == 1
    reads = Counter(
        call["function"]["arguments"] for call in calls if call["function"]["name"] == "Read"
    )
    assert max(reads.values()) > 5


def test_the_claude_code_log_has_the_shapes_of_a_real_one(tmp_path: Path) -> None:
    """Responses split over lines sharing message.id, thinking with signatures, results in
    user lines, a result answering no call, bookkeeping lines, Reads of paths read again."""
    path = conversation_file("claude_code_log.jsonl", tmp_path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    kinds = Counter(line["type"] for line in lines)
    assert {"file-history-snapshot", "queue-operation", "system"} <= set(kinds)
    ids = Counter(line["message"]["id"] for line in lines if line["type"] == "assistant")
    assert max(ids.values()) >= 3
    messages, dialect = load_conversation(path)
    assert "anthropic" == dialect
    assert len(messages) < kinds["user"] + kinds["assistant"]
    blocks = [b for m in messages if isinstance(m["content"], list) for b in m["content"]]
    assert any(block["type"] == "thinking" and block["signature"] for block in blocks)
    calls = {block["id"] for block in blocks if block["type"] == "tool_use"}
    results = [block["tool_use_id"] for block in blocks if block["type"] == "tool_result"]
    assert [r for r in results if r not in calls] == ["call_orphan"]
    paths = Counter(b["input"]["file_path"] for b in blocks if b.get("name") == "Read")
    assert max(paths.values()) > 5
