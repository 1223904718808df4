"""The ``--html`` page of conversations in the native dialects, through a real daemon."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path
from typing import Any

import pytest

from ctxwin import proto
from ctxwin.client import Client
from ctxwin.client.cli._corpus import load_conversation
from ctxwin.client.cli.page import replay_page
from ctxwin.client.cli.replay import (
    FILE_READ,
    NOTICE,
    REPAIRED,
    ReplayOptions,
    ReplayReport,
    message_tokens,
    replay,
)
from tests._corpus import corpus_param
from tests._daemon import DaemonProcess
from tests._dialect_data import PATHS, RENDER, Call, Turn
from tests._shapes import conversation_file
from tests.test_cli import run
from tests.test_page_browser import _browse, _dom, browser

__all__ = ["browser"]  # the fixture, shared with the corpus page's browser test

DIALECTS = ["openai-chat", "anthropic", "openai-responses", "gemini"]
KEYS = {"openai-chat": "messages", "anthropic": "messages", "openai-responses": "input"}
TRUNCATION = "Earlier turns of this conversation were removed"
REPLACED_READ = "This copy of the file's content was removed"
MISSING = "The result of this tool call is missing"


def _reading(count: int) -> list[Turn]:
    """``count`` turns reading the same few paths again, a system message now and then, and
    one call left unanswered (its result is missing)."""
    turns = [Turn("system", "Answer briefly."), Turn("user", "Fix the build. " * 30)]
    for serial in range(count):
        calls = [Call(f"c{serial}", "read_file", {"path": PATHS[serial % len(PATHS)]})]
        if serial % 4 == 1:
            calls.append(Call(f"g{serial}", "grep_tool", {"pattern": "TODO"}))
        turns.append(Turn("assistant", f"Looking at step {serial}. " * 4, calls=calls))
        answered = calls[:1] if serial == 9 else calls
        turns.append(
            Turn("results", results=[(c.id, f"{c.id}\n" + "line = 1\n" * 50) for c in answered])
        )
        if serial % 7 == 3:
            turns.append(Turn("system", f"Reminder {serial}: keep going."))
    return turns


def _replayed(client: Client, dialect: str, name: str) -> tuple[list[Any], ReplayReport, str]:
    history = RENDER[dialect](_reading(24))
    model: proto.Model = {"id": "m", "context_window": 6_000}
    report = replay(
        client, history, model, ReplayOptions(task_id=f"page-{name}-{dialect}", dialect=dialect)
    )
    counts = message_tokens(client, history, report.variants, dialect)
    return history, report, replay_page(report, history, counts)


def _items(page: str) -> list[tuple[str, str, bool]]:
    """(index label, body text, hidden) of every message item of a page, in page order."""
    found = []
    for match in re.finditer(r'<li class="msg[^>]*?( hidden)?>(.*?)</li>', page, re.S):
        label = re.search(r'<span class="idx"[^>]*>([^<]*)</span>', match[2])
        assert label is not None
        found.append((label[1], unescape(re.sub(r"<[^>]+>", " ", match[2])), bool(match[1])))
    return found


def _data(page: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="ctxwin-data">(.*?)</script>', page)
    assert found is not None
    data: dict[str, Any] = json.loads(found[1].replace("<\\/", "</"))
    return data


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_cut_view_shows_what_the_model_received_and_not_what_was_removed(
    client: Client, dialect: str
) -> None:
    """The last turn of a replay cut at a small window: its messages are shown in view order,
    the removed ones are not (folded into one line), the notice, a replaced read and a
    filled-in result are marked, and the tool calls are named."""
    history, report, page = _replayed(client, dialect, "cut")
    assert any(event.kind == "truncation" for event in report.events)
    last = report.views[-1]
    assert last.order is not None
    removed = last.removed(len(history))
    assert removed, "the cut removed no history message"
    shown = [(label, body) for label, body, hidden in _items(page) if not hidden]
    assert len(last.order) == len(shown)
    expected = [
        ("+" if number is not None and report.variants[number].added else "") + f"#{index}"
        for index, number in last.order
    ]
    assert expected == [label for label, _ in shown]
    assert not {f"#{index}" for index in removed} & {label for label, _ in shown}
    text = " ".join(body for _, body in shown)
    assert TRUNCATION in text
    assert REPLACED_READ in text
    assert MISSING in text
    assert "read_file" in text
    assert "grep_tool" in text
    fold = re.search(r'<li id="fold" class="fold"><span id="fold-text">([^<]*)</span>', page)
    assert fold is not None, "the removed messages are folded into one shown line"
    assert fold[1].startswith(f"messages {removed[0]}-")
    kinds = {kind for variant in report.variants for kind in variant.kinds}
    assert {NOTICE, FILE_READ, REPAIRED} <= kinds
    assert '<span class="badge read">file read replaced</span>' in page
    if dialect in ("openai-chat", "openai-responses"):
        assert "Reminder 3: keep going." in text, "system messages are sent, never cut"
    for index, number in last.order:
        if number is None:
            continue  # a message the view sent as it is: the caller's own
        variant = report.variants[number]
        if not variant.added:
            assert history[index] != variant.message
            assert index in last.altered


@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_turn_of_a_native_page_lists_the_messages_of_its_view(
    client: Client, dialect: str
) -> None:
    """Every turn's view in the page's data names each message it sent once, in the view's
    order: a history message up to that turn, or a variant the page holds."""
    _history, report, page = _replayed(client, dialect, "turns")
    data = _data(page)
    written = {(label, hidden) for label, _, hidden in _items(page)}
    assert written
    for turn, end, number, _ in data["turns"]:
        order = data["views"][number]["order"]
        assert order == [list(entry) for entry in report.views[number].order or []]
        assert len(order) == report.per_turn[turn - 1].sent
        originals = [index for index, variant in order if variant is None]
        assert len(originals) == len(set(originals))
        assert all(index < end for index in originals)
        assert all(0 <= variant < len(report.variants) for _, variant in order if variant)
    first = data["views"][data["turns"][0][2]]["order"]
    assert [[index, None] for index in range(data["turns"][0][1])] == first


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_native_message_body_is_drawn_in_its_dialect(client: Client, dialect: str) -> None:
    """Calls show their name and arguments, results the call they answer, texts as they are;
    never a raw dump of the message's JSON."""
    _history, _, page = _replayed(client, dialect, "bodies")
    bodies = " ".join(body for _, body, _ in _items(page))
    assert "read_file" in bodies
    assert '"path": "src/app.py"' in bodies
    assert "Looking at step 3." in bodies
    assert "c3" in bodies
    assert "line = 1" in bodies
    role = {"openai-chat": '"role"', "anthropic": '"type": "tool_use"'}.get(dialect, '"role"')
    assert role not in bodies, "a known part is drawn, not dumped"
    labels = {
        "openai-chat": ["tool call", "result for"],
        "anthropic": ["tool_use", "tool_result for"],
        "openai-responses": ["function call", "function call output for"],
        "gemini": ["functionCall", "functionResponse"],
    }[dialect]
    for label in labels:
        assert label in bodies


@pytest.mark.parametrize(
    "name", ["chat_log.json", corpus_param("openai_richh_claude_code_develop1.json")]
)
def test_the_replay_command_writes_the_page_of_a_logged_chat_conversation(
    shared_daemon: DaemonProcess, tmp_path: Path, name: str
) -> None:
    """``ctxwin replay --html`` of an OpenAI Chat log: no refusal, every system message of
    the history in the last view, and the cut folded."""
    source = conversation_file(name, tmp_path)
    history, dialect = load_conversation(source)
    assert "openai-chat" == dialect
    page = tmp_path / "chat.html"
    code, out, err = run(
        "--endpoint", shared_daemon.endpoint, "replay", str(source), "--model-window", "32000",
        "--json", "--html", str(page),
    )  # fmt: skip
    assert 0 == code, err
    report = json.loads(out)
    assert any(event["kind"] == "truncation" for event in report["events"])
    text = page.read_text(encoding="utf-8")
    shown = [label for label, _, hidden in _items(text) if not hidden]
    systems = [f"#{i}" for i, m in enumerate(history) if m.get("role") in ("system", "developer")]
    assert systems, "the conversation has system messages"
    assert set(systems) <= set(shown)
    assert len(shown) == report["last_request_messages"]
    assert '<li id="fold" class="fold"><span id="fold-text">messages ' in text


def test_inspect_writes_the_page_of_a_native_task(
    shared_daemon: DaemonProcess, client: Client, tmp_path: Path
) -> None:
    """``ctxwin inspect --messages --html`` of a Gemini task: its replaced reads are marked,
    and the summary counts what the view removed."""
    history = RENDER["gemini"](_reading(12))
    task = client.task("page-inspect", dialect="gemini")
    assert task.optimize_file_reads(history)["changed"]
    saved = tmp_path / "contents.json"
    saved.write_text(json.dumps({"contents": history}), encoding="utf-8")
    page = tmp_path / "task.html"
    base = ("--endpoint", shared_daemon.endpoint, "--json", "inspect", "page-inspect")
    code, out, err = run(*base, "--messages", str(saved), "--html", str(page))
    assert 0 == code, err
    result = json.loads(out)
    assert all(row["saved"] > 0 for row in result["blocks"] if row["edit"] != "notice")
    assert 0 == result["overview"]["hidden_messages"]
    text = page.read_text(encoding="utf-8")
    assert '<span class="badge read">file read replaced</span>' in text
    assert REPLACED_READ in unescape(text)
    assert "functionResponse" in text


def test_chromium_shows_each_turn_of_an_anthropic_page_in_view_order(
    browser: str, client: Client, tmp_path: Path
) -> None:
    """The page's script picks a turn in a real browser: the messages of that view shown in
    its order, the fold line only once the cut happened, the summary of that turn."""
    _history, report, text = _replayed(client, "anthropic", "browser")
    page = tmp_path / "anthropic.html"
    page.write_text(text, encoding="utf-8")
    profile = tmp_path / "profile"
    cut = next(event.turn for event in report.events if event.kind == "truncation")
    for row in (report.per_turn[cut - 2], report.per_turn[cut - 1], report.per_turn[-1]):
        dom = _dom(_browse(browser, profile, f"{page.as_uri()}#turn={row.turn}", "--dump-dom"))
        view = report.views[row.view]
        assert view.order is not None
        assert [
            (index, None if number is None else str(number)) for index, number in view.order
        ] == dom.shown
        assert dom.fold_hidden == (not view.removed(row.messages))
        assert dom.summary.startswith(f"{len(view.order)} of {row.messages} messages sent")


def _unanswered_and_repeated() -> list[dict[str, Any]]:
    """An Anthropic history whose call 3 is never answered (the view puts a filled-in result
    first in message 4) and whose last message says what message 4 says."""
    return [
        {"role": "user", "content": "Fix the build."},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "c1", "name": "read_file", "input": {"path": "a"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "x = 1"}],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "c2", "name": "read_file", "input": {}}],
        },
        {"role": "user", "content": [{"type": "text", "text": "Go on."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
        {"role": "user", "content": [{"type": "text", "text": "Go on."}]},
    ]


def test_a_message_the_view_rebuilt_is_drawn_as_its_history_message(client: Client) -> None:
    """A history message sent with a filled-in result put first is that message, rebuilt
    (a repaired pair), not a message the view added; and it is neither removed nor counted
    as saved."""
    history = _unanswered_and_repeated()
    model: proto.Model = {"id": "m", "context_window": 64_000}
    report = replay(
        client, history, model, ReplayOptions(task_id="page-rebuilt", dialect="anthropic")
    )
    last = report.views[-1]
    assert last.order is not None
    assert [index for index, _ in last.order] == list(range(7))
    number = last.order[4][1]
    assert number is not None
    variant = report.variants[number]
    assert not variant.added
    assert REPAIRED in variant.kinds
    assert MISSING in json.dumps(variant.message)
    assert [] == last.removed(len(history))
    assert not any(event.kind == "truncation" for event in report.events)
    counts = message_tokens(client, history, report.variants, "anthropic")
    shown = [label for label, _, hidden in _items(replay_page(report, history, counts))]
    assert [f"#{index}" for index in range(7)] == shown[-7:]


def _inspect_page(endpoint: str, client: Client, tmp_path: Path, name: str) -> Path:
    """``ctxwin inspect --html`` of a task whose last message says what an older one says:
    the last message is labelled by its own index, and nothing is said to be dropped."""
    history = _unanswered_and_repeated()
    task = client.task(name, dialect="anthropic")
    task.prepare_request(history, {"id": "m", "context_window": 64_000})
    saved = tmp_path / "messages.json"
    saved.write_text(json.dumps({"messages": history}), encoding="utf-8")
    page = tmp_path / "task.html"
    base = ("--endpoint", endpoint, "--json", "inspect", name)
    code, out, err = run(*base, "--messages", str(saved), "--html", str(page))
    assert 0 == code, err
    assert 0 == json.loads(out)["overview"]["hidden_messages"]
    text = page.read_text(encoding="utf-8")
    shown = [label for label, _, hidden in _items(text) if not hidden]
    assert [f"#{index}" for index in range(7)] == shown
    assert "dropped" not in unescape(re.sub(r"<script.*?</script>", "", text, flags=re.S))
    return page


def test_inspect_labels_each_message_by_its_own_index_not_an_equal_one(
    shared_daemon: DaemonProcess, client: Client, tmp_path: Path
) -> None:
    """The inspect page of a message equal to an older one, and of a rebuilt one (see
    :func:`_inspect_page`)."""
    _inspect_page(shared_daemon.endpoint, client, tmp_path, "page-equal")


def test_chromium_shows_a_rebuilt_message_and_an_equal_one_under_their_own_indices(
    browser: str, shared_daemon: DaemonProcess, client: Client, tmp_path: Path
) -> None:
    """The inspect page in a real browser: each message of the view under its own history
    index (the rebuilt one as a variant), the fold line hidden: nothing was dropped."""
    page = _inspect_page(shared_daemon.endpoint, client, tmp_path, "page-equal-browser")
    dom = _dom(_browse(browser, tmp_path / "profile", page.as_uri(), "--dump-dom"))
    assert list(range(7)) == [index for index, _ in dom.shown]
    assert [4] == [index for index, variant in dom.shown if variant is not None]
    assert dom.fold_hidden


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("name", "call"),
    [
        (
            "chat",
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "deep_tool", "arguments": "[" * 5000 + "]" * 5000},
                    }
                ],
            },
        ),
        (
            "anthropic",
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "c1", "name": "deep_tool", "input": 0}],
            },
        ),
    ],
)
def test_a_page_of_deeply_nested_arguments_is_written_private_and_shown_in_chromium(
    browser: str, shared_daemon: DaemonProcess, tmp_path: Path, name: str, call: dict[str, Any]
) -> None:
    """Arguments nested 5,000 deep (a Chat call's JSON string) or 900 deep (an Anthropic
    input, about as deep as the file's JSON can be read): the replay writes its page, which
    Chromium shows with the call; the page replaces an older one atomically, readable by its
    owner only (it holds the whole conversation), and leaves no other file."""
    if name == "anthropic":
        call["content"][0]["input"] = _nested(900)
        result: dict[str, Any] = {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "ok"}],
        }
    else:
        result = {"role": "tool", "tool_call_id": "c1", "content": "ok"}
    messages = [
        {"role": "user", "content": "do it"},
        call,
        result,
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "more"},
    ]
    source = tmp_path / "conversation.json"
    source.write_text(json.dumps({"messages": messages}), encoding="utf-8")
    pages = tmp_path / "pages"
    pages.mkdir()
    page = pages / "deep.html"
    page.write_text("an older page", encoding="utf-8")
    page.chmod(0o644)
    code, _, err = run(
        "--endpoint", shared_daemon.endpoint, "replay", str(source), "--dialect",
        "openai-chat" if name == "chat" else "anthropic", "--html", str(page),
    )  # fmt: skip
    assert 0 == code, err
    assert 0o600 == page.stat().st_mode & 0o777
    assert ["deep.html"] == [path.name for path in pages.iterdir()]
    text = page.read_text(encoding="utf-8")
    assert "deep_tool" in text
    dom = _dom(_browse(browser, tmp_path / "profile", page.as_uri(), "--dump-dom"))
    assert list(range(5)) == [index for index, _ in dom.shown]
