"""Summaries through the SDK adapters: the real SDKs, the fake provider and a real daemon."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import openai
import pytest
from agents import Agent as AgentsAgent
from agents import OpenAIProvider as AgentsOpenAIProvider
from agents import OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits

from ctxwin import engine
from ctxwin.client import Client
from ctxwin.client.integrations import Turn
from ctxwin.client.integrations import anthropic as ctxwin_anthropic
from ctxwin.client.integrations import openai as ctxwin_openai
from ctxwin.client.integrations.agents import ContextWindowFilter
from ctxwin.client.integrations.langchain import ContextWindowMiddleware
from ctxwin.client.integrations.pydantic_ai import ContextWindow
from tests._conversation import CHAT_TOOLS, anthropic_turn, chat_turn, read_file
from tests._daemon import DaemonProcess
from tests._fake_provider import CHAT, MESSAGES, RESPONSES, SUMMARY_ASK, FakeProvider, Recorded

PATHS = tuple(f"src/mod{turn}.py" for turn in range(80))
"""A new file every turn: the duplicate-read step saves nothing, so summaries fall due."""
WINDOW = 8_000
TOOL: Any = {"type": "object", "properties": {"path": {"type": "string"}}}


def _window(
    ctxwind: DaemonProcess, task: str, turns: list[Turn], summaries: str = "model"
) -> dict[str, Any]:
    """The options every adapter here is given: an ephemeral ``task`` of a ``WINDOW``-token
    window on ``ctxwind`` whose turns are appended to ``turns``, with ``summaries``."""
    return {
        "task": task,
        "context_window": WINDOW,
        "endpoint": ctxwind.endpoint,
        "on_turn": turns.append,
        "ephemeral": True,
        "summaries": summaries,
    }


def asks_summary(record: Recorded) -> bool:
    return SUMMARY_ASK in json.dumps(record.history[-1:])


def check_summaries(sent: list[Recorded], turns: list[Turn], text: str) -> None:
    """Every request was valid and fit; each summary request starts with the messages of the
    request before it; the answer (``text``) is in the next request once, marked."""
    assert [] == [r.problems for r in sent if r.problems]
    assert [200] * len(sent) == [r.status for r in sent]
    asked = [index for index, record in enumerate(sent) if asks_summary(record)]
    assert asked, "no summary was due"
    for index in asked:
        before, request, after = sent[index - 1], sent[index], sent[index + 1]
        assert before.history == request.history[: len(before.history)]
        assert len(request.history) > len(before.history)
        body = json.dumps(after.body)
        assert (1, 1) == (body.count(text), body.count(engine.SUMMARY_MARK))
        assert after.tokens < request.tokens
    summarised = [turn for turn in turns if turn.summary is not None]
    assert len(asked) == len(summarised)
    for turn in summarised:
        assert turn.summary is not None
        assert ("model", None) == (turn.summary["kind"], turn.summary["fallback"])
        assert turn.summary_usage is not None
        assert turn.summary_usage["tokens_in"] > 0
        assert turn.range_updated


def test_openai_chat_asks_the_model_for_a_summary_and_sends_it_next(
    ctxwind: DaemonProcess,
) -> None:
    """A long tool-using chat crosses the trigger: the model is asked with the conversation
    as it last saw it, the answer is stored and sent, the turn counts the summary's usage."""
    turns: list[Turn] = []
    with FakeProvider(limit=WINDOW, tool_turns=60, paths=PATHS) as provider:
        client = ctxwin_openai.wrap(
            openai.OpenAI(base_url=provider.openai_url, api_key="k", max_retries=0),
            **_window(ctxwind, "summary-chat", turns),
        )
        history: list[Any] = [
            {"role": "system", "content": "You fix bugs."},
            {"role": "user", "content": "main() is wrong; fix it. Keep LIMIT=77."},
        ]
        for _ in range(40):
            chat_turn(client, history)
        client.close()
        sent = provider.sent(CHAT)
    check_summaries(sent, turns, "FAKE SUMMARY")
    summary_requests = [r for r in sent if asks_summary(r)]
    with Client(ctxwind.endpoint) as ctxwin_client:
        task = ctxwin_client.task("summary-chat", dialect="openai-chat", ephemeral=True)
        ledger: Any = task.inspect()["cache"]
    assert len(summary_requests) == ledger["summary_requests"]
    assert ledger["summary_cost"] > 0  # priced under the openai sheet
    assert all("none" == r.body["tool_choice"] for r in summary_requests)
    assert all(r.body["tools"] == CHAT_TOOLS for r in summary_requests)  # the cached prefix


def test_a_failing_anthropic_summary_falls_back_to_the_basic_one(ctxwind: DaemonProcess) -> None:
    """When the summary request fails, ctxwin's basic summary is stored instead and the agent's
    turn goes on: every turn answered, the view carries the basic summary."""
    turns: list[Turn] = []
    with FakeProvider(limit=WINDOW, tool_turns=60, paths=PATHS, summary_error=True) as provider:
        client = ctxwin_anthropic.wrap(
            anthropic.Anthropic(base_url=provider.url, api_key="k", max_retries=0),
            **_window(ctxwind, "summary-fails", turns),
        )
        history: list[Any] = [{"role": "user", "content": "main() is wrong; fix it. LIMIT=77."}]
        options: Any = {
            "model": "claude-sonnet-4-5",
            "max_tokens": 100,
            "system": "You fix bugs.",
            "tools": [{"name": "read_file", "input_schema": TOOL}],
        }
        for _ in range(30):
            anthropic_turn(client, history, options)
        client.close()
        sent = provider.sent(MESSAGES)
    refused = [r for r in sent if asks_summary(r)]
    assert refused
    assert all(400 == r.status for r in refused)
    main = [r for r in sent if not asks_summary(r)]
    assert [200] * 30 == [r.status for r in main]
    fallbacks = [turn.summary for turn in turns if turn.summary is not None]
    assert len(refused) == len(fallbacks)
    for summary in fallbacks:
        assert summary is not None
        assert ("basic", "the summary request failed: BadRequestError") == (
            summary["kind"],
            summary["fallback"],
        )
    after = json.dumps(main[-1].body)
    assert 1 == after.count(engine.SUMMARY_MARK)
    assert "LIMIT=77" in after  # the task, and the basic summary keeps every prompt verbatim


@pytest.mark.anyio
async def test_async_responses_asks_the_model_for_a_summary(ctxwind: DaemonProcess) -> None:
    """AsyncOpenAI responses.create: the same summary flow on the asyncio twin."""
    turns: list[Turn] = []
    with FakeProvider(limit=WINDOW, tool_turns=60, paths=PATHS) as provider:
        client = ctxwin_openai.wrap(
            openai.AsyncOpenAI(base_url=provider.openai_url, api_key="k", max_retries=0),
            **_window(ctxwind, "summary-responses", turns),
        )
        tools: Any = [{"type": "function", "name": "read_file", "parameters": TOOL}]
        items: list[Any] = [{"role": "user", "content": "main() is wrong; fix it."}]
        for _ in range(40):
            response = await client.responses.create(model="gpt-4o", input=items, tools=tools)
            for item in response.output:
                items.append(item.model_dump(exclude_none=True))
                if item.type == "function_call":
                    path = json.loads(item.arguments)["path"]
                    items.append(
                        {
                            "type": "function_call_output",
                            "call_id": item.call_id,
                            "output": read_file(path),
                        }
                    )
        await client.close()
        sent = provider.sent(RESPONSES)
    check_summaries(sent, turns, "FAKE SUMMARY")


@tool("read_file")
def lc_read_file(path: str) -> str:
    """Read a file of the project."""
    return read_file(path)


def test_the_langchain_middleware_asks_the_agents_model_for_a_summary(
    ctxwind: DaemonProcess,
) -> None:
    """A LangChain agent's long run: the middleware asks the agent's own model for summaries
    (the system prompt, the messages it last saw, the instruction) and the agent finishes."""
    turns: list[Turn] = []
    with FakeProvider(limit=WINDOW, tool_turns=40, paths=PATHS) as provider:
        model = ChatOpenAI(
            model="gpt-4o",
            base_url=provider.openai_url,
            api_key="k",  # type: ignore[arg-type]
            max_retries=0,
        )
        middleware = ContextWindowMiddleware(**_window(ctxwind, "summary-langchain", turns))
        agent = create_agent(
            model, tools=[lc_read_file], system_prompt="You fix bugs.", middleware=[middleware]
        )
        state = agent.invoke(
            {"messages": [{"role": "user", "content": "main() is wrong; fix it."}]},
            {"recursion_limit": 400},
        )
        sent = provider.sent(CHAT)
    assert 1 + 40 * 2 + 1 == len(state["messages"])  # the agent's state keeps every message
    check_summaries(sent, turns, "FAKE SUMMARY")
    assert all("system" == r.history[0]["role"] for r in sent if asks_summary(r))


def _run_pydantic_ai_agent(
    ctxwind: DaemonProcess, task: str, summaries: str
) -> tuple[Any, list[Recorded], list[Turn]]:
    """A 40-tool-turn Pydantic AI run with the capability; its result, the requests, the turns."""
    turns: list[Turn] = []
    with FakeProvider(limit=WINDOW, tool_turns=40, paths=PATHS) as provider:
        client = openai.AsyncOpenAI(base_url=provider.openai_url, api_key="k", max_retries=0)
        model = OpenAIChatModel("gpt-4o", provider=OpenAIProvider(openai_client=client))
        capability = ContextWindow(**_window(ctxwind, task, turns, summaries))
        agent = Agent(model, system_prompt="You fix bugs.", capabilities=[capability])

        @agent.tool_plain(name="read_file")
        def read_project_file(path: str) -> str:
            """Read a file of the project."""
            return read_file(path)

        async def run() -> Any:
            async with client:
                return await agent.run(
                    "main() is wrong; fix it. LIMIT=77.",
                    usage_limits=UsageLimits(request_limit=200),
                )

        result = asyncio.run(run())
        return result, provider.sent(CHAT), turns


def test_the_pydantic_ai_capability_keeps_a_basic_summary(ctxwind: DaemonProcess) -> None:
    """A Pydantic AI agent with summaries="basic": once a summary is due the views carry
    ctxwin's basic summary (once, with the task's words) and the run finishes."""
    result, sent, turns = _run_pydantic_ai_agent(ctxwind, "summary-pydantic", "basic")
    assert 1 + 40 * 2 + 1 == len(result.all_messages())
    assert [200] * len(sent) == [r.status for r in sent]
    assert not any(asks_summary(r) for r in sent)  # basic: no model request for it
    stored = [turn.summary for turn in turns if turn.summary is not None]
    assert stored
    assert all(summary is not None and "basic" == summary["kind"] for summary in stored)
    body = json.dumps(sent[-1].body)
    assert 1 == body.count(engine.SUMMARY_MARK)
    assert max(r.tokens for r in sent) <= WINDOW


def test_the_pydantic_ai_capability_asks_the_runs_model_for_a_summary(
    ctxwind: DaemonProcess,
) -> None:
    """A Pydantic AI agent with summaries="model": the capability asks the run's own model
    (the messages it last saw, the instruction, no tools), stores the answer, sends it next,
    and the turn counts the summary request's usage; the run finishes with every message."""
    result, sent, turns = _run_pydantic_ai_agent(ctxwind, "summary-pydantic-model", "model")
    assert 1 + 40 * 2 + 1 == len(result.all_messages())
    check_summaries(sent, turns, "FAKE SUMMARY")
    summary_requests = [r for r in sent if asks_summary(r)]
    assert all("tools" not in r.body for r in summary_requests)
    assert all("system" == r.history[0]["role"] for r in summary_requests)


@function_tool(name_override="read_file")
def agents_read_file(path: str) -> str:
    """Read a file of the project."""
    return read_file(path)


@pytest.mark.parametrize("by_name", [False, True])
def test_the_agents_filter_asks_the_agents_model_for_a_summary(
    ctxwind: DaemonProcess, by_name: bool
) -> None:
    """An Agents SDK run with summaries="model": the filter asks the agent's own model (its
    instructions, the items it last saw and the instruction message, no tools), stores the
    answer, the next request carries it, and the turn counts the summary request's usage. A
    model given by name is resolved with the provider given to run_config()."""
    set_tracing_disabled(True)
    turns: list[Turn] = []
    with FakeProvider(limit=WINDOW, tool_turns=40, paths=PATHS) as provider:
        client = openai.AsyncOpenAI(base_url=provider.openai_url, api_key="k", max_retries=0)
        ctxwin_filter = ContextWindowFilter(**_window(ctxwind, f"summary-agents-{by_name}", turns))
        agent = AgentsAgent(
            name="fixer",
            instructions="You fix bugs.",
            model="gpt-4o" if by_name else OpenAIResponsesModel("gpt-4o", client),
            tools=[agents_read_file],
        )
        options: Any = {}
        if by_name:
            options["model_provider"] = AgentsOpenAIProvider(
                openai_client=client, use_responses=True
            )

        async def run() -> Any:
            async with client:
                return await Runner.run(
                    agent,
                    "main() is wrong; fix it. LIMIT=77.",
                    run_config=ctxwin_filter.run_config(**options),
                    hooks=ctxwin_filter.hooks,
                    max_turns=100,
                )

        result = asyncio.run(run())
        sent = provider.sent(RESPONSES)
    assert result.final_output
    check_summaries(sent, turns, "FAKE SUMMARY")
    summary_requests = [r for r in sent if asks_summary(r)]
    assert all(not r.body.get("tools") for r in summary_requests)
    assert all("You fix bugs." == r.body["instructions"] for r in summary_requests)
