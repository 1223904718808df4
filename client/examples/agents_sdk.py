"""An OpenAI Agents SDK run with ctxwin in one line: ``RunConfig(call_model_input_filter=...)``.

Before each model call the filter sends the agent's input items to ctxwin
(dialect ``openai-responses``) and gives the model the view; items it keeps
are the SDK's own objects. ``hooks=`` hands each response's usage back.

    .venv/bin/python client/examples/agents_sdk.py [--endpoint ENDPOINT] [--base-url URL]
"""

from __future__ import annotations

import os

from _provider import arguments, provider, read_file, report
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from ctxwin.client.integrations.agents import ContextWindowFilter


@function_tool(name_override="read_file")
def read_project_file(path: str) -> str:
    """Read a file of the project."""
    return read_file(path)


def main() -> None:
    """One run of forty tool calls; one line per model call that ctxwin cut."""
    args = arguments(__doc__.splitlines()[0] if __doc__ else None)
    set_tracing_disabled(True)  # the example sends nothing anywhere but its provider

    with provider(args.base_url, limit=12_000, tool_turns=args.turns) as base_url:
        openai = AsyncOpenAI(
            base_url=base_url + "/v1", api_key=os.environ.get("OPENAI_API_KEY", "fake")
        )
        ctxwin_filter = ContextWindowFilter(
            task=f"example-agents-{os.getpid()}",
            context_window=12_000,
            endpoint=args.endpoint,
            on_turn=report,
            ephemeral=True,  # an example: the daemon writes nothing, keeps nothing
        )
        agent = Agent(
            name="fixer",
            instructions="You fix bugs. Read what you need.",
            model=OpenAIResponsesModel("gpt-4o-mini", openai),
            tools=[read_project_file],
        )
        result = Runner.run_sync(
            agent,
            "The result of main() is wrong; fix it.",
            run_config=ctxwin_filter.run_config(),
            hooks=ctxwin_filter.hooks,
            max_turns=100,
        )
        print(f"answer after {len(result.to_input_list())} items: {result.final_output}")


if __name__ == "__main__":
    main()
