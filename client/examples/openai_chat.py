"""An OpenAI Chat Completions agent loop with ctxwin in one line: ``wrap(OpenAI())``.

The agent keeps its full history and appends the SDK's response messages as
they are; the wrapped client sends ctxwin's view instead, feeds each
response's usage to the next turn, and when the provider answers
``context_length_exceeded`` it compacts and sends once more. The model reads
the same two files again and again: earlier copies reach it as ctxwin's
duplicate-read notice.

    .venv/bin/python client/examples/openai_chat.py [--endpoint ENDPOINT] [--base-url URL]
"""

from __future__ import annotations

import json
import os
from typing import Any

from _provider import arguments, provider, read_file, report
from openai import OpenAI

from ctxwin.client.integrations.openai import wrap

TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the project.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


def main() -> None:
    """Forty turns of tool calls, then the answer; one line per turn that ctxwin cut."""
    args = arguments(__doc__.splitlines()[0] if __doc__ else None)

    with provider(args.base_url, limit=8_000, tool_turns=args.turns) as base_url:
        client = wrap(
            OpenAI(base_url=base_url + "/v1", api_key=os.environ.get("OPENAI_API_KEY", "fake")),
            task=f"example-openai-{os.getpid()}",
            context_window=8_000,
            endpoint=args.endpoint,
            on_turn=report,
            ephemeral=True,  # an example: the daemon writes nothing, keeps nothing
        )
        messages: list[Any] = [
            {"role": "system", "content": "You fix bugs. Read what you need."},
            {"role": "user", "content": "The result of main() is wrong; fix it."},
        ]
        while True:
            response = client.chat.completions.create(
                model="gpt-4o-mini", messages=messages, tools=TOOLS
            )
            message = response.choices[0].message
            messages.append(message)  # the SDK's object, as is
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                if call.type != "function":
                    continue
                path = json.loads(call.function.arguments)["path"]
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": read_file(path)}
                )
        print(f"answer after {len(messages)} messages: {message.content}")


if __name__ == "__main__":
    main()
