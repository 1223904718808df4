"""An agent loop on ctxwin: a main task and a subagent sharing one daemon.

Each turn the agent asks ctxwind which messages to send (``prepare_request``
with the previous request's usage), sends them to the model, and records the
answer. The model here is simulated: it refuses prompts above a size with the
kind of error providers send when a request does not fit the context window.
The agent recognises that error (``is_context_window_error``), compacts the
task (``compact`` with ``keep="quarter"``, keeping the task itself in the first
user message: ``keep_task=True``) and retries once.

Half-way, the agent hands a side question to a subagent: an ephemeral task
(kept in the daemon's memory only) on the same daemon and the same client.

Run it next to a running daemon::

    .venv/bin/python client/examples/agent_loop.py [--endpoint ENDPOINT]   (from a checkout)
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ctxwin.client import Client, Task, is_context_window_error, usage_from_anthropic
from ctxwin.proto import Model, Usage

MODEL: Model = {"id": "example-model", "context_window": 200_000}
PROVIDER_LIMIT_CHARS = 12_000
"""The simulated provider refuses prompts longer than this."""


class ProviderError(Exception):
    """What a provider SDK raises: an HTTP status and a message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _chars(messages: list[Any]) -> int:
    return sum(len(str(message["content"])) for message in messages)


def call_model(messages: list[Any]) -> tuple[str, dict[str, int]]:
    """The simulated model: an answer and Anthropic-style usage, or a context-window error."""
    size = _chars(messages)
    if size > PROVIDER_LIMIT_CHARS:
        raise ProviderError(
            400, f"prompt is too long: {size // 4} tokens > {PROVIDER_LIMIT_CHARS // 4} maximum"
        )
    answer = f"Done with step {len(messages)}."
    return answer, {"input_tokens": size // 4, "output_tokens": len(answer) // 4}


def run_turn(task: Task, history: list[dict[str, Any]], previous: Usage | None) -> Usage:
    """One model request for ``task``: prepare, send, and on overflow compact and retry once."""
    prepared = task.prepare_request(history, MODEL, previous_request=previous)
    try:
        answer, usage = call_model(prepared["messages"])
    except ProviderError as error:
        if not is_context_window_error(error):
            raise
        compacted = task.compact(history, "quarter", keep_task=True)
        print(
            f"[{task.id}] context window exceeded ({error.message}); "
            f"compacted to range {compacted['deleted_range']}"
        )
        view = task.truncated_messages(history)["messages"]
        answer, usage = call_model(view)  # the one retry; a second failure propagates
        print(f"[{task.id}] retry succeeded with {len(view)} of {len(history)} messages")
    history.append({"role": "assistant", "content": [{"type": "text", "text": answer}]})
    return usage_from_anthropic(usage)


def tool_result(step: int) -> dict[str, Any]:
    """A user turn carrying a bulky tool result, as agents produce."""
    output = f"output of step {step}\n" + "log line\n" * 170
    return {"role": "user", "content": [{"type": "text", "text": output}]}


def run_subagent(client: Client, parent: Task) -> str:
    """A subagent on its own ephemeral task: a few turns, then its task is closed."""
    subagent = client.task(f"{parent.id}.sub-1", ephemeral=True)
    history: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Find where config is read."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Searching."}]},
    ]
    previous: Usage | None = None
    for step in range(3):
        history.append(tool_result(step))
        previous = run_turn(subagent, history, previous)
    subagent.close()
    print(f"[{subagent.id}] finished after {len(history)} messages (ephemeral, closed)")
    return "config is read in settings.py"


def main() -> None:
    """Run the main task for twelve turns, with one subagent half-way."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--endpoint", help="daemon endpoint (default: $CTXWIN_ENDPOINT, else the default)"
    )
    args = parser.parse_args()
    with Client(args.endpoint) as client:
        print(f"daemon {client.ping()['version']} at {client.endpoint}")
        # An agent's task is persistent (the default), so that a restart finds it; the
        # example's is ephemeral, so that it leaves nothing behind.
        task = client.task(f"example-main-{os.getpid()}", ephemeral=True)
        history: list[dict[str, Any]] = [
            {"role": "user", "content": [{"type": "text", "text": "Refactor the parser."}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Starting."}]},
        ]
        previous: Usage | None = None
        for step in range(12):
            history.append(tool_result(step))
            if step == 6:
                finding = run_subagent(client, task)
                history[-1]["content"].append({"type": "text", "text": f"Subagent: {finding}"})
            previous = run_turn(task, history, previous)
        state = task.inspect()
        print(
            f"[{task.id}] {len(history)} messages, range {state['deleted_range']}, "
            f"{len(state['updates'])} overlay entries"
        )
        task.close()


if __name__ == "__main__":
    main()
