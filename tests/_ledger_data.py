"""Synthetic conversations for the task ledger: a Cline XML-tool task and a native one.

The Cline task has the shape of a real one (calls written as XML in the
assistant's text, results as text headers, Cline's boilerplate, environment
dumps and shell commands between the feedback a person typed), made up here.
"""

from __future__ import annotations

from typing import Any

from ctxwin.engine import MappedHistory, get_dialect, user_instructions
from tests._dialect_data import RENDER, Call, Turn

Message = dict[str, Any]
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


def snippet(text: str) -> str:
    """What "instructions kept" looks for (docs/SUMMARIES.md): 160 characters, spaces normalised."""
    return " ".join(text.split())[:160]


def kept(snippet_: str, ledger: str) -> bool:
    """Whether the snippet is in ``ledger`` (spaces normalised there too)."""
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
