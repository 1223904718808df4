"""Native file reads, notices and opaque parts in the dialects (docs/DIALECTS.md)."""

from __future__ import annotations

from typing import Any

import pytest

from ctxwin import engine, proto
from ctxwin.daemon import ConfigError, load_config

Message = dict[str, Any]
BODY = "line of the file\n" * 200


def _read(call_id: str, name: str, args: dict[str, Any]) -> list[Message]:
    return [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": call_id, "name": name, "input": args}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call_id, "content": BODY}],
        },
    ]


def _run(messages: list[Message], rules: engine.ReadRules = engine.DEFAULT_READ_RULES) -> Any:
    history = engine.MappedHistory(engine.DIALECTS["anthropic"], messages)
    state = engine.TaskState(reads=rules, dialect=history.dialect)
    state.cache = history.cache
    result = state.optimize_file_reads(history.internal, 1)
    view = history.view(state.truncated_messages(history.internal), state.deleted_range)
    return result, view


TASK = [{"role": "user", "content": "fix it"}, {"role": "assistant", "content": "ok"}]


def test_a_path_read_again_replaces_the_earlier_result_keeping_its_id() -> None:
    """Claude Code's Read of one path twice: the first result becomes the notice, id kept."""
    messages = [
        *TASK,
        *_read("a", "Read", {"file_path": "x.py"}),
        *_read("b", "Read", {"file_path": "x.py"}),
    ]
    result, view = _run(messages)
    assert (True, False) == (result["changed"], result["need_to_truncate"])  # half the text saved
    first = view[3]["content"][0]
    assert {"type": "tool_result", "tool_use_id": "a"} == {
        k: first[k] for k in ("type", "tool_use_id")
    }
    assert engine.DEFAULT_NOTICES.duplicate_file_read == first["content"]
    assert messages[5] is view[5]  # the latest read is sent as given


@pytest.mark.parametrize(
    ("name", "first", "second", "replaced"),
    [
        (
            "str_replace_based_edit_tool",
            {"command": "view", "path": "x"},
            {"command": "view", "path": "x"},
            True,
        ),
        (
            "str_replace_based_edit_tool",
            {"command": "create", "path": "x"},
            {"command": "view", "path": "x"},
            False,
        ),
        ("view", {"path": "x"}, {"path": "x"}, True),
        ("read_file", {"path": "x"}, {"path": "y"}, False),
        ("Read", {"file_path": "x", "offset": 10}, {"file_path": "x"}, False),
        ("Bash", {"command": "cat x"}, {"command": "cat x"}, True),
        ("Bash", {"command": "cat x"}, {"command": "sed -n '1,5p' x"}, False),
    ],
)
def test_what_counts_as_a_read_of_the_same_file(
    name: str, first: dict[str, Any], second: dict[str, Any], replaced: bool
) -> None:
    """The default table: the text editor's view only, a line range is another read, shell
    prints of one file are reads."""
    messages = [*TASK, *_read("a", name, first), *_read("b", name, second)]
    result, _ = _run(messages)
    assert replaced == result["changed"]


def test_shell_reads_count_once_a_pattern_opts_in() -> None:
    """With a Bash entry using the built-in shell pattern, cat of one path twice is a duplicate."""
    rules = engine.DEFAULT_READ_RULES.extended(
        [engine.read_tool_from_config({"name": "Bash", "arg": "command", "pattern": "shell"})]
    )
    messages = [
        *TASK,
        *_read("a", "Bash", {"command": "cat x"}),
        *_read("b", "Bash", {"command": "cat x"}),
    ]
    assert _run(messages, rules)[0]["changed"]


@pytest.mark.parametrize(
    ("command", "path"),
    [
        ("cat src/a.py", "src/a.py"),
        ("  head -n 20 src/a.py ", "src/a.py"),
        ("tail -5 log.txt", "log.txt"),
        ("sed -n '1,20p' a/b.c", "a/b.c"),
        ("cat a.py | grep x", None),
        ("cat a.py b.py", None),
        ("rm a.py", None),
    ],
)
def test_the_shell_pattern_reads_under_re2_as_documented(command: str, path: str | None) -> None:
    """The built-in shell pattern (RE2 syntax) finds the path of one file printed, nothing else."""
    tool = engine.read_tool_from_config({"name": "Bash", "arg": "command", "pattern": "shell"})
    key = tool.key({"command": command})
    assert path == (None if key is None else key.split("#")[0])


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (r"(?P<path>(a+)+)\2!", "does not compile"),  # a backreference: backtracking only
        (r"(?P<path>a)(?=b)", "does not compile"),  # lookahead
        ("(?P<path>" + "a" * 2000 + ")", "at most 1000"),
        (r"cat (\S+)", "group named 'path'"),
    ],
)
def test_patterns_re2_cannot_match_in_linear_time_are_refused(pattern: str, reason: str) -> None:
    """What needs backtracking, or is too long, is refused where the tool is built."""
    with pytest.raises(ValueError, match=reason):
        engine.read_tool_from_config({"name": "Bash", "arg": "command", "pattern": pattern})


def test_a_catastrophic_pattern_for_backtracking_matches_at_once() -> None:
    """(a+)+ and (.+)+! take exponential time in a backtracking engine; RE2 answers at once.

    The subjects are those that held a backtracking daemon for seconds (28
    characters) and for good (40); a command past the subject cap reads nothing.
    """
    nested = engine.read_tool_from_config(
        {"name": "Bash", "arg": "command", "pattern": "(?P<path>(a+)+)"}
    )
    assert nested.key({"command": "a" * 28 + "!"}) is None
    assert nested.key({"command": "a" * 28}) is not None
    bang = engine.read_tool_from_config(
        {"name": "Bash", "arg": "command", "pattern": "(?P<path>(.+)+)!"}
    )
    assert bang.key({"command": "cat src/some/long/path/to/a/module.py ok"}) is None
    assert bang.key({"command": "x" * 4095 + "!"}) is not None
    assert bang.key({"command": "x" * 4096 + "!"}) is None  # past MAX_SUBJECT_CHARS


def test_read_tools_come_from_the_config_file(tmp_path: Any) -> None:
    """[[read_tools]] tables extend the defaults; a bad one is a clear config error."""
    good = tmp_path / "good.toml"
    good.write_text('[[read_tools]]\nname = "cat_file"\narg = "filename"\n')
    config = load_config(["--config", str(good)], {})
    assert "src/a.py" == config.read_rules.key("cat_file", {"filename": "src/a.py"})
    bad = tmp_path / "bad.toml"
    bad.write_text('[[read_tools]]\nname = "x"\narg = "y"\npattern = "("\n')
    with pytest.raises(
        ConfigError, match=r"read_tools\[0\]: a read tool's pattern does not compile"
    ):
        load_config(["--config", str(bad)], {})
    # The operator's patterns are RE2 too: a backreference is refused, not run.
    bad.write_text('[[read_tools]]\nname = "x"\narg = "y"\npattern = \'(?P<path>(a+)+)\\2!\'\n')
    with pytest.raises(ConfigError, match=r"read_tools\[0\]: .*does not compile \(RE2"):
        load_config(["--config", str(bad)], {})


def test_the_truncation_notice_is_a_new_text_block_when_the_reply_has_no_text() -> None:
    """A first reply of only thinking and a call gets the notice as text after the thinking."""
    thinking = {"type": "thinking", "thinking": "hmm", "signature": "c2ln"}
    messages = [
        {"role": "user", "content": "task"},
        {
            "role": "assistant",
            "content": [thinking, {"type": "tool_use", "id": "a", "name": "Bash", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "a", "content": "done"}],
        },
        {"role": "assistant", "content": "next"},
        {"role": "user", "content": "more"},
    ]
    history = engine.MappedHistory(engine.DIALECTS["anthropic"], messages)
    state = engine.TaskState(reads=engine.DEFAULT_READ_RULES, dialect=history.dialect)
    state.cache = history.cache
    engine.compact(state, history.internal, "none", 5)
    view = history.view(state.truncated_messages(history.internal), state.deleted_range)
    reply = view[1]["content"]
    assert reply[0] is thinking  # the opaque part, byte for byte the caller's
    assert {"type": "text", "text": engine.DEFAULT_NOTICES.truncation} == reply[1]
    assert "tool_use" == reply[2]["type"]


@pytest.mark.parametrize(
    ("dialect", "call", "answer", "system"),
    [
        (
            "openai-responses",
            {"type": "function_call", "call_id": "c", "name": "Bash", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "done"},
            {"role": "developer", "content": "be brief"},
        ),
        (
            "openai-chat",
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c", "content": "done"},
            {"role": "system", "content": "be brief"},
        ),
    ],
)
def test_a_call_followed_only_by_system_messages_is_answered_before_them(
    dialect: str, call: Message, answer: Message, system: Message
) -> None:
    """The missing result (the task's notice text) goes between the call and the system message."""
    task = {"role": "user", "content": "task"}
    if dialect == "openai-responses":
        task = {"type": "message", **task}
    messages = [task, call, system]
    history = engine.MappedHistory(engine.DIALECTS[dialect], messages)
    state = engine.TaskState(reads=engine.DEFAULT_READ_RULES, dialect=history.dialect)
    state.cache = history.cache
    internal_view = state.truncated_messages(history.internal)
    view = history.view(internal_view, state.deleted_range, "no result")
    assert [task, call] == view[:2]
    assert view[3] is system
    text = view[2].get("output", view[2].get("content"))
    assert ("c", "no result") == (view[2].get("call_id", view[2].get("tool_call_id")), text)
    patch = engine.PatchMaker().of_mapped(
        history, internal_view, state.deleted_range, missing_result="no result"
    )
    assert patch is not None
    assert view == proto.apply_view_patch(messages, patch)
    # Once the caller answers it (after the system message), the answer is sent, then the
    # system message: never between a call and its result, never left out.
    history.sync([*messages, answer])
    view = history.view(state.truncated_messages(history.internal), state.deleted_range)
    assert [task, call, answer, system] == view


def test_calls_before_a_system_message_among_the_newest_calls_are_answered_before_it() -> None:
    """Responses items: a call left unanswered, a developer message, then the newest calls:
    the first call is no longer the newest, so its missing result goes before the
    developer message, in the view, its patch, a rebuilt newest message and the next view."""

    def call(call_id: str) -> Message:
        return {"type": "function_call", "call_id": call_id, "name": "Bash", "arguments": "{}"}

    def output(call_id: str, text: str) -> Message:
        return {"type": "function_call_output", "call_id": call_id, "output": text}

    task = {"type": "message", "role": "user", "content": "task"}
    system = {"role": "developer", "content": "be brief"}
    messages = [task, call("a"), system, call("b"), call("c")]
    history = engine.MappedHistory(engine.DIALECTS["openai-responses"], messages)
    state = engine.TaskState(reads=engine.DEFAULT_READ_RULES, dialect=history.dialect)
    state.cache = history.cache
    internal_view = state.truncated_messages(history.internal)
    view = history.view(internal_view, state.deleted_range, "no result")
    assert [task, messages[1], output("a", "no result"), system, *messages[3:]] == view
    assert view[3] is system  # the caller's own items, not copies
    assert view[4] is messages[3]
    patch = engine.PatchMaker().of_mapped(
        history, internal_view, state.deleted_range, missing_result="no result"
    )
    assert patch is not None
    assert view == proto.apply_view_patch(messages, patch)
    # The newest message rebuilt (another object than the history's) sends the same.
    rebuilt = [*internal_view[:-1], dict(internal_view[-1])]
    assert view == history.view(rebuilt, state.deleted_range, "no result")
    # Once b and c are answered, a is answered with them (its result never came), once.
    answers = [output("b", "done"), output("c", "done")]
    history.sync([*messages, *answers])
    view = history.view(state.truncated_messages(history.internal), state.deleted_range)
    missing = output("a", engine.DEFAULT_NOTICES.missing_result)  # the engine's repair
    assert [task, messages[1], system, *messages[3:], missing, *answers] == view


def test_a_notice_stays_on_its_result_in_the_first_message_after_a_cut() -> None:
    """The results a cut orphans in the first kept message are dropped after the overlay is
    applied, so an edit of such a result is dropped with it and never lands on the block
    that takes its place (the reminder after it, the image after that)."""
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
    }
    messages = [
        *TASK,
        *_read("a", "Read", {"file_path": "x.py"}),
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "b", "name": "Read", "input": {"file_path": "x.py"}}
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "b", "content": BODY},
                {"type": "text", "text": "Reminder: keep it short."},
                image,
            ],
        },
        *_read("c", "Read", {"file_path": "x.py"}),
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "thanks"},
    ]
    history = engine.MappedHistory(engine.DIALECTS["anthropic"], messages)
    state = engine.TaskState(reads=engine.DEFAULT_READ_RULES, dialect=history.dialect)
    state.cache = history.cache
    assert state.optimize_file_reads(history.internal, 1)["changed"]  # "b" becomes the notice
    state.deleted_range = [2, 3]  # internal 4 ("b"'s result; "ok" and "a" are one) is kept first
    view = history.view(state.truncated_messages(history.internal), state.deleted_range)
    kept = next(
        m["content"] for m in view if isinstance(m["content"], list) and image in m["content"]
    )
    assert [{"type": "text", "text": "Reminder: keep it short."}] == [
        block for block in kept if block["type"] == "text"
    ]
    assert engine.DEFAULT_NOTICES.duplicate_file_read not in str(view)


def test_read_tools_belong_to_a_native_dialect() -> None:
    """The Cline dialect's reads are its text headers: read tools given for it are refused; a
    native dialect without any given counts the default ones."""
    with pytest.raises(ValueError, match="text headers"):
        engine.TaskState(reads=engine.DEFAULT_READ_RULES)
    assert engine.TaskState().reads is None
    state = engine.TaskState(dialect=engine.DIALECTS["anthropic"])
    assert state.reads is engine.DEFAULT_READ_RULES
    with pytest.raises(ValueError, match="text headers"):
        state.set_dialect(engine.get_dialect(proto.CLINE), engine.DEFAULT_READ_RULES)
