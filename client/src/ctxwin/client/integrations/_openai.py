"""``wrap`` for the OpenAI SDK: Chat Completions and Responses through ctxwin."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import openai

from ctxwin.proto import Usage

from .._usage import usage_from_openai
from ._plain import Plain
from ._streams import AsyncWatchedStream, WatchedStream
from ._window import AsyncWindow, Request, Turn, Window

__all__ = ["usage_from_responses", "wrap"]

C = TypeVar("C", openai.OpenAI, openai.AsyncOpenAI)

CHAT_DIALECT = "openai-chat"
RESPONSES_DIALECT = "openai-responses"


def usage_from_responses(usage: Any, *, ts: int | None = None) -> Usage:
    """Usage from a Responses API report (``input_tokens`` includes the cached part).

    Args:
        usage: the response's ``usage`` (object or map) or None.
        ts: when the request was made (ms since the epoch), if known.

    Returns:
        The wire ``usage`` map.
    """

    def get(source: Any, name: str) -> Any:
        if isinstance(source, Mapping):
            return source.get(name)
        return getattr(source, name, None)

    def count(value: Any) -> int:
        return max(0, value) if isinstance(value, int) and not isinstance(value, bool) else 0

    prompt = count(get(usage, "input_tokens"))
    cached = min(prompt, count(get(get(usage, "input_tokens_details"), "cached_tokens")))
    result = Usage(
        tokens_in=prompt - cached,
        tokens_out=count(get(usage, "output_tokens")),
        cache_writes=0,
        cache_reads=cached,
    )
    if ts is not None:
        result["ts"] = ts
    return result


def _chat_head(messages: Sequence[Any]) -> list[Any]:
    """System/developer messages and the first user message: what names a conversation."""
    head: list[Any] = []
    for message in messages:
        head.append(message)
        if isinstance(message, Mapping) and message.get("role") == "user":
            break
    return head


def _responses_head(instructions: Any, items: Sequence[Any]) -> list[Any]:
    head: list[Any] = [instructions if isinstance(instructions, str) else None]
    for item in items:
        head.append(item)
        if isinstance(item, Mapping) and item.get("role") == "user":
            break
    return head


def _chat_usage(state: dict[str, Any], hide_usage: bool) -> Callable[[Any], bool]:
    def see(chunk: Any) -> bool:
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            state["usage"] = usage
            if hide_usage and not getattr(chunk, "choices", None):
                return False  # the usage chunk ctxwin asked for; the caller did not
        return True

    return see


def _responses_usage(state: dict[str, Any]) -> Callable[[Any], bool]:
    def see(event: Any) -> bool:
        response = getattr(event, "response", None)
        usage = getattr(response, "usage", None)
        if usage is not None:
            state["usage"] = usage
        return True

    return see


def _stream_options(kwargs: dict[str, Any]) -> bool:
    """Ask a chat stream for its usage; True when the caller had not (its chunk is hidden)."""
    options = kwargs.get("stream_options")
    if isinstance(options, Mapping) and options.get("include_usage"):
        return False
    kwargs["stream_options"] = {**(options or {}), "include_usage": True}
    return True


def _managed_responses(kwargs: Mapping[str, Any]) -> bool:
    """Whether ctxwin can manage this Responses call (a list input, no server-held history)."""
    return (
        isinstance(kwargs.get("input"), list)
        and kwargs.get("previous_response_id") is None
        and kwargs.get("conversation") is None
    )


def _finish_chat(window: Window | AsyncWindow, request: Request, usage: Any) -> Turn:
    return window.finish(request, usage_from_openai(usage) if usage is not None else None)


def _finish_responses(window: Window | AsyncWindow, request: Request, usage: Any) -> Turn:
    return window.finish(request, usage_from_responses(usage) if usage is not None else None)


def _wrap_sync(client: openai.OpenAI, window: Window) -> openai.OpenAI:
    chat_plain, responses_plain = Plain(), Plain()
    chat_window = window
    responses_window = Window(
        task=window.state.task,
        prefix=RESPONSES_DIALECT,
        dialect=RESPONSES_DIALECT,
        context_window=window.state.context_window,
        client=window.client,
        on_turn=window.state.on_turn,
    )
    chat_create = client.chat.completions.create
    responses_create = client.responses.create

    def create_chat(*args: Any, **kwargs: Any) -> Any:
        messages = chat_plain(list(kwargs.get("messages", [])))
        model = str(kwargs.get("model", ""))
        request = chat_window.begin(messages, model, _chat_head(messages))
        streaming = bool(kwargs.get("stream"))
        hide = _stream_options(kwargs) if streaming else False
        result = chat_window.send(
            request, lambda view: chat_create(*args, **{**kwargs, "messages": view})
        )
        if not streaming:
            _finish_chat(chat_window, request, getattr(result, "usage", None))
            return result
        state: dict[str, Any] = {}
        return WatchedStream(
            result,
            _chat_usage(state, hide),
            lambda: _finish_chat(chat_window, request, state.get("usage")),
        )

    def create_response(*args: Any, **kwargs: Any) -> Any:
        if not _managed_responses(kwargs):
            return responses_create(*args, **kwargs)
        items = responses_plain(list(kwargs["input"]))
        model = str(kwargs.get("model", ""))
        head = _responses_head(kwargs.get("instructions"), items)
        request = responses_window.begin(items, model, head)
        result = responses_window.send(
            request, lambda view: responses_create(*args, **{**kwargs, "input": view})
        )
        if not kwargs.get("stream"):
            _finish_responses(responses_window, request, getattr(result, "usage", None))
            return result
        state: dict[str, Any] = {}
        return WatchedStream(
            result,
            _responses_usage(state),
            lambda: _finish_responses(responses_window, request, state.get("usage")),
        )

    setattr(client.chat.completions, "create", create_chat)  # noqa: B010 - instance override
    setattr(client.responses, "create", create_response)  # noqa: B010 - instance override
    copy = client.copy

    def copy_wrapped(*args: Any, **kwargs: Any) -> openai.OpenAI:
        return _wrap_sync(copy(*args, **kwargs), window)

    setattr(client, "copy", copy_wrapped)  # noqa: B010 - with_options keeps the wrapping
    setattr(client, "with_options", copy_wrapped)  # noqa: B010
    setattr(client, "_ctxwin_window", window)  # noqa: B010
    return client


def _wrap_async(client: openai.AsyncOpenAI, window: AsyncWindow) -> openai.AsyncOpenAI:
    chat_plain, responses_plain = Plain(), Plain()
    chat_window = window
    responses_window = AsyncWindow(
        task=window.state.task,
        prefix=RESPONSES_DIALECT,
        dialect=RESPONSES_DIALECT,
        context_window=window.state.context_window,
        client=window.client,
        on_turn=window.state.on_turn,
    )
    chat_create = client.chat.completions.create
    responses_create = client.responses.create

    async def create_chat(*args: Any, **kwargs: Any) -> Any:
        messages = chat_plain(list(kwargs.get("messages", [])))
        model = str(kwargs.get("model", ""))
        request = await chat_window.begin(messages, model, _chat_head(messages))
        streaming = bool(kwargs.get("stream"))
        hide = _stream_options(kwargs) if streaming else False

        async def call(view: list[Any]) -> Any:
            return await chat_create(*args, **{**kwargs, "messages": view})

        result = await chat_window.send(request, call)
        if not streaming:
            _finish_chat(chat_window, request, getattr(result, "usage", None))
            return result
        state: dict[str, Any] = {}
        return AsyncWatchedStream(
            result,
            _chat_usage(state, hide),
            lambda: _finish_chat(chat_window, request, state.get("usage")),
        )

    async def create_response(*args: Any, **kwargs: Any) -> Any:
        if not _managed_responses(kwargs):
            return await responses_create(*args, **kwargs)
        items = responses_plain(list(kwargs["input"]))
        model = str(kwargs.get("model", ""))
        head = _responses_head(kwargs.get("instructions"), items)
        request = await responses_window.begin(items, model, head)

        async def call(view: list[Any]) -> Any:
            return await responses_create(*args, **{**kwargs, "input": view})

        result = await responses_window.send(request, call)
        if not kwargs.get("stream"):
            _finish_responses(responses_window, request, getattr(result, "usage", None))
            return result
        state: dict[str, Any] = {}
        return AsyncWatchedStream(
            result,
            _responses_usage(state),
            lambda: _finish_responses(responses_window, request, state.get("usage")),
        )

    setattr(client.chat.completions, "create", create_chat)  # noqa: B010 - instance override
    setattr(client.responses, "create", create_response)  # noqa: B010 - instance override
    copy = client.copy

    def copy_wrapped(*args: Any, **kwargs: Any) -> openai.AsyncOpenAI:
        return _wrap_async(copy(*args, **kwargs), window)

    setattr(client, "copy", copy_wrapped)  # noqa: B010 - with_options keeps the wrapping
    setattr(client, "with_options", copy_wrapped)  # noqa: B010
    setattr(client, "_ctxwin_window", window)  # noqa: B010
    return client


def wrap(
    client: C,
    *,
    task: str | None = None,
    context_window: int | None = None,
    endpoint: str | None = None,
    on_turn: Callable[[Turn], None] | None = None,
) -> C:
    """An OpenAI client whose requests send ctxwin's view instead of the full history.

    ``chat.completions.create`` (dialect ``openai-chat``) and
    ``responses.create`` (dialect ``openai-responses``, for a list ``input``
    without ``previous_response_id`` or ``conversation``: a server-held
    history is the server's to manage) of the returned client, streaming
    included: each call sends the history it is given to ctxwin with the
    previous request's usage and sends the view it gets back; the response's
    usage is kept for the next turn (a chat stream is asked for its usage,
    and the extra chunk is kept from the caller unless it asked too); when
    the provider answers that the prompt is too long, ctxwin compacts the
    task and the request is sent once more. Keep appending to your own full
    history as before; response message objects may be appended as they are.
    Other methods are the client's own; ``with_options`` keeps the wrapping.

    Args:
        client: an ``openai.OpenAI`` or ``openai.AsyncOpenAI`` client (Azure too).
            It is copied (``with_options()``); the original stays as it was.
        task: the ctxwin task id for every conversation of this client; None
            derives one per conversation from its system messages and first
            user message (``openai-chat-<digest>``, ``openai-responses-<digest>``),
            stable across restarts.
        context_window: the model's window in tokens; None takes the model's
            known window (from each call's ``model=``), else the daemon's default.
        endpoint: the ctxwin daemon's endpoint (default: as ``Client`` finds it).
        on_turn: called with a :class:`~ctxwin.client.integrations.Turn` after
            each request (range, tokens, fits, stalled, retried, usage).

    Returns:
        The wrapped copy, of the same type as ``client``.
    """
    copy = client.with_options()
    if isinstance(copy, openai.AsyncOpenAI):
        async_window = AsyncWindow(
            task=task,
            prefix=CHAT_DIALECT,
            dialect=CHAT_DIALECT,
            context_window=context_window,
            endpoint=endpoint,
            on_turn=on_turn,
        )
        weakref.finalize(copy, async_window.close)
        return _wrap_async(copy, async_window)
    window = Window(
        task=task,
        prefix=CHAT_DIALECT,
        dialect=CHAT_DIALECT,
        context_window=context_window,
        endpoint=endpoint,
        on_turn=on_turn,
    )
    weakref.finalize(copy, window.close)
    return _wrap_sync(copy, window)
