"""An Anthropic Messages agent loop with ctxwin in one line: ``wrap(Anthropic())``.

``messages.create`` and ``messages.stream`` of the wrapped client send
ctxwin's view of the history; ``system`` passes through; the usage of each
response (streamed ones too) is fed to the next turn; when the API answers
``prompt is too long`` ctxwin compacts and the request is sent once more.

    .venv/bin/python client/examples/anthropic_messages.py [--endpoint ENDPOINT] [--base-url URL]
"""

from __future__ import annotations

import os
from typing import Any

from _provider import arguments, provider, read_file, report
from anthropic import Anthropic

from ctxwin.client.integrations import window_of
from ctxwin.client.integrations.anthropic import wrap

TOOLS: Any = [
    {
        "name": "read_file",
        "description": "Read a file of the project.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    }
]


def main() -> None:
    """Forty turns of tool calls (every other one streamed), then the answer."""
    args = arguments(__doc__.splitlines()[0] if __doc__ else None)

    with provider(args.base_url, limit=8_000, tool_turns=args.turns) as base_url:
        client = wrap(
            Anthropic(base_url=base_url, api_key=os.environ.get("ANTHROPIC_API_KEY", "fake")),
            task=f"example-anthropic-{os.getpid()}",
            context_window=8_000,
            endpoint=args.endpoint,
            on_turn=report,
            ephemeral=True,  # an example: the daemon writes nothing, keeps nothing
        )
        messages: list[Any] = [
            {"role": "user", "content": "The result of main() is wrong; fix it."}
        ]
        request: dict[str, Any] = {
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "system": "You fix bugs. Read what you need.",
            "tools": TOOLS,
        }
        for turn in range(100):
            if turn % 2:
                with client.messages.stream(messages=messages, **request) as stream:
                    response = stream.get_final_message()
            else:
                response = client.messages.create(messages=messages, **request)
            messages.append({"role": "assistant", "content": response.content})
            calls = [block for block in response.content if block.type == "tool_use"]
            if not calls:
                break
            results: list[Any] = [
                {
                    "type": "tool_result",
                    "tool_use_id": call.id,
                    "content": read_file(str(dict(call.input)["path"])),
                }
                for call in calls
            ]
            messages.append({"role": "user", "content": results})
        last = window_of(client).last()
        answer = "".join(block.text for block in response.content if block.type == "text")
        print(f"answer after {len(messages)} messages ({last and last.sent} sent): {answer}")


if __name__ == "__main__":
    main()
