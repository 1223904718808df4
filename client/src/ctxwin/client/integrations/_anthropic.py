"""``wrap`` for the Anthropic SDK: Messages (create and stream) through ctxwin."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, Unpack

import anthropic

from ctxwin.proto import Usage

from .._usage import usage_from_anthropic
from ._cache_hints import Breakpoints
from ._conversations import Request, Turn
from ._plain import Plain
from ._window import AsyncWindow, Window, WindowOptions, answered, keep_wrapped
from ._window_args import WindowArgs, takes_window_args

__all__ = ["wrap"]

C = TypeVar("C", anthropic.Anthropic, anthropic.AsyncAnthropic)

DIALECT = "anthropic"
USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)


def _head(system: Any, messages: Sequence[Any]) -> list[Any]:
    """The system prompt and the first message: what names a conversation."""
    return [system if isinstance(system, str | list) else None, *messages[:1]]


def _merge_usage(total: dict[str, int], usage: Any) -> None:
    """Fold an event's usage into ``total`` (a later count of a field replaces the earlier)."""
    for name in USAGE_FIELDS:
        value = usage.get(name) if isinstance(usage, Mapping) else getattr(usage, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            total[name] = value


def _event_usage(seen: dict[str, Any]) -> Callable[[Any], bool]:
    """Watch raw stream events: ``message_start`` carries the input counts, ``message_delta``
    the output count so far (and, on newer API versions, the input counts again)."""
    total: dict[str, int] = seen.setdefault("usage", {})

    def see(event: Any) -> bool:
        kind = getattr(event, "type", None)
        if kind == "message_start":
            _merge_usage(total, getattr(getattr(event, "message", None), "usage", None))
        elif kind == "message_delta":
            _merge_usage(total, getattr(event, "usage", None))
        return True

    return see


def _usage(usage: Any) -> Usage | None:
    return usage_from_anthropic(usage) if usage else None


def _finish(window: Window | AsyncWindow, request: Request, usage: Any) -> Turn:
    return window.finish(request, _usage(usage))


def _answer(window: Window | AsyncWindow, request: Request, result: Any, streaming: bool) -> Any:
    return answered(window, request, result, streaming=streaming, watch=_event_usage, usage=_usage)


def _snapshot_usage(stream: Any) -> Any:
    """The usage a ``MessageStream`` has accumulated, or None before its first event."""
    try:
        return stream.current_message_snapshot.usage
    except (AssertionError, AttributeError, RuntimeError):
        return None


class _StreamManager:
    """``messages.stream(...)``: the request (and any retry) is made on entering, as the SDK's."""

    def __init__(self, window: Window, open_stream: Callable[[list[Any]], Any], request: Request):
        self._window = window
        self._open = open_stream
        self._request = request
        self._manager: Any = None
        self._stream: Any = None

    def __enter__(self) -> Any:
        def enter(view: list[Any]) -> Any:
            manager = self._open(view)
            stream = manager.__enter__()
            self._manager = manager
            return stream

        self._stream = self._window.send(self._request, enter)
        return self._stream

    def __exit__(self, *exc_info: object) -> None:
        try:
            _finish(self._window, self._request, _snapshot_usage(self._stream))
        finally:
            if self._manager is not None:
                self._manager.__exit__(*exc_info)  # what left the block, as it came


class _AsyncStreamManager:
    """The asyncio twin of :class:`_StreamManager` (``async with``)."""

    def __init__(
        self,
        window: AsyncWindow,
        open_stream: Callable[[Request, list[Any]], Any],
        begin: Callable[[], Any],
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
                _finish(self._window, self._request, _snapshot_usage(self._stream))
        finally:
            if self._manager is not None:
                await self._manager.__aexit__(*exc_info)


_NOT_FOR_SUMMARY = ("messages", "model", "stream", "tool_choice")


def _summary_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The caller's arguments for a summary request: the same system and tools (the
    cached prefix), no tool to be called, no stream."""
    extra = {key: value for key, value in kwargs.items() if key not in _NOT_FOR_SUMMARY}
    if extra.get("tools"):
        extra["tool_choice"] = {"type": "none"}
    return extra


def _summary_answer(message: Any) -> tuple[str | None, Usage | None]:
    texts = [
        getattr(block, "text", "")
        for block in getattr(message, "content", None) or []
        if getattr(block, "type", None) == "text"
    ]
    return "".join(texts), _usage(getattr(message, "usage", None))


class _Hints:
    """Each conversation's breakpoints (docs/PRICING.md, "What the adapters send")."""

    def __init__(self) -> None:
        self._tasks: dict[str, Breakpoints] = {}

    def request(
        self, request: Request, kwargs: Mapping[str, Any], view: list[Any]
    ) -> tuple[dict[str, Any], Callable[[], None]]:
        """The call's arguments with the view and its breakpoints, and what to call once the
        API took the request (its prefixes are cached from then on)."""
        points = self._tasks.setdefault(request.task, Breakpoints())
        marked, written = points.place(view, kwargs.get("system"), kwargs.get("tools"))
        return {**kwargs, "messages": marked}, lambda: points.sent(written)


def _wrap_sync(client: anthropic.Anthropic, window: Window) -> anthropic.Anthropic:
    plain = Plain()
    hints = _Hints()
    create = client.messages.create
    stream = client.messages.stream

    def begin(kwargs: Mapping[str, Any]) -> tuple[list[Any], Request]:
        messages = plain(list(kwargs.get("messages", [])))
        head = _head(kwargs.get("system"), messages)

        def summarize(view: list[Any], model: str) -> tuple[str | None, Usage | None]:
            answer = create(**_summary_kwargs(kwargs), messages=view, model=model)
            return _summary_answer(answer)

        return messages, window.begin(messages, str(kwargs.get("model", "")), head, summarize)

    def create_message(*args: Any, **kwargs: Any) -> Any:
        _, request = begin(kwargs)

        def call(view: list[Any]) -> Any:
            sent, taken = hints.request(request, kwargs, view)
            result = create(*args, **sent)
            taken()
            return result

        result = window.send(request, call)
        return _answer(window, request, result, bool(kwargs.get("stream")))

    def stream_message(*args: Any, **kwargs: Any) -> _StreamManager:
        _, request = begin(kwargs)

        def open_stream(view: list[Any]) -> Any:
            sent, taken = hints.request(request, kwargs, view)
            taken()  # the stream's request is made on entering; a refusal costs one hint
            return stream(*args, **sent)

        return _StreamManager(window, open_stream, request)

    setattr(client.messages, "create", create_message)  # noqa: B010 - instance override
    setattr(client.messages, "stream", stream_message)  # noqa: B010 - instance override
    return keep_wrapped(client, window, _wrap_sync)


def _wrap_async(client: anthropic.AsyncAnthropic, window: AsyncWindow) -> anthropic.AsyncAnthropic:
    plain = Plain()
    hints = _Hints()
    create = client.messages.create
    stream = client.messages.stream

    async def begin(kwargs: Mapping[str, Any]) -> Request:
        messages = plain(list(kwargs.get("messages", [])))
        head = _head(kwargs.get("system"), messages)

        async def summarize(view: list[Any], model: str) -> tuple[str | None, Usage | None]:
            answer = await create(**_summary_kwargs(kwargs), messages=view, model=model)
            return _summary_answer(answer)

        return await window.begin(messages, str(kwargs.get("model", "")), head, summarize)

    async def create_message(*args: Any, **kwargs: Any) -> Any:
        request = await begin(kwargs)

        async def call(view: list[Any]) -> Any:
            sent, taken = hints.request(request, kwargs, view)
            result = await create(*args, **sent)
            taken()
            return result

        return _answer(
            window, request, await window.send(request, call), bool(kwargs.get("stream"))
        )

    def stream_message(*args: Any, **kwargs: Any) -> _AsyncStreamManager:
        def open_stream(request: Request, view: list[Any]) -> Any:
            sent, taken = hints.request(request, kwargs, view)
            taken()  # the stream's request is made on entering; a refusal costs one hint
            return stream(*args, **sent)

        return _AsyncStreamManager(window, open_stream, lambda: begin(kwargs))

    setattr(client.messages, "create", create_message)  # noqa: B010 - instance override
    setattr(client.messages, "stream", stream_message)  # noqa: B010 - instance override
    return keep_wrapped(client, window, _wrap_async)


@takes_window_args
def wrap(
    client: C,
    *,
    summary_model: str | None = None,
    **options: Unpack[WindowArgs],
) -> C:
    """An Anthropic client whose requests send ctxwin's view instead of the full history.

    ``messages.create`` (streaming included) and ``messages.stream`` of the
    returned client send the ``messages`` they are given to ctxwin (dialect
    ``anthropic``) with the previous request's usage and send the view it
    gets back; ``system`` and every other argument pass through. The
    response's usage (``input_tokens``, ``cache_creation_input_tokens``,
    ``cache_read_input_tokens``, ``output_tokens``; from the stream's events
    when streaming) is kept for the next turn. When the API answers that the
    prompt is too long, ctxwin compacts the task and the request is sent once
    more. Keep appending to your own full history as before
    (``{"role": "assistant", "content": response.content}`` may hold the SDK's
    block objects). ``with_options`` keeps the wrapping. Each request carries
    ``cache_control`` breakpoints (at most 4 with the caller's own) where
    ctxwin's cost model counts the prompt cache: the last block, the end of
    the longest prefix an earlier request wrote, the first pair
    (docs/PRICING.md, "What the adapters send").

    Args:
        client: an ``anthropic.Anthropic`` or ``anthropic.AsyncAnthropic`` client.
            It is copied (``with_options()``); the original stays as it was.
        task: the ctxwin task id for every conversation of this client; None
            derives one per conversation from its ``system`` and first message
            (``anthropic-<digest>``), stable across restarts.
        summaries: ``"model"``: when a summary is due (the last request used
            0.75 of the window), the model is asked for one with this client
            (the view it saw and an instruction; tools not called) and
            ctxwin cuts the turns it stands for; ``"basic"``: ctxwin writes
            the summary itself; None: cut without one (docs/SUMMARIES.md).
        summary_model: the model asked for summaries (default: the call's).

    Returns:
        The wrapped copy, of the same type as ``client``.
    """
    copy = client.with_options()
    window_options = WindowOptions(DIALECT, DIALECT, summary_model=summary_model, **options)
    if isinstance(copy, anthropic.AsyncAnthropic):
        return _wrap_async(copy, window_options.async_window(copy))
    return _wrap_sync(copy, window_options.window(copy))
