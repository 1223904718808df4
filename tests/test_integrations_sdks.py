"""wrap() for the real OpenAI and Anthropic SDKs, against the fake provider and a real daemon."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from ctxwin.client import Client
from ctxwin.client.integrations import Turn, window_of
from ctxwin.client.integrations import anthropic as ctxwin_anthropic
from ctxwin.client.integrations import openai as ctxwin_openai
from tests._conversation import (
    ANTHROPIC_TOOLS,
    CHAT_TOOLS,
    PATHS,
    answered,
    anthropic_agent,
    anthropic_turn_async,
    assert_valid_and_shrinking,
    chat_results,
    chat_turn,
    read_file,
)
from tests._daemon import DaemonProcess
from tests._fake_provider import CHAT, MESSAGES, RESPONSES, FakeProvider

RESPONSES_TOOLS: Any = [
    {
        "type": "function",
        "name": "read_file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]


def _openai(provider: FakeProvider) -> openai.OpenAI:
    return openai.OpenAI(base_url=provider.openai_url, api_key="k", max_retries=0)


def _anthropic(provider: FakeProvider) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=provider.url, api_key="k", max_retries=0)


def test_a_60_turn_chat_conversation_sends_shrinking_valid_views_with_notices(
    ctxwind: DaemonProcess,
) -> None:
    """60 tool turns (every other one streamed) through wrap(OpenAI()): valid, cut, notices."""
    turns: list[Turn] = []
    with FakeProvider(limit=8_000, tool_turns=60, paths=PATHS) as provider:
        client = ctxwin_openai.wrap(
            _openai(provider),
            task="chat-60",
            context_window=8_000,
            endpoint=ctxwind.endpoint,
            on_turn=turns.append,
        )
        history: list[Any] = [
            {"role": "system", "content": "You fix bugs."},
            {"role": "user", "content": "main() is wrong; fix it."},
        ]
        for turn in range(60):
            if turn % 2:
                stream = client.chat.completions.create(
                    model="gpt-4o", messages=history, tools=CHAT_TOOLS, stream=True
                )
                chunks = list(stream)
                assert all(chunk.choices for chunk in chunks)  # the usage chunk stays ctxwin's
                calls: Any = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": getattr(call.function, "name", None),
                            "arguments": getattr(call.function, "arguments", None),
                        },
                    }
                    for chunk in chunks
                    for call in chunk.choices[0].delta.tool_calls or []
                ]
                history.append({"role": "assistant", "content": None, "tool_calls": calls})
                history += chat_results(calls)
            else:
                chat_turn(client, history)
        client.close()
        assert_valid_and_shrinking(provider, CHAT, 60)
    assert 60 == len(turns)
    assert all(turn.usage is not None for turn in turns)  # streams report usage too
    assert any(turn.range_updated for turn in turns)
    assert not any(turn.retried for turn in turns)
    assert turns[-1] == window_of(client).last()


def test_a_context_length_error_compacts_and_retries_once(ctxwind: DaemonProcess) -> None:
    """The provider's real 400 body makes the adapter compact and send once more, smaller."""
    turns: list[Turn] = []
    with FakeProvider(limit=3_000, tool_turns=60) as provider:
        client = ctxwin_openai.wrap(
            _openai(provider), task="chat-retry", endpoint=ctxwind.endpoint, on_turn=turns.append
        )
        history: list[Any] = [{"role": "user", "content": "main() is wrong; fix it."}]
        while not (turns and turns[-1].retried):
            chat_turn(client, history)
        client.close()
        sent = provider.sent(CHAT)
    assert [200] * (len(sent) - 2) + [400, 200] == [r.status for r in sent]
    assert len(sent[-1].history) < len(sent[-2].history)
    assert [] == [r.problems for r in sent if r.problems]
    assert turns[-1].range_updated
    assert turns[-1].deleted_range is not None


def test_a_second_refusal_reaches_the_caller_after_one_retry(ctxwind: DaemonProcess) -> None:
    """When the compacted request is still too long, the error is raised: two requests in all."""
    with FakeProvider(limit=5) as provider:
        client = ctxwin_openai.wrap(_openai(provider), task="chat-twice", endpoint=ctxwind.endpoint)
        history: Any = [{"role": "user", "content": "main() is wrong; fix it."}]
        with pytest.raises(openai.BadRequestError) as raised:
            client.chat.completions.create(model="gpt-4o", messages=history)
        client.close()
        assert "context_length_exceeded" == raised.value.code
        assert [400, 400] == [r.status for r in provider.sent(CHAT)]


def test_one_task_id_serves_chat_and_responses_calls_and_copies_keep_it(
    ctxwind: DaemonProcess,
) -> None:
    """A given task id: chat calls use it, Responses calls `<task>-responses`, copies too."""
    turns: list[Turn] = []
    with FakeProvider() as provider:
        client = ctxwin_openai.wrap(
            _openai(provider), task="both-apis", endpoint=ctxwind.endpoint, on_turn=turns.append
        )
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        client.with_options(timeout=30).responses.create(
            model="gpt-4o", input=[{"role": "user", "content": "hi"}]
        )
        client.close()
    assert ["both-apis", "both-apis-responses"] == [turn.task for turn in turns]


@pytest.mark.anyio
async def test_responses_through_the_async_client_stream_and_shrink(ctxwind: DaemonProcess) -> None:
    """AsyncOpenAI responses.create, streamed and not: valid views, cut, with notices."""
    turns: list[Turn] = []
    with FakeProvider(limit=8_000, tool_turns=60, paths=PATHS) as provider:
        client = ctxwin_openai.wrap(
            openai.AsyncOpenAI(base_url=provider.openai_url, api_key="k", max_retries=0),
            task="responses-60",
            context_window=8_000,
            endpoint=ctxwind.endpoint,
            on_turn=turns.append,
        )
        items: list[Any] = [{"role": "user", "content": "main() is wrong; fix it."}]
        for turn in range(60):
            if turn % 2:
                stream = await client.responses.create(
                    model="gpt-4o", input=items, tools=RESPONSES_TOOLS, stream=True
                )
                output = [
                    event.item
                    async for event in stream
                    if event.type == "response.output_item.done"
                ]
            else:
                response = await client.responses.create(
                    model="gpt-4o", input=items, tools=RESPONSES_TOOLS
                )
                output = list(response.output)
            items += output  # the SDK's output items, as they are
            items += [
                {
                    "type": "function_call_output",
                    "call_id": item.call_id,
                    "output": read_file(json.loads(item.arguments)["path"]),
                }
                for item in output
                if item.type == "function_call"
            ]
        await client.close()
        assert_valid_and_shrinking(provider, RESPONSES, 60)
    assert all(turn.usage is not None for turn in turns)


@pytest.mark.anyio
async def test_responses_with_a_server_held_history_pass_through(ctxwind: DaemonProcess) -> None:
    """``previous_response_id`` leaves the history to the server: the input goes as given."""
    turns: list[Turn] = []
    with FakeProvider() as provider:
        client = ctxwin_openai.wrap(
            openai.AsyncOpenAI(base_url=provider.openai_url, api_key="k", max_retries=0),
            endpoint=ctxwind.endpoint,
            on_turn=turns.append,
        )
        given: Any = [{"role": "user", "content": "and now?"}]
        await client.responses.create(model="gpt-4o", input=given, previous_response_id="resp_1")
        await client.close()
        assert [given] == [r.body["input"] for r in provider.sent(RESPONSES)]
    assert [] == turns


def test_a_60_turn_anthropic_conversation_with_create_and_stream(ctxwind: DaemonProcess) -> None:
    """messages.create and messages.stream in turn: system kept, views valid and cut, notices."""
    turns: list[Turn] = []
    with FakeProvider(limit=8_000, tool_turns=60, paths=PATHS) as provider:
        client = ctxwin_anthropic.wrap(
            _anthropic(provider),
            context_window=8_000,
            endpoint=ctxwind.endpoint,
            on_turn=turns.append,
        )
        anthropic_agent(client, 60)
        client.close()
        sent = assert_valid_and_shrinking(provider, MESSAGES, 60)
    assert all("You fix bugs." == r.body["system"] for r in sent)
    assert all(turn.usage is not None and turn.usage["tokens_in"] > 0 for turn in turns)
    assert turns[0].task.startswith("anthropic-")  # derived from the system and first message
    assert 1 == len({turn.task for turn in turns})


@pytest.mark.anyio
async def test_async_anthropic_retries_once_after_prompt_is_too_long(
    ctxwind: DaemonProcess,
) -> None:
    """AsyncAnthropic create and stream: the 'prompt is too long' error compacts and retries."""
    turns: list[Turn] = []
    with FakeProvider(limit=3_000, tool_turns=60) as provider:
        client = ctxwin_anthropic.wrap(
            anthropic.AsyncAnthropic(base_url=provider.url, api_key="k", max_retries=0),
            task="anthropic-retry",
            endpoint=ctxwind.endpoint,
            on_turn=turns.append,
        )
        history: list[Any] = [{"role": "user", "content": "main() is wrong; fix it."}]
        options: Any = {"model": "claude-sonnet-4-5", "max_tokens": 100, "tools": ANTHROPIC_TOOLS}
        while not (turns and turns[-1].retried):
            await anthropic_turn_async(client, history, options, stream=len(turns) % 2 == 1)
        await client.close()
        sent = answered(provider, MESSAGES)
        statuses = [r.status for r in provider.sent(MESSAGES)]
    assert [400, 200] == statuses[-2:]
    assert 1 == statuses.count(400)
    assert len(sent[-1].history) < len(sent[-2].history)
    assert [] == [r.problems for r in provider.sent(MESSAGES) if r.problems]


@pytest.mark.anyio
async def test_a_stream_manager_begins_its_request_only_when_entered(
    ctxwind: DaemonProcess,
) -> None:
    """messages.stream() of either client opens no conversation until its block is entered."""
    with FakeProvider() as provider:
        blocking = ctxwin_anthropic.wrap(_anthropic(provider), endpoint=ctxwind.endpoint)
        asyncio_client = ctxwin_anthropic.wrap(
            anthropic.AsyncAnthropic(base_url=provider.url, api_key="k", max_retries=0),
            endpoint=ctxwind.endpoint,
        )
        options: Any = {"model": "claude-sonnet-4-5", "max_tokens": 100}
        history: Any = [{"role": "user", "content": "main() is wrong; fix it."}]
        blocking.messages.stream(messages=history, **options)
        asyncio_client.messages.stream(messages=history, **options)
        opened = [len(window_of(c).state.entries) for c in (blocking, asyncio_client)]
        blocking.close()
        await asyncio_client.close()
        assert [] == provider.sent(MESSAGES)
    assert [0, 0] == opened


def test_adapters_use_auto_with_the_wrapped_providers_sheet(ctxwind: DaemonProcess) -> None:
    """By default a wrapped client asks for ``auto`` priced by its provider's sheet.

    The model id names the sheet where it can (``gpt-4o``: OpenAI's GPT-4o family);
    an Anthropic client's model is a ``claude`` one. Each turn reports the
    view's cache figures, and the tasks keep the sheet.
    """
    turns: list[Turn] = []
    with FakeProvider(limit=50_000, tool_turns=6, paths=PATHS) as provider:
        chat = ctxwin_openai.wrap(
            _openai(provider), task="auto-chat", endpoint=ctxwind.endpoint, on_turn=turns.append
        )
        history: list[Any] = [{"role": "user", "content": "main() is wrong; fix it."}]
        for _ in range(3):
            chat_turn(chat, history)
        chat.close()
        messages = ctxwin_anthropic.wrap(
            _anthropic(provider), task="auto-messages", endpoint=ctxwind.endpoint
        )
        messages.messages.create(
            model="claude-sonnet-4-5",
            max_tokens=100,
            messages=[{"role": "user", "content": "hello"}],
        )
        messages.close()
    assert all(turn.cache is not None for turn in turns)
    assert turns[1].cache is not None
    assert turns[1].cache["cached_tokens"] > 0  # the first view, sent again unchanged
    with Client(ctxwind.endpoint) as client:
        assert client.task("auto-chat").inspect()["pricing"]["name"] == "openai-gpt-4o"
        assert client.task("auto-messages").inspect()["pricing"]["name"] == "anthropic"
