"""The asyncio Anthropic adapter; ``client/scripts/generate.py`` makes ``_sync_anthropic.py``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anthropic

from ctxwin.proto import Usage

from ._anthropic import (
    Hints,
    answer,
    conversation_head,
    finish,
    snapshot_usage,
    summary_answer,
    summary_kwargs,
)
from ._async_window import AsyncWindow
from ._conversations import Request
from ._plain import Plain
from ._window import keep_wrapped

__all__ = ["wrap_async"]


class _AsyncStreamManager:
    """``messages.stream(...)``: the request (and any retry) is made on entering, as the SDK's.

    Leaving the block finishes the request with the usage the stream has seen,
    then hands what left the block to the SDK's own manager, as it came.
    """

    def __init__(
        self,
        window: AsyncWindow,
        open_stream: Callable[[Request, list[Any]], Any],
        begin: Callable[[], Awaitable[Request]],
    ):
        self._window = window
        self._open = open_stream
        self._begin = begin
        self._request: Request | None = None
        self._manager: Any = None
        self._stream: Any = None

    async def __aenter__(self) -> Any:
        self._request = request = await self._begin()

        async def enter(view: list[Any]) -> Any:
            manager = self._open(request, view)
            stream = await manager.__aenter__()
            self._manager = manager
            return stream

        self._stream = await self._window.send(request, enter)
        return self._stream

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            if self._request is not None:
                finish(self._window, self._request, snapshot_usage(self._stream))
        finally:
            if self._manager is not None:
                await self._manager.__aexit__(*exc_info)


def wrap_async(client: anthropic.AsyncAnthropic, window: AsyncWindow) -> anthropic.AsyncAnthropic:
    """Replace ``client``'s ``messages.create`` and ``messages.stream`` by ones through ``window``.

    Args:
        client: the copy ``anthropic.wrap`` made of the caller's client.
        window: the window its requests go through.

    Returns:
        ``client``, its copies (``with_options``) wrapped around the same window.
    """
    plain = Plain()
    hints = Hints()
    create = client.messages.create
    stream = client.messages.stream

    async def begin(kwargs: Mapping[str, Any]) -> Request:
        messages = plain(list(kwargs.get("messages", [])))
        head = conversation_head(kwargs.get("system"), messages)

        async def summarize(view: list[Any], model: str) -> tuple[str | None, Usage | None]:
            message = await create(**summary_kwargs(kwargs), messages=view, model=model)
            return summary_answer(message)

        return await window.begin(messages, str(kwargs.get("model", "")), head, summarize)

    async def create_message(*args: Any, **kwargs: Any) -> Any:
        request = await begin(kwargs)

        async def call(view: list[Any]) -> Any:
            sent, taken = hints.request(request, kwargs, view)
            result = await create(*args, **sent)
            taken()
            return result

        result = await window.send(request, call)
        return answer(window, request, result, bool(kwargs.get("stream")))

    def stream_message(*args: Any, **kwargs: Any) -> _AsyncStreamManager:
        def open_stream(request: Request, view: list[Any]) -> Any:
            sent, taken = hints.request(request, kwargs, view)
            taken()  # the stream's request is made on entering; a refusal costs one hint
            return stream(*args, **sent)

        return _AsyncStreamManager(window, open_stream, lambda: begin(kwargs))

    setattr(client.messages, "create", create_message)  # noqa: B010 - instance override
    setattr(client.messages, "stream", stream_message)  # noqa: B010 - instance override
    return keep_wrapped(client, window, wrap_async)
