"""Small synthetic conversations in the shapes of real agents' logs, made by the code here.

The real conversations (``tests/_corpus.py``) stay outside the repository; the
tests that need one of their shapes run on these instead, and on the real files
too when the corpus folder is given. Each is deterministic (no randomness), a
few hundred kilobytes, and written by :func:`conversation_file`:

- ``cline_task.json``: a Cline ``api_conversation_history.json``. The assistant
  sends native ``tool_use`` blocks (several at once now and then) whose results
  come back as text (``[read_file for 'x'] Result:``, no ``tool_result``
  blocks), with ``<environment_details>`` after them; paths read again;
  ``thinking`` blocks with signatures; one huge search result; calls left
  without a result where the task was interrupted (``[TASK RESUMPTION]``); each
  assistant message carries ``modelInfo`` and the provider's token counts of
  its request in ``metrics.tokens``.
- ``chat_log.json``: an OpenAI Chat Completions object (``model``,
  ``messages``), as converted from a Claude Code log: ``system`` messages (one
  mid-way), assistant messages with ``content: null`` and ``tool_calls``,
  parallel calls split over consecutive assistant messages (a result between
  them now and then), ``role: "tool"`` results, ``Read`` calls of paths read
  again, one call without a result.
- ``claude_code_log.jsonl``: a Claude Code JSONL event log: one JSON object a
  line; ``user``/``assistant`` lines hold an Anthropic ``message``; one API
  response is split over several lines sharing ``message.id`` (one block
  each, ``usage`` on each); ``thinking`` blocks with signatures; ``tool_result``
  blocks in user lines, each result a line of its own; ``Read`` calls with
  ``file_path`` on paths read again; a result answering no call; bookkeeping
  lines (file-history snapshots, queue operations, system notes) to skip.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests._corpus import corpus_file, corpus_param
from tests._dialect_data import Call, Turn, render_anthropic, render_chat

__all__ = ["SHAPES", "conversation_file", "shape_text"]

Message = dict[str, Any]
_SOURCES = ["src/app.ts", "src/lib/db.ts", "src/routes/users.ts", "README.md", "package.json"]
_CLINE_MODEL = {"modelId": "claude-sonnet-4-5", "providerId": "anthropic", "mode": "act"}
_ENVIRONMENT = (
    "<environment_details>\n# VSCode Visible Files\nsrc/app.ts\n\n"
    "# VSCode Open Tabs\nsrc/app.ts\nsrc/lib/db.ts\n\n# Current Mode\nACT MODE\n"
    "</environment_details>"
)


def _source(path: str, version: int, lines: int = 40) -> str:
    """The text of ``path`` at ``version``: numbered lines of code-like text."""
    stem = Path(path).stem.replace(".", "_")
    return "\n".join(
        f"{number} | export function {stem}_{number}(input: number): number {{ "
        f"return input * {version + number} }}"
        for number in range(1, lines + 1)
    )


def _search_output(matches: int) -> str:
    """A search over the whole tree: one huge result."""
    return "\n".join(
        f"src/module_{index % 97}/file_{index}.ts\n│----\n│const value_{index} = "
        f"load('{index}') // matches the pattern\n│----"
        for index in range(matches)
    )


def _text(text: str) -> Message:
    return {"type": "text", "text": text}


def _use(call: str, name: str, args: dict[str, Any]) -> Message:
    return {"type": "tool_use", "id": call, "name": name, "input": args}


def _cline_step(step: int) -> tuple[list[Message], list[Message]]:
    """Step ``step`` of the Cline task: the assistant's blocks and the user's answer
    (empty when the task was interrupted before a result)."""
    path = _SOURCES[step % len(_SOURCES)]
    if step == 17:  # one huge result
        pattern = {"path": ".", "regex": "load\\(", "file_pattern": "*.ts"}
        header = "[search_files for 'load\\(' in '*.ts'] Result:\nFound 700 results.\n\n"
        return [_use(f"toolu_{step:03d}", "search_files", pattern)], [
            _text(header + _search_output(700))
        ]
    if step % 13 == 12:  # interrupted: the call never gets a result
        question = _use(f"toolu_{step:03d}", "ask_followup_question", {"question": "Go on?"})
        return [_text("Should I continue with the routes?"), question], []
    if step % 5 == 3:  # several reads at once
        paths = [path, _SOURCES[(step + 1) % len(_SOURCES)]]
        uses = [
            _use(f"toolu_{step:03d}_{n}", "read_file", {"path": p}) for n, p in enumerate(paths)
        ]
        texts = [_text(f"[read_file for '{p}'] Result:\n{_source(p, step)}") for p in paths]
        return uses, [*texts, _text(_ENVIRONMENT)]
    if step % 4 == 2:
        content = _source(path, step + 1)
        write = _use(f"toolu_{step:03d}", "write_to_file", {"path": path, "content": content})
        answer = f"[write_to_file for '{path}'] Result:\nThe content was saved to {path}."
        return [_text(f"Updating {path}."), write], [_text(answer), _text(_ENVIRONMENT)]
    blocks: list[Message] = []
    if step % 3 == 0:
        blocks.append(
            {"type": "thinking", "thinking": f"Step {step}: read {path}.", "signature": "c2ln"}
        )
    blocks += [_text(f"Reading {path}."), _use(f"toolu_{step:03d}", "read_file", {"path": path})]
    result = f"[read_file for '{path}'] Result:\n{_source(path, step)}"
    return blocks, [_text(result), _text(_ENVIRONMENT)]


def _tokens(messages: list[Message]) -> int:
    """About the tokens a provider counts for ``messages`` (their text), plus its prompt."""
    return 2_500 + sum(len(json.dumps(message["content"])) for message in messages) * 10 // 37


def cline_task(steps: int = 60) -> list[Message]:
    """The Cline task (see the module's docstring)."""
    messages: list[Message] = [
        {
            "role": "user",
            "content": [
                _text("<task>\nAdd paging to the users route.\n</task>"),
                _text(_ENVIRONMENT),
            ],
            "ts": 1_760_000_000_000,
        }
    ]
    for step in range(steps):
        blocks, answer = _cline_step(step)
        prompt = _tokens(messages)
        messages.append(
            {
                "role": "assistant",
                "content": blocks,
                "modelInfo": dict(_CLINE_MODEL),
                "metrics": {"tokens": {"prompt": prompt, "completion": 180, "cached": prompt // 2}},
                "ts": 1_760_000_000_000 + 2 * step + 1,
            }
        )
        if not answer:
            answer = [
                _text("[TASK RESUMPTION] This task was interrupted 2 minutes ago."),
                _text(
                    "New instructions for task continuation:\n<user_message>\nYes\n</user_message>"
                ),
                _text(_ENVIRONMENT),
            ]
        messages.append({"role": "user", "content": answer, "ts": 1_760_000_000_000 + 2 * step + 2})
    return messages


def _output(call: Call, path: str, step: int) -> str:
    """What ``call`` answered: the file it read, a test run's report, an edit's line."""
    if call.name == "Read":
        return _source(path, step)
    if call.name == "Bash":
        return "\n".join(
            f"PASS tests/case_{step}_{number}.test.ts ({step * 7 + number} ms) "
            f"users route pages {number * 25} rows of {step + number} in order"
            for number in range(60)
        )
    return f"The file /repo/{path} has been updated (step {step})."


def _agent_turns(steps: int, split: bool) -> list[Turn]:
    """A coding agent's turns in no dialect yet: reads of paths read again, commands, edits,
    parallel calls (split over messages when ``split``), one call without a result, a result
    answering no call (when not ``split``), a system message mid-way."""
    turns = [
        Turn("system", "You are a coding agent. Use the tools to read and change files."),
        Turn("user", "The users route returns everything at once: add paging."),
    ]
    for step in range(steps):
        path = _SOURCES[step % len(_SOURCES)]
        calls = [Call(f"call_{step:03d}", "Read", {"file_path": f"/repo/{path}"})]
        if step % 3 == 1:
            calls.append(Call(f"call_{step:03d}_b", "Bash", {"command": f"npm test -- {step}"}))
        if step % 7 == 5:
            edit = {"file_path": f"/repo/{path}", "old_string": "input", "new_string": "value"}
            calls.append(Call(f"call_{step:03d}_c", "Edit", edit))
        turns.append(
            Turn(
                "assistant",
                f"Step {step}: looking at {path}." if step % 2 == 0 else "",
                reasoning=not split and step % 4 == 0,
                calls=calls,
                split=split and len(calls) > 1,
            )
        )
        results = [(call.id, _output(call, path, step)) for call in calls]
        if step == 21:
            results = results[1:]  # the Read of this step never got its result
        if not split and step == 30:
            results.append(("call_orphan", "a result of a call the log lost"))
        turns.append(Turn("results", results=results, split=len(results) > 1))
        if step == 25:
            turns.append(Turn("system", "Reminder: keep the tests passing."))
        if step % 10 == 9:
            turns.append(Turn("user", f"Good. Now step {step + 1}, please."))
    return turns


def chat_log(steps: int = 64) -> dict[str, Any]:
    """The OpenAI Chat object (see the module's docstring)."""
    return {"model": "claude-sonnet-4-5", "messages": render_chat(_agent_turns(steps, True))}


def claude_code_log(steps: int = 64) -> list[dict[str, Any]]:
    """The lines of the Claude Code log (see the module's docstring)."""
    lines: list[dict[str, Any]] = [
        {"type": "queue-operation", "operation": "enqueue", "sessionId": "s1"},
        {
            "type": "file-history-snapshot",
            "messageId": "m0",
            "snapshot": {"trackedFileBackups": {}},
        },
    ]
    response = 0
    for number, message in enumerate(render_anthropic(_agent_turns(steps, False))):
        stamp = {"uuid": f"u{number}", "sessionId": "s1", "timestamp": f"2026-01-01T00:{number}"}
        if message["role"] == "user":
            lines.append({"type": "user", "message": message, **stamp})
            continue
        response += 1
        blocks = message["content"] if isinstance(message["content"], list) else [_text("ok")]
        for place, block in enumerate(blocks):
            lines.append(
                {
                    "type": "assistant",
                    "message": {
                        "id": f"msg_{response:04d}",
                        "type": "message",
                        "role": "assistant",
                        "model": "claude-sonnet-4-5",
                        "content": [block],
                        "stop_reason": "tool_use" if block["type"] == "tool_use" else None,
                        "usage": {"input_tokens": 12 + number, "output_tokens": 40 + place},
                    },
                    **stamp,
                }
            )
        if response % 9 == 0:
            lines.append({"type": "system", "subtype": "compact_boundary", "content": "noted"})
            lines.append(
                {"type": "file-history-snapshot", "messageId": f"m{number}", "snapshot": {}}
            )
    return lines


def shape_text(name: str) -> str:
    """The text of the synthetic conversation ``name`` (a key of :data:`SHAPES`)."""
    data = SHAPES[name]()
    if name.endswith(".jsonl"):
        return "".join(json.dumps(line) + "\n" for line in data)
    return json.dumps(data, indent=1)


SHAPES: dict[str, Any] = {
    "cline_task.json": cline_task,
    "chat_log.json": chat_log,
    "claude_code_log.jsonl": claude_code_log,
}
"""The synthetic conversations by file name, each made by its function."""

LOGS = [
    "chat_log.json",
    "claude_code_log.jsonl",
    corpus_param("openai_richh_claude_code_develop1.json"),
    corpus_param("anthropic_claude_code_campusops_session2.jsonl"),
]
"""The logged agent conversations in a provider's own dialect: the synthetic OpenAI Chat and
Claude Code logs, and one real log of each kind (skipped without the corpus)."""


def conversation_file(name: str, folder: Path) -> Path:
    """A conversation's file: a synthetic one of :data:`SHAPES` written into ``folder``, or
    the real one of the corpus folder (:func:`tests._corpus.corpus_file`, which skips)."""
    if name not in SHAPES:
        return corpus_file(name)
    path = folder / name
    path.write_text(shape_text(name), encoding="utf-8")
    return path
