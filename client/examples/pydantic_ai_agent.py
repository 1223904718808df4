"""A Pydantic AI agent with ctxwin in one line: ``capabilities=[ContextWindow()]``.

The capability gives each model request ctxwin's view; the run keeps its full
history (``all_messages()``), and a ``context_length_exceeded`` answer makes
ctxwin compact and the request go once more.

    .venv/bin/python client/examples/pydantic_ai_agent.py [--endpoint ENDPOINT] [--base-url URL]
"""

from __future__ import annotations

import os

from _provider import arguments, provider, read_file, report
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from ctxwin.client.integrations.pydantic_ai import ContextWindow


def main() -> None:
    """One agent run of forty tool calls; one line per model request that ctxwin cut."""
    args = arguments(__doc__.splitlines()[0] if __doc__ else None)

    with provider(args.base_url, limit=8_000, tool_turns=args.turns) as base_url:
        model = OpenAIChatModel(
            "gpt-4o-mini",
            provider=OpenAIProvider(
                base_url=base_url + "/v1", api_key=os.environ.get("OPENAI_API_KEY", "fake")
            ),
        )
        context_window = ContextWindow(
            task=f"example-pydantic-ai-{os.getpid()}",
            context_window=8_000,
            endpoint=args.endpoint,
            on_turn=report,
            ephemeral=True,  # an example: the daemon writes nothing, keeps nothing
        )
        agent = Agent(
            model,
            system_prompt="You fix bugs. Read what you need.",
            capabilities=[context_window],
        )

        @agent.tool_plain(name="read_file")
        def read_project_file(path: str) -> str:
            """Read a file of the project."""
            return read_file(path)

        result = agent.run_sync("The result of main() is wrong; fix it.")
        print(f"answer after {len(result.all_messages())} messages: {result.output}")


if __name__ == "__main__":
    main()
