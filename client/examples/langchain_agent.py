"""A LangChain v1 agent with ctxwin in one line: ``middleware=[ContextWindowMiddleware()]``.

The middleware gives each model call ctxwin's view of the agent's messages;
the agent's state keeps the full history.

    .venv/bin/python client/examples/langchain_agent.py [--endpoint ENDPOINT] [--base-url URL]
"""

from __future__ import annotations

import os

from _provider import arguments, provider, read_file, report
from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from ctxwin.client.integrations.langchain import ContextWindowMiddleware


@tool("read_file")
def read_project_file(path: str) -> str:
    """Read a file of the project."""
    return read_file(path)


def main() -> None:
    """One agent run of forty tool calls; one line per model call that ctxwin cut."""
    args = arguments(__doc__.splitlines()[0] if __doc__ else None)

    with provider(args.base_url, limit=8_000, tool_turns=args.turns) as base_url:
        model = ChatOpenAI(
            model="gpt-4o-mini",
            base_url=base_url + "/v1",
            api_key=os.environ.get("OPENAI_API_KEY", "fake"),  # type: ignore[arg-type]
        )
        middleware = ContextWindowMiddleware(
            task=f"example-langchain-{os.getpid()}",
            context_window=8_000,
            endpoint=args.endpoint,
            on_turn=report,
            ephemeral=True,  # an example: the daemon writes nothing, keeps nothing
        )
        agent = create_agent(
            model,
            tools=[read_project_file],
            system_prompt="You fix bugs. Read what you need.",
            middleware=[middleware],
        )
        state = agent.invoke(
            {"messages": [{"role": "user", "content": "The result of main() is wrong; fix it."}]},
            {"recursion_limit": 200},
        )
        print(f"answer after {len(state['messages'])} messages: {state['messages'][-1].content}")


if __name__ == "__main__":
    main()
