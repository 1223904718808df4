"""The integration tests' agent (its tool, its Anthropic turn) and what they check in what the
fake provider received."""

from __future__ import annotations

import itertools
import json
from typing import Any

from ctxwin.proto import SUMMARY_MARK
from tests._fake_provider import FakeProvider, Recorded

NOTICE = "[ctxwin-test] an earlier copy of this file was dropped; a later read holds it."
"""The daemon's duplicate-read notice in these tests, to find it in what the provider got."""
STUB = "was removed to save context"
"""In the stub ``auto`` leaves of a masked tool result."""

PATHS = tuple("src/app.py" if turn % 4 == 0 else f"src/mod{turn}.py" for turn in range(60))
"""What the fake model reads in the long conversations: ``src/app.py`` every fourth turn (each
read makes the earlier copies stale), a new file in between (so notices alone do not save
enough and whole turns are cut too)."""


def read_file(path: str) -> str:
    """The tool of every test agent: a file's text (about 400 of the fake's tokens)."""
    return f"# {path}\n" + "def compute(n):\n    return n * 2\n" * 50


CHAT_TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
"""The agent's tool as an OpenAI Chat request declares it."""
ANTHROPIC_TOOLS: Any = [{"name": "read_file", "input_schema": {"type": "object", "properties": {}}}]
"""The agent's tool as an Anthropic request declares it."""


def chat_results(calls: Any) -> list[Any]:
    """The tool messages answering ``calls`` (SDK objects or maps of the same shape)."""

    def field(value: Any, name: str) -> Any:
        return value[name] if isinstance(value, dict) else getattr(value, name)

    return [
        {
            "role": "tool",
            "tool_call_id": field(call, "id"),
            "content": read_file(json.loads(field(field(call, "function"), "arguments"))["path"]),
        }
        for call in calls or []
    ]


def chat_turn(client: Any, history: list[Any], tools: Any = CHAT_TOOLS) -> None:
    """One turn of the agent on a (wrapped) ``OpenAI`` client's ``chat.completions.create``:
    its message (the SDK's object, as callers append it) and the tool messages answering its
    calls appended to ``history``."""
    response = client.chat.completions.create(model="gpt-4o", messages=history, tools=tools)
    history.append(response.choices[0].message)
    history += chat_results(response.choices[0].message.tool_calls)


def tool_results(content: Any) -> list[Any]:
    """The ``tool_result`` blocks answering the ``tool_use`` blocks of an Anthropic answer."""
    return [
        {"type": "tool_result", "tool_use_id": b.id, "content": read_file(b.input["path"])}
        for b in content
        if b.type == "tool_use"
    ]


def anthropic_turn(client: Any, history: list[Any], options: Any, stream: bool = False) -> None:
    """One turn of the agent on a (wrapped) ``Anthropic`` client: ``messages.stream`` or
    ``messages.create``, then its answer (the SDK's blocks as they are) and the tool results
    appended to ``history``."""
    if stream:
        with client.messages.stream(messages=history, **options) as streamed:
            content = streamed.get_final_message().content
    else:
        content = client.messages.create(messages=history, **options).content
    history.append({"role": "assistant", "content": content})
    history.append({"role": "user", "content": tool_results(content)})


def anthropic_agent(
    client: Any, turns: int, system: Any = "You fix bugs.", stream: bool = True
) -> list[Any]:
    """The agent's run on a (wrapped) ``Anthropic`` client: the task, then ``turns`` turns of
    :func:`anthropic_turn` (every other one streamed, with ``stream``); the history."""
    history: list[Any] = [{"role": "user", "content": "main() is wrong; fix it."}]
    options: Any = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "system": system,
        "tools": ANTHROPIC_TOOLS,
    }
    for turn in range(turns):
        anthropic_turn(client, history, options, stream=stream and turn % 2 == 1)
    return history


async def anthropic_turn_async(
    client: Any, history: list[Any], options: Any, stream: bool = False
) -> None:
    """:func:`anthropic_turn` on a (wrapped) ``AsyncAnthropic`` client."""
    if stream:
        async with client.messages.stream(messages=history, **options) as streamed:
            content = (await streamed.get_final_message()).content
    else:
        content = (await client.messages.create(messages=history, **options)).content
    history.append({"role": "assistant", "content": content})
    history.append({"role": "user", "content": tool_results(content)})


def answered(provider: FakeProvider, path: str) -> list[Recorded]:
    """The requests to ``path`` that the provider answered (200)."""
    return [r for r in provider.sent(path) if r.status == 200]


def assert_valid_and_shrinking(provider: FakeProvider, path: str, turns: int) -> list[Recorded]:
    """Every request was valid and answered; views shrank; what left them was said.

    Checks, over the requests to ``path``: none broke the provider's pairing
    rules (its own check, the reason a real API answers 400) and none was
    refused as too long; there were at least ``turns``; at least one sent
    fewer conversation items and fewer tokens than the request before it (the
    view shrank once the window was reached); and at least one held a
    duplicate-read notice, a stub or the ledger of the turns left out.
    """
    sent = provider.sent(path)
    assert [] == [r.problems for r in sent if r.problems]
    assert [200] * len(sent) == [r.status for r in sent]
    assert turns <= len(sent)
    sizes = [len(r.history) for r in sent]
    assert any(later < earlier for earlier, later in itertools.pairwise(sizes)), sizes
    tokens = [r.tokens for r in sent]
    assert any(later < earlier for earlier, later in itertools.pairwise(tokens)), tokens
    # The adapters ask for auto: old results become stubs, and a rebuild leaves turns out
    # with the ledger of what they held (docs/STRATEGIES.md); a read's notice is cline's.
    said = (NOTICE, STUB, SUMMARY_MARK)
    assert any(any(mark in json.dumps(r.body) for mark in said) for r in sent)
    assert max(r.tokens for r in sent) <= provider.limit
    return sent
