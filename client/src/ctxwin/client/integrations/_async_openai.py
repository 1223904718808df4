"""The asyncio OpenAI adapter (the blocking one, ``_sync_openai.py``, is generated from it)."""

from __future__ import annotations

from typing import Any, cast

import openai

from ctxwin.proto import Usage

from ._async_window import AsyncWindow
from ._openai import (
    Calls,
    cache_keyed,
    chat_summary,
    managed_responses,
    responses_summary,
    summary_kwargs,
)
from ._window import keep_wrapped

__all__ = ["wrap_async"]


def wrap_async(client: openai.AsyncOpenAI, window: AsyncWindow) -> openai.AsyncOpenAI:
    """Replace ``client``'s ``chat.completions.create`` and ``responses.create`` by ones
    through ``window`` (Responses calls through a window of their own).

    Args:
        client: the copy ``openai.wrap`` made of the caller's client.
        window: the window its chat calls go through.

    Returns:
        ``client``, its copies (``with_options``) wrapped around the same window.
    """
    calls = Calls(window)
    keyed = cache_keyed(client)
    chat_window, responses_window = window, cast(AsyncWindow, calls.responses_window)
    chat_create = client.chat.completions.create
    responses_create = client.responses.create

    async def create_chat(*args: Any, **kwargs: Any) -> Any:
        messages, model, head, streaming, hide = calls.chat(kwargs)

        async def summarize(view: list[Any], model: str) -> tuple[str | None, Usage | None]:
            extra = summary_kwargs(kwargs, responses=False)
            return chat_summary(await chat_create(*args, **extra, messages=view, model=model))

        request = await chat_window.begin(messages, model, head, summarize)

        async def call(view: list[Any]) -> Any:
            return await chat_create(*args, **keyed(kwargs, request, messages=view))

        result = await chat_window.send(request, call)
        return calls.chat_answer(request, result, streaming, hide)

    async def create_response(*args: Any, **kwargs: Any) -> Any:
        if not managed_responses(kwargs):
            return await responses_create(*args, **kwargs)

        async def summarize(view: list[Any], model: str) -> tuple[str | None, Usage | None]:
            extra = summary_kwargs(kwargs, responses=True)
            answer = await responses_create(*args, **extra, input=view, model=model)
            return responses_summary(answer)

        request = await responses_window.begin(*calls.responses(kwargs), summarize)

        async def call(view: list[Any]) -> Any:
            return await responses_create(*args, **keyed(kwargs, request, input=view))

        result = await responses_window.send(request, call)
        return calls.responses_answer(request, result, bool(kwargs.get("stream")))

    setattr(client.chat.completions, "create", create_chat)  # noqa: B010 - instance override
    setattr(client.responses, "create", create_response)  # noqa: B010 - instance override
    return keep_wrapped(client, window, wrap_async)
