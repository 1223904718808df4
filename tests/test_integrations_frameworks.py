"""The Agents SDK filter, the LangChain middleware and the Pydantic AI capability, end to end.

Each runs the real framework against the fake provider (OpenAI's API) and a
real daemon, and the assertions are on what the provider received.
"""

from __future__ import annotations

import asyncio
from typing import Any

import openai
from agents import Agent as AgentsAgent
from agents import OpenAIResponsesModel, RunConfig, Runner, function_tool, set_tracing_disabled
from agents.run_config import CallModelData, ModelInputData
from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits

from ctxwin.client.integrations import Turn
from ctxwin.client.integrations.agents import ContextWindowFilter
from ctxwin.client.integrations.langchain import ContextWindowMiddleware
from ctxwin.client.integrations.pydantic_ai import ContextWindow
from tests._conversation import PATHS, assert_valid_and_shrinking, read_file
from tests._daemon import DaemonProcess
from tests._fake_provider import CHAT, RESPONSES, FakeProvider

TASK = "main() is wrong; fix it."


def _retried_once_each_time(statuses: list[int]) -> None:
    """Every refusal was followed by one retry that the provider answered."""
    assert 400 in statuses
    for index, status in enumerate(statuses):
        if status == 400:
            assert 200 == statuses[index + 1], statuses


# LangChain


@tool("read_file")
def lc_read_file(path: str) -> str:
    """Read a file of the project."""
    return read_file(path)


def _langchain_run(
    provider: FakeProvider, ctxwind: DaemonProcess, task: str, window: int | None
) -> tuple[dict[str, Any], list[Turn]]:
    turns: list[Turn] = []
    model = ChatOpenAI(
        model="gpt-4o",
        base_url=provider.openai_url,
        api_key="k",  # type: ignore[arg-type]
        max_retries=0,
    )
    middleware = ContextWindowMiddleware(
        task=task, context_window=window, endpoint=ctxwind.endpoint, on_turn=turns.append
    )
    agent = create_agent(
        model, tools=[lc_read_file], system_prompt="You fix bugs.", middleware=[middleware]
    )
    state = agent.invoke(
        {"messages": [{"role": "user", "content": TASK}]}, {"recursion_limit": 400}
    )
    return state, turns


def test_a_60_turn_langchain_agent_sends_shrinking_views_and_keeps_its_state(
    ctxwind: DaemonProcess,
) -> None:
    """The provider gets valid, cut views with notices; the agent's state keeps every message."""
    with FakeProvider(limit=8_000, tool_turns=60, paths=PATHS) as provider:
        state, turns = _langchain_run(provider, ctxwind, "langchain-60", 8_000)
        sent = assert_valid_and_shrinking(provider, CHAT, 61)
    assert 1 + 60 * 2 + 1 == len(state["messages"])  # the task, 60 calls and results, the answer
    assert len(sent[-1].history) < len(state["messages"])
    assert "system" == sent[-1].history[0]["role"]
    assert 61 == len(turns)
    assert all(turn.usage is not None for turn in turns)


def test_the_langchain_middleware_compacts_and_retries_after_the_error(
    ctxwind: DaemonProcess,
) -> None:
    """With the window unknown to ctxwin, each context_length_exceeded gets one smaller retry.

    The provider's limit is below what ``auto`` keeps of the last calls' results,
    so refusals still come."""
    with FakeProvider(limit=2_000, tool_turns=12) as provider:
        _, turns = _langchain_run(provider, ctxwind, "langchain-retry", None)
        statuses = [r.status for r in provider.sent(CHAT)]
        assert [] == [r.problems for r in provider.sent(CHAT) if r.problems]
    _retried_once_each_time(statuses)
    assert statuses.count(400) == sum(turn.retried for turn in turns)


# Pydantic AI


def _pydantic_run(
    provider: FakeProvider, ctxwind: DaemonProcess, task: str, window: int | None
) -> tuple[Any, list[Turn]]:
    turns: list[Turn] = []
    client = openai.AsyncOpenAI(base_url=provider.openai_url, api_key="k", max_retries=0)
    model = OpenAIChatModel("gpt-4o", provider=OpenAIProvider(openai_client=client))
    capability = ContextWindow(
        task=task, context_window=window, endpoint=ctxwind.endpoint, on_turn=turns.append
    )
    agent = Agent(model, system_prompt="You fix bugs.", capabilities=[capability])

    @agent.tool_plain(name="read_file")
    def read_project_file(path: str) -> str:
        """Read a file of the project."""
        return read_file(path)

    async def run() -> Any:
        async with client:  # closed on the loop that used it
            return await agent.run(TASK, usage_limits=UsageLimits(request_limit=200))

    return asyncio.run(run()), turns


def test_a_60_turn_pydantic_ai_agent_sends_shrinking_views_and_keeps_its_history(
    ctxwind: DaemonProcess,
) -> None:
    """The provider gets valid, cut views with notices; all_messages() keeps the full history."""
    with FakeProvider(limit=8_000, tool_turns=60, paths=PATHS) as provider:
        result, turns = _pydantic_run(provider, ctxwind, "pydantic-ai-60", 8_000)
        sent = assert_valid_and_shrinking(provider, CHAT, 61)
    assert 1 + 60 * 2 + 1 == len(result.all_messages())
    assert len(sent[-1].history) < 2 + 60 * 2
    assert 61 == len(turns)


def test_the_pydantic_ai_capability_compacts_and_retries_after_the_error(
    ctxwind: DaemonProcess,
) -> None:
    """Each context_length_exceeded gets one smaller retry (RetryModelRequest)."""
    with FakeProvider(limit=2_000, tool_turns=12) as provider:
        result, turns = _pydantic_run(provider, ctxwind, "pydantic-ai-retry", None)
        statuses = [r.status for r in provider.sent(CHAT)]
        assert [] == [r.problems for r in provider.sent(CHAT) if r.problems]
    _retried_once_each_time(statuses)
    assert statuses.count(400) == sum(turn.retried for turn in turns)
    assert "Done: both files read." == result.output


# OpenAI Agents SDK


@function_tool(name_override="read_file")
def agents_read_file(path: str) -> str:
    """Read a file of the project."""
    return read_file(path)


def test_a_60_turn_agents_run_gets_views_of_its_own_item_objects(ctxwind: DaemonProcess) -> None:
    """The filter's views are valid and cut, with notices; kept items are the SDK's objects."""
    set_tracing_disabled(True)
    turns: list[Turn] = []
    rebuilt_equal: list[Any] = []
    ctxwin_filter = ContextWindowFilter(
        task="agents-60", context_window=8_000, endpoint=ctxwind.endpoint, on_turn=turns.append
    )

    async def watched(data: CallModelData[Any]) -> ModelInputData:
        given = list(data.model_data.input)
        result = await ctxwin_filter(data)
        for item in result.input:
            if not any(item is original for original in given):
                rebuilt_equal.extend(original for original in given if original == item)
        return result

    with FakeProvider(limit=8_000, tool_turns=60, paths=PATHS) as provider:
        client = openai.AsyncOpenAI(base_url=provider.openai_url, api_key="k", max_retries=0)
        agent = AgentsAgent(
            name="fixer",
            instructions="You fix bugs.",
            model=OpenAIResponsesModel("gpt-4o", client),
            tools=[agents_read_file],
        )

        async def run() -> Any:
            async with client:  # closed on the loop that used it
                return await Runner.run(
                    agent,
                    TASK,
                    run_config=RunConfig(call_model_input_filter=watched),
                    hooks=ctxwin_filter.hooks,
                    max_turns=100,
                )

        result = asyncio.run(run())
        sent = assert_valid_and_shrinking(provider, RESPONSES, 61)
    assert "Done: both files read." == result.final_output
    assert [] == rebuilt_equal  # an unchanged item is never sent as a copy
    assert all("You fix bugs." == r.body["instructions"] for r in sent)
    assert 61 == len(turns)
    assert all(turn.usage is not None for turn in turns)
