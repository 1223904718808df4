"""Dialects end to end: the real daemon over ipc, the client's delta sync, agents' logs replayed."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from ctxwin import engine, proto
from ctxwin.client import BadRequestError, Client
from ctxwin.client.cli._corpus import load_conversation
from ctxwin.client.cli._dialects import message_chars, user_side
from ctxwin.client.cli.replay import ReplayOptions, ReplayReport, ViewState, replay
from tests import _daemon
from tests._corpus import corpus_param
from tests._daemon import DaemonProcess
from tests._dialect_data import PATHS, RENDER, Call, Turn, sdk_validator
from tests._rules import CHECKS, check_origins
from tests._shapes import LOGS, conversation_file

CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Read the file."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "print(1)\n" * 50},
]


def test_ping_lists_every_dialect_the_engine_serves(client: Client) -> None:
    """ping names the dialects, the same ones proto checks and the engine maps."""
    pong = client.ping()
    assert list(proto.DIALECTS) == pong["dialects"]
    assert proto.DIALECTS == engine.DIALECT_NAMES
    assert "dialects" in pong["features"]


def test_a_dialect_is_fixed_at_first_use_and_kept_across_restarts(tmp_path: Path) -> None:
    """The first call's dialect is stored in ctxwin.json; a later call naming another is refused."""
    with DaemonProcess(tmp_path) as daemon:
        with Client(daemon.endpoint) as first:
            task = first.task("fixed", dialect="openai-chat")
            view = task.truncated_messages(CHAT)["messages"]
            assert CHAT == view
            first.flush("fixed")
        meta = json.loads((daemon.task_dir("fixed") / "ctxwin.json").read_text())
        assert "openai-chat" == meta["dialect"]
    with DaemonProcess(tmp_path) as daemon, Client(daemon.endpoint) as second:
        with pytest.raises(BadRequestError, match="has dialect 'openai-chat', not 'anthropic'"):
            second.task("fixed", dialect="anthropic").inspect()
        again = second.task("fixed", dialect="openai-chat")
        assert CHAT == again.truncated_messages(CHAT)["messages"]


OPEN_FILE = [{"name": "open_file", "arg": "filename"}]


def _open_file_reads() -> list[dict[str, Any]]:
    """The task, then the same file read twice by a tool the daemon's table does not know."""
    body = "def f():\n    return 1\n" * 200
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "ok"},
    ]
    for call in ("a", "b"):
        messages += [
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": call,
                        "name": "open_file",
                        "input": {"filename": "src/x.py"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call, "content": body}],
            },
        ]
    return messages


def _first_read(view: list[Any]) -> Any:
    return view[3]["content"][0]["content"]


def test_a_task_names_its_own_read_tools_and_keeps_them_across_restarts(tmp_path: Path) -> None:
    """read_tools extends a task's read table, is stored in ctxwin.json and outlives the daemon."""
    messages = _open_file_reads()
    notice = engine.DEFAULT_NOTICES.duplicate_file_read
    with DaemonProcess(tmp_path) as daemon:
        with Client(daemon.endpoint) as first:
            plain = first.task("reads-default", dialect="anthropic")
            assert not plain.optimize_file_reads(messages)["changed"]
            own = first.task("reads-own", dialect="anthropic", read_tools=OPEN_FILE)
            assert own.optimize_file_reads(messages)["changed"]
            assert notice == _first_read(own.truncated_messages(messages)["messages"])
            assert OPEN_FILE == own.inspect()["read_tools"]
            first.flush("reads-own")
        meta = json.loads((daemon.task_dir("reads-own") / "ctxwin.json").read_text())
        assert OPEN_FILE == meta["read_tools"]
    with DaemonProcess(tmp_path) as daemon, Client(daemon.endpoint) as second:
        again = second.task("reads-own", dialect="anthropic")  # no read_tools given: the stored
        assert OPEN_FILE == again.inspect()["read_tools"]
        reread = [*messages, *_open_file_reads()[2:4]]  # a third read of the same file
        reread[-2]["content"][0]["id"] = reread[-1]["content"][0]["tool_use_id"] = "c"
        assert again.optimize_file_reads(reread)["changed"]
        view: list[Any] = again.truncated_messages(reread)["messages"]
        assert notice == view[5]["content"][0]["content"]  # the second read, now stale too


def test_stored_read_tools_that_no_longer_build_are_kept_and_not_used(tmp_path: Path) -> None:
    """A ctxwin.json tool that does not build: the task is served, the tool kept and not used."""
    with DaemonProcess(tmp_path) as daemon, Client(daemon.endpoint) as first:
        first.task("reads-stale", dialect="anthropic", read_tools=OPEN_FILE).inspect()
        first.flush("reads-stale")
    meta_path = daemon.task_dir("reads-stale") / "ctxwin.json"
    meta = json.loads(meta_path.read_text())
    stale = {"name": "open_file", "arg": "filename", "pattern": "("}
    meta["read_tools"] = [stale]
    meta_path.write_text(json.dumps(meta))
    with DaemonProcess(tmp_path) as daemon, Client(daemon.endpoint) as second:
        task = second.task("reads-stale", dialect="anthropic")
        assert not task.optimize_file_reads(_open_file_reads())["changed"]
        assert meta["read_tools"] == task.inspect()["read_tools"]
        assert [[0, "a read tool's pattern does not compile (RE2 syntax): missing ): ("]] == (
            task.inspect()["read_tools_unused"]
        )
        assert "stored_read_tools_unused" in daemon.log()
        # Sent again as stored, the tool is refused by name rather than taken silently.
        with pytest.raises(BadRequestError, match=r"read_tools\[0\]: .*does not compile"):
            task.inspect(read_tools=[stale])
    meta["read_tools"] = [stale, *OPEN_FILE]  # one bad entry leaves the others in use
    meta_path.write_text(json.dumps(meta))
    with DaemonProcess(tmp_path) as daemon, Client(daemon.endpoint) as third:
        task = third.task("reads-stale", dialect="anthropic")
        assert task.optimize_file_reads(_open_file_reads())["changed"]


def _bash_reads(command: str, count: int) -> list[dict[str, Any]]:
    """A task, then ``count`` Bash calls of ``command``, each answered."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "look"}]
    for number in range(count):
        messages += [
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": f"b{number}",
                        "name": "Bash",
                        "input": {"command": command},
                    }
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"b{number}", "content": "x"}],
            },
        ]
    return messages


HOSTILE = {"name": "Bash", "arg": "command", "pattern": "(?P<path>(a+)+)"}
"""Exponential for a backtracking engine on ``a...a!`` (seconds at 24 characters)."""


def _ping_while(endpoint: str, op: str, args: dict[str, Any]) -> float:
    """Send ``op`` from one client, then time another client's ping; both must be answered."""

    with _daemon.WirePeer(endpoint, timeout=60) as sender:
        sender.send(1, op, args)
        time.sleep(0.05)  # the request is in the daemon before the ping
        started = time.monotonic()
        pong = _daemon.call(endpoint, "ping", timeout=60)
        latency = time.monotonic() - started
        assert pong.ok
        assert sender.recv().ok, f"{op} was not answered"
    return latency


def test_a_hostile_pattern_does_not_hold_up_another_clients_ping(
    shared_daemon: DaemonProcess,
) -> None:
    """A task's pattern that makes a backtracking engine run for seconds: ping answers at once.

    The bound is generous (a second, against the 100 ms aimed at) for a loaded
    machine; a backtracking match of these calls takes far longer.
    """
    args = {
        "task": "reads-hostile",
        "dialect": "anthropic",
        "read_tools": [HOSTILE],
        "messages": _bash_reads("a" * 24 + "!", 8),
        "ts": 1,
    }
    latency = _ping_while(shared_daemon.endpoint, "optimize_file_reads", args)
    assert latency < 1.0, f"ping waited {latency:.2f}s behind a hostile pattern"


def test_a_stored_pattern_re2_refuses_is_kept_aside_and_never_run(tmp_path: Path) -> None:
    """A ctxwin.json pattern with a backreference: refused on load, named in inspect, not run."""
    with DaemonProcess(tmp_path) as daemon, Client(daemon.endpoint) as first:
        first.task("reads-stored", dialect="anthropic", read_tools=[HOSTILE]).inspect()
        first.flush("reads-stored")
    meta_path = daemon.task_dir("reads-stored") / "ctxwin.json"
    meta = json.loads(meta_path.read_text())
    hostile = {**HOSTILE, "pattern": r"(?P<path>(a+)+)\2!"}  # backtracking only
    meta["read_tools"] = [HOSTILE, hostile]
    meta_path.write_text(json.dumps(meta))
    with DaemonProcess(tmp_path) as daemon, Client(daemon.endpoint) as second:
        args = {"task": "reads-stored", "messages": _bash_reads("a" * 24 + "!", 8), "ts": 1}
        assert _ping_while(daemon.endpoint, "optimize_file_reads", args) < 1.0
        seen = second.task("reads-stored", dialect="anthropic").inspect()
        assert [HOSTILE, hostile] == seen["read_tools"]  # kept as stored
        [[position, reason]] = seen["read_tools_unused"]
        assert 1 == position
        assert "does not compile (RE2 syntax)" in reason
        assert "stored_read_tools_unused" in daemon.log()


def test_read_tools_that_cannot_be_used_are_refused_by_name(client: Client) -> None:
    """A malformed tool, a pattern without a path group, or a Cline task: a clear bad_request."""
    task = client.task("reads-bad", dialect="anthropic")
    with pytest.raises(BadRequestError, match=r"read_tools\[1\]: a read tool needs"):
        task.inspect(read_tools=[*OPEN_FILE, {"name": "x"}])
    with pytest.raises(BadRequestError, match=r"read_tools\[0\]: .*group named 'path'"):
        task.inspect(read_tools=[{"name": "sh", "arg": "cmd", "pattern": "cat .*"}])
    with pytest.raises(BadRequestError, match=r"read_tools\[0\] must be a map"):
        task.inspect(read_tools=["open_file"])  # type: ignore[list-item]
    with pytest.raises(BadRequestError, match="read_tools must be a list"):
        task.inspect(read_tools="open_file")  # type: ignore[arg-type]
    with pytest.raises(BadRequestError, match="read_tools applies to the native dialects"):
        client.task("reads-cline", read_tools=OPEN_FILE).inspect()
    assert [] == task.inspect()["read_tools"]  # nothing was taken from the refused calls
    # The refused call fixed nothing: naming the dialect with the same tools now works.
    retry = client.task("reads-cline", dialect="anthropic", read_tools=OPEN_FILE)
    assert OPEN_FILE == retry.inspect()["read_tools"]
    # A request refused for its messages leaves the tools it named unset.
    with pytest.raises(BadRequestError, match=r"messages\[0\]"):
        task.truncated_messages([{"role": "bogus"}], read_tools=OPEN_FILE)
    assert [] == task.inspect()["read_tools"]


def test_an_inspected_task_becomes_ephemeral_with_a_dialect_and_read_tools(
    shared_daemon: DaemonProcess, client: Client
) -> None:
    """Looked at first, then opened ephemeral in a native dialect with tools: nothing is written."""
    client.task("reads-ephemeral").inspect()
    task = client.task("reads-ephemeral", ephemeral=True, dialect="anthropic", read_tools=OPEN_FILE)
    assert task.optimize_file_reads(_open_file_reads())["changed"]
    client.flush()
    assert not (shared_daemon.task_dir("reads-ephemeral") / "ctxwin.json").exists()


def test_inspect_names_the_history_message_and_text_of_each_edited_block(client: Client) -> None:
    """A native task's inspect gives, per edited block, the history index and the block's text
    before the edit; a Cline task's, or one whose history the daemon holds none of, gives none."""
    reread = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c2",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
            }
        ],
    }
    messages = [*CHAT, reread, {"role": "tool", "tool_call_id": "c2", "content": "print(2)\n"}]
    task = client.task("sources", dialect="openai-chat", ephemeral=True)
    assert "sources" not in task.inspect()  # no history sent yet
    assert task.optimize_file_reads(messages)["changed"]
    inspected = task.inspect()
    # Internal message 2 is the first tool message (the system message is left out).
    assert [2] == [entry[0] for entry in inspected["updates"]]
    assert [[2, 0, 3, CHAT[3]["content"]]] == inspected["sources"]
    cline = client.task("sources-cline", ephemeral=True)
    cline.truncated_messages([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert "sources" not in cline.inspect()


READ_RESULT = re.compile(r"c\d+\\nx = 1")
"""A result of one of ``_growing``'s read_file calls, as it stands in a message's JSON."""


def _replaced_reads(
    client: Client, messages: list[Any], window: int, task: str, dialect: str
) -> list[Any]:
    """The optimisation events of a replay of ``messages`` in a ``window``-token model; at
    least one."""
    model: proto.Model = {"id": "m", "context_window": window}
    report = replay(client, messages, model, ReplayOptions(task_id=task, dialect=dialect))
    events = [event for event in report.events if event.kind == "optimisation"]
    assert events, "no duplicate read replaced"
    return events


@pytest.mark.parametrize("dialect", ["openai-chat", "anthropic", "openai-responses", "gemini"])
def test_a_replay_names_the_history_messages_whose_reads_were_replaced(
    client: Client, dialect: str
) -> None:
    """An optimisation event of a native replay names the history index of each replaced read's
    result, and counts the characters and tokens its notice saved."""
    messages = RENDER[dialect](_growing(30))
    events = _replaced_reads(client, messages, 6_000, f"replay-reads-{dialect}", dialect)
    for event in events:
        for index in event.messages:
            assert READ_RESULT.search(json.dumps(messages[index])), f"{index}: no read result"
        assert event.chars_saved > 0
        assert event.tokens_saved > 0


def _head(messages: list[dict[str, Any]], dialect: str) -> set[int]:
    """History indices a cut never removes: the system and developer messages, the first user
    message and the first reply (every message of the model's side before the next user's)."""
    kept = {i for i, m in enumerate(messages) if m.get("role") in ("system", "developer")}
    first = next(i for i, m in enumerate(messages) if m.get("role") == "user")
    kept.add(first)
    for index in range(first + 1, len(messages)):
        if user_side(messages[index], dialect):
            break
        kept.add(index)
    return kept


def _sent_as(report: ReplayReport, view: ViewState, history: list[Any]) -> dict[int, list[Any]]:
    """History index -> the messages standing for it in ``view`` (as they are or rebuilt)."""
    assert view.order is not None
    sent: dict[int, list[Any]] = {}
    for index, number in view.order:
        if number is None:
            sent.setdefault(index, []).append(history[index])
        elif not report.variants[number].added:
            sent.setdefault(index, []).append(report.variants[number].message)
    return sent


_CUT_REPLAYS: dict[str, tuple[list[Any], ReplayReport]] = {}


def _cut_replay(client: Client, dialect: str) -> tuple[list[Any], ReplayReport]:
    """A replay whose views are cut (made once per dialect, read by several tests)."""
    if dialect not in _CUT_REPLAYS:
        messages = RENDER[dialect](_growing(30))
        model: proto.Model = {"id": "m", "context_window": 6_000}
        options = ReplayOptions(task_id=f"replay-cuts-{dialect}", dialect=dialect)
        _CUT_REPLAYS[dialect] = messages, replay(client, messages, model, options)
    return _CUT_REPLAYS[dialect]


@pytest.mark.parametrize("dialect", ["openai-chat", "anthropic", "openai-responses", "gemini"])
def test_a_native_replay_agrees_with_the_recorded_run_until_a_view_differs(
    client: Client, dialect: str
) -> None:
    """A turn agrees with the recorded run while every view so far sent the whole history as
    it is (each message equal to its history message, in its place); the first that did not
    is named."""
    messages, report = _cut_replay(client, dialect)
    whole = []
    for row in report.per_turn:
        sent = [
            messages[index] if number is None else report.variants[number].message
            for index, number in report.view_of(row).order or []
        ]
        whole.append(sent == messages[: row.messages])
    assert True in whole, "no turn sent the whole history"
    assert False in whole, "no turn cut or edited the history"
    first = whole.index(False) + 1
    assert [row.turn < first for row in report.per_turn] == [row.agrees for row in report.per_turn]
    assert f"from turn {first} ctxwin's view hides or edits messages" == report.differs


@pytest.mark.parametrize("dialect", ["openai-chat", "anthropic", "openai-responses", "gemini"])
def test_a_replay_names_the_history_messages_a_cut_removed_from_the_view(
    client: Client, dialect: str
) -> None:
    """A native replay's truncation event names, by history index, the messages the previous
    turn's view sent and the cut view no longer does (never the kept head), counts them, and
    saves the characters they held as they were sent; its range stays the engine's."""
    messages, report = _cut_replay(client, dialect)
    events = [event for event in report.events if event.kind == "truncation"]
    assert events, "no cut"
    head = _head(messages, dialect)
    for event in events:
        assert event.turn > 1
        before = report.view_of(report.per_turn[event.turn - 2])
        after = report.view_of(report.per_turn[event.turn - 1])
        assert event.deleted_range == after.deleted_range
        was_sent = _sent_as(report, before, messages)
        now_sent = _sent_as(report, after, messages)
        assert event.messages, f"turn {event.turn}: a cut that names no message"
        for index in event.messages:
            assert 0 <= index < event.message, f"{index}: not a history index"
            assert index in was_sent, f"turn {event.turn}: {index} was not sent before"
            assert index not in now_sent, f"turn {event.turn}: {index} is still sent"
        assert not head & set(event.messages), f"turn {event.turn}: the head is named"
        assert event.messages == sorted(set(was_sent) - set(now_sent))
        assert event.removed_messages == len(event.messages)
        removed = [m for index in event.messages for m in was_sent[index]]
        assert event.chars_saved == sum(message_chars(m, dialect) for m in removed)
        assert event.tokens_saved > 0


def _read_calls(messages: list[dict[str, Any]]) -> dict[str, tuple[str, int]]:
    """Claude Code ``Read`` calls of an Anthropic history: id -> (path, history index)."""
    calls = {}
    for index, message in enumerate(messages):
        content = message.get("content")
        for part in content if isinstance(content, list) else []:
            if part.get("type") == "tool_use" and part.get("name") == "Read":
                calls[part["id"]] = (part["input"]["file_path"], index)
    return calls


@pytest.mark.parametrize(
    "name",
    ["claude_code_log.jsonl", corpus_param("anthropic_claude_code_campusops_session2.jsonl")],
)
def test_a_log_replay_names_the_results_of_reads_read_again(
    client: Client, name: str, tmp_path: Path
) -> None:
    """Replaying a Claude Code log, every optimisation event names history messages that
    hold the result of a Read of a path read again later, and the replacements save."""
    messages, dialect = load_conversation(conversation_file(name, tmp_path))
    calls = _read_calls(messages)
    events = _replaced_reads(client, messages, 48_000, f"replay-reads-{name}", dialect)
    for event in events:
        for index in event.messages:
            message = messages[index]
            assert message["role"] == "user"
            reads = [
                calls[part["tool_use_id"]]
                for part in message["content"]
                if part.get("type") == "tool_result" and part.get("tool_use_id") in calls
            ]
            assert any(
                path == later_path and index < at
                for path, _ in reads
                for later_path, at in calls.values()
            ), f"message {index} holds no result of a Read whose path is read again"
    assert sum(event.chars_saved for event in events) > 0
    assert sum(event.tokens_saved for event in events) > 0


def test_a_delta_synced_error_names_the_absolute_history_index(client: Client) -> None:
    """A bad message sent in a delta is named by its index in the history, not in the delta."""
    task = client.task("absolute", dialect="openai-chat")
    messages = list(CHAT)
    task.truncated_messages(messages)
    messages.append({"role": "assistant", "tool_calls": "not a list"})
    with pytest.raises(BadRequestError, match=r"messages\[4\]\.tool_calls must be a list"):
        task.truncated_messages(messages)
    cline = client.task("absolute-cline")
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    cline.truncated_messages(history)
    with pytest.raises(BadRequestError, match=r"messages\[2\]\.role must be 'user' or 'assistant'"):
        cline.truncated_messages([*history, {"role": "tool", "content": "c"}])


def test_count_tokens_of_a_dialect_counts_calls_results_and_system_messages(
    client: Client,
) -> None:
    """A dialect's count covers the system message, the call's name and arguments, the result."""
    total = client.count_tokens(CHAT, dialect="openai-chat")["tokens"]
    parts = [
        "You are terse.",
        "Read the file.",
        "read_file",
        '{"path":"a.py"}',
        "print(1)\n" * 50,
    ]
    assert sum(client.count_tokens(text=part)["tokens"] for part in parts) == total


def test_a_views_estimate_counts_the_system_messages_sent_with_it(client: Client) -> None:
    """prepare_request's estimate of an uncut Chat view equals count_tokens of the same list."""
    messages = [{"role": "system", "content": "Follow the house rules. " * 400}, *CHAT[1:]]
    task = client.task("estimate-systems", dialect="openai-chat", ephemeral=True)
    model: proto.Model = {"id": "gpt-4.1", "context_window": 128_000}
    prepared = task.prepare_request(messages, model, estimate=True)
    assert messages == prepared["messages"]
    counted = client.count_tokens(messages, dialect="openai-chat")["tokens"]
    system = client.count_tokens(text=messages[0]["content"])["tokens"]
    assert system > 2000
    assert counted == prepared["estimated_tokens"]


def _result_ids(message: dict[str, Any]) -> list[str]:
    if message.get("role") == "tool":
        return [message["tool_call_id"]]
    content = message.get("content")
    blocks = content if isinstance(content, list) else []
    return [b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"]


def _call_ids(message: dict[str, Any]) -> list[str]:
    calls = [call["id"] for call in message.get("tool_calls") or []]
    content = message.get("content")
    blocks = content if isinstance(content, list) else []
    return calls + [b["id"] for b in blocks if b.get("type") == "tool_use"]


def _sent(messages: list[dict[str, Any]], end: int, view: list[Any]) -> bool:
    """Whether the newest message is in the view: as given, or rebuilt with all its parts
    (results the view added beside them); or it holds only orphan results, which go."""
    newest = messages[end - 1]
    if newest in view:
        return True
    content = newest.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if isinstance(content, list) and any(
        isinstance(m.get("content"), list) and all(part in m["content"] for part in content)
        for m in view
    ):
        return True
    position = end - 1
    while position > 0 and messages[position - 1]["role"] != "assistant":
        position -= 1
    calls: set[str] = set()
    while position > 0 and messages[position - 1]["role"] == "assistant":
        calls.update(_call_ids(messages[position - 1]))
        position -= 1
    results = _result_ids(newest)
    return bool(results) and not calls.intersection(results)


def _replay(client: Client, path: Path, window: int) -> tuple[int, int, list[Any], Any]:
    """Replay a conversation file turn by turn in its own dialect; every view is checked."""
    messages, dialect = load_conversation(path)
    task = client.task(f"replay-{window}-{path.name}", dialect=dialect, ephemeral=True)
    validate = sdk_validator(dialect)
    model: proto.Model = {"id": "corpus", "context_window": window}
    ends = [
        end
        for end in range(1, len(messages) + 1)
        if user_side(messages[end - 1], dialect)
        and (end == len(messages) or not user_side(messages[end], dialect))
    ]
    previous: proto.Usage | None = None
    cuts = 0
    view: list[Any] = []
    for turn, end in enumerate(ends):
        result = task.prepare_request(
            messages[:end], model, previous_request=previous, estimate=True
        )
        view = list(result["messages"])
        CHECKS[dialect](view)
        if result["range_updated"] or turn % 4 == 0:  # the SDK types are slow to check
            validate(view)
        assert _sent(messages, end, view), f"the newest message ({end - 1}) is not sent"
        cuts += result["range_updated"]
        previous = proto.Usage(ts=end, tokens_in=result["estimated_tokens"])
    return cuts, len(ends), view, task.inspect()


@pytest.mark.parametrize("window", [32_000, 64_000])
@pytest.mark.parametrize("name", LOGS)
def test_a_logged_conversation_replays_in_its_own_dialect(
    client: Client, name: str, window: int, tmp_path: Path
) -> None:
    """Turn by turn over the wire: every view valid for its provider, at least one cut."""
    cuts, turns, _, inspected = _replay(client, conversation_file(name, tmp_path), window)
    assert cuts >= 1, f"{turns} turns at {window} tokens and no cut"
    if name.endswith(".jsonl"):  # Read calls of a Claude Code log read a path again
        reads = [m for m in inspected["updates"] if m[1][0] == proto.EDIT_READ_FILE]
        assert reads, "no duplicate-read notice on the Claude Code log"


def _growing(count: int) -> list[Turn]:
    """A conversation of ``count`` turns reading the same few paths again and again, with a
    system message now and then, a call left unanswered, and a text among the results."""
    turns = [Turn("system", "Be brief."), Turn("user", "Fix it. " * 40)]
    for serial in range(count):
        path = PATHS[serial % len(PATHS)]
        calls = [Call(f"c{serial}", "read_file", {"path": path})]
        if serial % 3 == 0:
            calls.append(Call(f"d{serial}", "Bash", {"command": "make"}))
        turns.append(Turn("assistant", f"Step {serial}. " * 5, calls=calls))
        answered = calls if serial % 11 != 5 else calls[:1]
        results = [(c.id, f"{c.id}\n" + "x = 1\n" * 60) for c in answered]
        # Now and then a reminder after the first result, the results split over messages.
        note = f"Reminder {serial}." if serial % 4 == 0 else ""
        turns.append(Turn("results", results=results, split=serial % 8 == 0, note=note))
        if serial % 9 == 4:
            turns.append(Turn("system", f"Reminder {serial}."))
    return turns


@pytest.mark.parametrize("dialect", ["openai-chat", "anthropic", "openai-responses", "gemini"])
def test_views_rebuilt_from_reused_patches_equal_the_whole_views(
    client: Client, dialect: str
) -> None:
    """A handle's views (delta sync, patches that send only new overrides) equal, turn by
    turn through cuts and duplicate-read notices, the whole views of a twin task."""
    messages = RENDER[dialect](_growing(60))
    handle = client.task(f"reused-{dialect}", dialect=dialect, ephemeral=True)
    model: proto.Model = {"id": "m", "context_window": 6_000}
    previous: proto.Usage | None = None
    cuts = 0
    for end in range(3, len(messages) + 1, 2):
        history = messages[:end]
        mine = handle.prepare_request(history, model, previous_request=previous, estimate=True)
        whole = client.prepare_request(
            f"whole-{dialect}",
            history,
            model,
            previous_request=previous,
            estimate=True,
            dialect=dialect,
            ephemeral=True,
        )
        assert list(mine["messages"]) == whole["messages"], f"view after {end} messages"
        origins = handle.view_origins()
        assert origins is not None
        check_origins(history, mine["messages"], origins)
        assert mine["deleted_range"] == whole["deleted_range"]
        cuts += mine["range_updated"]
        previous = proto.Usage(ts=end, tokens_in=mine["estimated_tokens"] + 4_000)
    assert cuts >= 2
