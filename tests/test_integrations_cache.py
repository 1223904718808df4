"""Prompt-cache hints the adapters send: Anthropic breakpoints, OpenAI's prompt_cache_key."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from ctxwin.client.integrations import Turn
from ctxwin.client.integrations import anthropic as ctxwin_anthropic
from ctxwin.client.integrations import openai as ctxwin_openai
from ctxwin.client.integrations._cache_hints import (
    Breakpoints,
    count_breakpoints,
    prompt_cache_key,
)
from tests._conversation import (
    ANTHROPIC_TOOLS,
    PATHS,
    answered,
    anthropic_agent,
    anthropic_turn_async,
    chat_turn,
    read_file,
)
from tests._daemon import DaemonProcess
from tests._fake_provider import CHAT, MESSAGES, RESPONSES, FakeProvider


def _marks(message: Any) -> list[int]:
    """The blocks of a sent message that carry a breakpoint."""
    content = message["content"]
    if not isinstance(content, list):
        return []
    return [i for i, block in enumerate(content) if block.get("cache_control")]


def _unmarked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(item) for item in value]
    return value


def _last(message: Any) -> int:
    return len(message["content"]) - 1


def test_anthropic_requests_carry_breakpoints_where_the_cost_model_caches(
    ctxwind: DaemonProcess,
) -> None:
    """Each request marks its last block, the end of the request before, and the first pair."""
    with FakeProvider(limit=200_000, tool_turns=8, paths=PATHS) as provider:
        client = ctxwin_anthropic.wrap(
            anthropic.Anthropic(base_url=provider.url, api_key="k", max_retries=0),
            task="cache-anthropic",
            endpoint=ctxwind.endpoint,
        )
        history = anthropic_agent(client, 8)
        client.close()
        sent = answered(provider, MESSAGES)
    assert len(sent) == 8
    before: list[Any] = []
    for record in sent:
        messages = record.body["messages"]
        assert count_breakpoints([record.body["system"], record.body["tools"], messages]) <= 4
        last = messages[-1]
        assert _last(last) in _marks(last)  # what the next request reads
        if len(messages) > 2:
            assert _last(messages[1]) in _marks(messages[1])  # the first pair
        if before:
            # The previous view is this one's prefix: its end is read exactly.
            assert _unmarked(messages[: len(before)]) == _unmarked(before)
            assert _last(messages[len(before) - 1]) in _marks(messages[len(before) - 1])
        before = messages
    assert "cache_control" not in json.dumps([h for h in history if isinstance(h["content"], str)])


def test_the_callers_own_breakpoints_count_toward_the_four(ctxwind: DaemonProcess) -> None:
    """A system prompt with its own breakpoint leaves three: the request holds four at most."""
    with FakeProvider(limit=200_000, tool_turns=4, paths=PATHS) as provider:
        client = ctxwin_anthropic.wrap(
            anthropic.Anthropic(base_url=provider.url, api_key="k", max_retries=0),
            task="cache-anthropic-own",
            endpoint=ctxwind.endpoint,
        )
        system: Any = [
            {"type": "text", "text": "You fix bugs.", "cache_control": {"type": "ephemeral"}}
        ]
        anthropic_agent(client, 4, system, stream=False)
        client.close()
        counts = [
            count_breakpoints([r.body["system"], r.body["messages"]])
            for r in answered(provider, MESSAGES)
        ]
    assert counts[-1] == 4
    assert max(counts) == 4


@pytest.mark.anyio
async def test_async_anthropic_create_and_stream_mark_the_last_block(
    ctxwind: DaemonProcess,
) -> None:
    """AsyncAnthropic's create and stream send the breakpoints too."""
    with FakeProvider(limit=200_000, tool_turns=4, paths=PATHS) as provider:
        client = ctxwin_anthropic.wrap(
            anthropic.AsyncAnthropic(base_url=provider.url, api_key="k", max_retries=0),
            task="cache-anthropic-async",
            endpoint=ctxwind.endpoint,
        )
        history: list[Any] = [{"role": "user", "content": "main() is wrong; fix it."}]
        options: Any = {"model": "claude-sonnet-4-5", "max_tokens": 100, "tools": ANTHROPIC_TOOLS}
        for turn in range(4):
            await anthropic_turn_async(client, history, options, stream=turn % 2 == 1)
        await client.close()
        sent = answered(provider, MESSAGES)
    assert len(sent) == 4
    assert all(_last(r.body["messages"][-1]) in _marks(r.body["messages"][-1]) for r in sent)


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def _assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def test_after_an_edit_the_longest_prefix_written_before_is_read_exactly() -> None:
    """A view edited inside marks the end of the latest earlier request it still begins with."""
    points = Breakpoints()
    view = [_user("task"), _assistant("ok"), _user("a"), _assistant("b"), _user("c")]
    marked, written = points.place(view)
    assert [i for i, m in enumerate(marked) if _marks(m)] == [1, 4]
    points.sent(written)
    grown = [*view, _assistant("d"), _user("e"), _assistant("f"), _user("g")]
    marked, written = points.place(grown)
    assert [i for i, m in enumerate(marked) if _marks(m)] == [1, 4, 8]
    points.sent(written)
    # Message 5 is edited: the request before's end (8) is gone, the one before it (4) stands.
    edited = [*grown[:5], _assistant("stub"), *grown[6:], _assistant("h"), _user("i")]
    marked, _ = points.place(edited)
    assert [i for i, m in enumerate(marked) if _marks(m)] == [1, 4, 10]
    assert view[4] == _user("c")  # the caller's messages are copied, never marked


def test_no_breakpoint_on_thinking_nor_past_the_callers_four() -> None:
    """A message of only thinking gets none; four of the caller's own leave no room."""
    thinking = {
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "h", "signature": "s"}],
    }
    marked, _ = Breakpoints().place([_user("task"), thinking, _user("go")])
    assert [_marks(m) for m in marked] == [[], [], [0]]
    own = {"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}
    full = [{"role": "user", "content": [own, own, own, own]}, _assistant("ok"), _user("go")]
    marked, written = Breakpoints().place(full)
    assert (marked, written) == (full, [])


def test_openai_requests_carry_one_prompt_cache_key_per_task(ctxwind: DaemonProcess) -> None:
    """Chat and Responses calls send their task's key; a key the caller gives is kept."""
    turns: list[Turn] = []
    with FakeProvider(limit=200_000, tool_turns=6, paths=PATHS) as provider:
        client = ctxwin_openai.wrap(
            openai.OpenAI(base_url=provider.openai_url, api_key="k", max_retries=0),
            task="cache-openai",
            endpoint=ctxwind.endpoint,
            on_turn=turns.append,
        )
        history: list[Any] = [{"role": "user", "content": "main() is wrong; fix it."}]
        for _ in range(2):
            chat_turn(client, history)
        client.responses.create(model="gpt-4o", input=[{"role": "user", "content": "hi"}])
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "x"}], prompt_cache_key="mine"
        )
        client.close()
        chat = [r.body.get("prompt_cache_key") for r in answered(provider, CHAT)]
        responses = [r.body.get("prompt_cache_key") for r in answered(provider, RESPONSES)]
    assert chat == [prompt_cache_key("cache-openai")] * 2 + ["mine"]
    assert responses == [prompt_cache_key("cache-openai-responses")]
    assert "cache-openai" not in chat[0]  # the task id itself is not sent
    assert {turn.task for turn in turns} == {"cache-openai", "cache-openai-responses"}


def test_the_langchain_middleware_sends_the_tasks_prompt_cache_key(
    ctxwind: DaemonProcess,
) -> None:
    """A ChatOpenAI agent's calls through the middleware carry the task's key."""
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from ctxwin.client.integrations.langchain import ContextWindowMiddleware

    @tool("read_file")
    def lc_read_file(path: str) -> str:
        """Read a file of the project."""
        return read_file(path)

    with FakeProvider(limit=200_000, tool_turns=3, paths=PATHS) as provider:
        model = ChatOpenAI(
            model="gpt-4o",
            base_url=provider.openai_url,
            api_key="k",  # type: ignore[arg-type]
            max_retries=0,
        )
        middleware = ContextWindowMiddleware(task="cache-langchain", endpoint=ctxwind.endpoint)
        agent = create_agent(model, tools=[lc_read_file], middleware=[middleware])
        agent.invoke({"messages": [{"role": "user", "content": "fix it"}]})
        keys = [r.body.get("prompt_cache_key") for r in answered(provider, CHAT)]
    assert keys == [prompt_cache_key("cache-langchain")] * 4


def test_the_pydantic_ai_capability_sends_the_tasks_prompt_cache_key(
    ctxwind: DaemonProcess,
) -> None:
    """An OpenAIChatModel agent's requests through the capability carry the task's key."""
    import asyncio

    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from ctxwin.client.integrations.pydantic_ai import ContextWindow

    with FakeProvider(limit=200_000, tool_turns=3, paths=PATHS) as provider:
        client = openai.AsyncOpenAI(base_url=provider.openai_url, api_key="k", max_retries=0)
        model = OpenAIChatModel("gpt-4o", provider=OpenAIProvider(openai_client=client))
        capability = ContextWindow(task="cache-pydantic", endpoint=ctxwind.endpoint)
        agent = Agent(model, capabilities=[capability])

        @agent.tool_plain(name="read_file")
        def read_project_file(path: str) -> str:
            """Read a file of the project."""
            return read_file(path)

        async def run() -> Any:
            async with client:
                return await agent.run("fix it")

        asyncio.run(run())
        keys = [r.body.get("prompt_cache_key") for r in answered(provider, CHAT)]
    assert keys == [prompt_cache_key("cache-pydantic")] * 4
