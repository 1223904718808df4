"""What every adapter does around one model request, for the blocking and the asyncio twins.

Before the request: pick the conversation's task, send the caller's full history
with the previous request's usage to ``prepare_request`` and get the view to
send instead (when a summary is due, ``_summary.py`` stores one first). If the
provider answers that the request did not fit: ``compact`` (keep a quarter,
SPEC.md §8) and send again, once. After the answer: keep its usage for the
next turn, and report what was done as a :class:`Turn`.

The pure parts (task ids, the model map, the report) live in
:class:`~ctxwin.client.integrations._conversations.Conversations`;
:class:`Window` and :class:`AsyncWindow` only add the daemon calls.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from ctxwin.proto import Usage, is_context_window_error, sheet_for_model

from .._async import AsyncClient
from .._sync import Client
from .._task import AsyncTask, Task
from ._conversations import Conversations, Request, Turn
from ._streams import AsyncWatchedStream, WatchedStream
from ._summary import (
    SUMMARY_MODES,
    AsyncSummarize,
    Summarize,
    condense,
    condense_async,
    summary_request,
)

__all__ = [
    "AsyncWindow",
    "Window",
    "WindowOptions",
    "answered",
    "is_window_error",
    "keep_wrapped",
    "window_of",
]

R = TypeVar("R")

DEFAULT_STRATEGY = "auto"
"""The strategy adapters ask for (docs/STRATEGIES.md)."""

DIALECT_SHEETS = {"anthropic": "anthropic", "gemini": "gemini", "openai-chat": "openai"}
"""The price sheet of the provider a dialect's adapter wraps, when the model id names none."""


def pricing_for(dialect: str | None, model: str, pricing: Any) -> Any:
    """The ``pricing`` a request sends: the window's own, its model's sheet, its provider's."""
    if pricing is not None:
        return pricing
    sheet = sheet_for_model({"id": model})
    if sheet is not None:
        return sheet.name
    if dialect == "openai-responses":
        return "openai"
    return DIALECT_SHEETS.get(dialect or "")


def _plain(value: Any) -> Any:
    """``value`` with only its message-relevant keys: ``type``s dropped, nesting kept."""
    if isinstance(value, Mapping):
        return {
            key: _plain(item)
            for key, item in value.items()
            if key in {"code", "message", "error", "status", "status_code"}
        }
    return value


def is_window_error(error: BaseException) -> bool:
    """Whether a provider's exception says that the request did not fit the model's window.

    Reads the exception's HTTP status (``status_code`` or ``status``), its
    parsed error body (``body``: OpenAI's ``{"code": "context_length_exceeded",
    ...}``, Anthropic's ``{"type": "error", "error": {"type":
    "invalid_request_error", "message": "prompt is too long: ..."}}``) and its
    message, and asks :func:`ctxwin.proto.is_context_window_error`. Error
    *types* are left out: OpenAI marks every bad request
    ``invalid_request_error``, and compacting a conversation for a misspelt
    parameter would lose context for nothing; the code or the wording decides.

    Args:
        error: the exception the SDK or framework raised.

    Returns:
        True when compacting and sending again may help.
    """
    status = getattr(error, "status_code", None)
    if status is None:
        status = getattr(error, "status", None)
    body = getattr(error, "body", None)
    as_map: dict[str, Any] = {"message": str(error)}
    if isinstance(status, int):
        as_map["status"] = status
    if isinstance(body, Mapping):
        as_map["error"] = _plain(body)
    elif isinstance(body, str):
        as_map["detail"] = {"message": body}
    return is_context_window_error(as_map)


def _task_options(dialect: str | None, ephemeral: bool) -> dict[str, Any]:
    options: dict[str, Any] = {"ephemeral": ephemeral}
    if dialect is not None:
        options["dialect"] = dialect
    return options


class _Shared:
    """What both twins share: the conversations, the finish of a request, the latest turn."""

    state: Conversations
    _options: dict[str, Any]
    strategy: str
    pricing: Any
    summaries: str | None
    summary_model: str | None
    _dialect: str | None

    def _settings(
        self, strategy: str, pricing: Any, summaries: str | None, summary_model: str | None
    ) -> None:
        """Check and keep the request settings (before any client is made)."""
        if summaries is not None and summaries not in SUMMARY_MODES:
            raise ValueError(f"summaries must be one of {', '.join(SUMMARY_MODES)} or None")
        self.strategy = strategy
        self.pricing = pricing
        self.summaries = summaries
        self.summary_model = summary_model

    def _start(
        self,
        task: str | None,
        prefix: str,
        dialect: str | None,
        context_window: int | None,
        on_turn: Callable[[Turn], None] | None,
        ephemeral: bool,
        open_task: Callable[[str], Any],
    ) -> None:
        self._options = _task_options(dialect, ephemeral)
        self._dialect = dialect
        self.state = Conversations(
            task, prefix, dialect, context_window, on_turn, ephemeral, open_task
        )
        if task is not None:
            self.state.entry(())  # a wrong task id fails here, not on the first request

    def _budgeting(self, model: str) -> dict[str, Any]:
        """The strategy arguments of a request to ``model``."""
        args: dict[str, Any] = {"proactive": True, "strategy": self.strategy}
        pricing = pricing_for(self._dialect, model, self.pricing)
        if pricing is not None:
            args["pricing"] = pricing
        if self.summaries is not None:
            # Cut by summary: prepare_request says when one is due (docs/SUMMARIES.md).
            args["use_auto_condense"] = True
            args["summaries"] = True
        return args

    def _summary_call(
        self, request: Request, prompt: str, summarize: object
    ) -> tuple[list[Any], str] | None:
        """The summary request to send and its model, or None: the basic summary it is."""
        if self.summaries != "model" or not summarize:
            return None
        return (
            summary_request(self._dialect, request.view, prompt),
            self.summary_model or request.model,
        )

    def finish(self, request: Request, usage: Usage | None) -> Turn:
        """Record the request's usage for the next turn and report it."""
        return self.state.finish(request, usage)

    def last(self, task: str | None = None) -> Turn | None:
        """The latest turn of ``task`` (default: of the conversation used last)."""
        return self.state.last(task)


class Window(_Shared):
    """The blocking twin: one client of the daemon, one task per conversation.

    Args:
        task: the task id for every conversation, or None to derive one per
            conversation from its head (:func:`derive_task_id`).
        prefix: the prefix of derived task ids.
        dialect: the message dialect of the tasks (None: the daemon's default).
        context_window: the model's window in tokens, or None for the model's
            known one (else the daemon's default).
        client: the ctxwin client to use, or None to make one for ``endpoint``.
        endpoint: where the daemon listens (default: as :class:`Client` finds it).
        on_turn: called with each :class:`Turn` once its answer is in.
        ephemeral: keep the tasks in the daemon's memory only.
        strategy: the strategy of every request (``auto``; ``default`` is SPEC.md's).
        pricing: the price sheet (a name or multipliers), or None for the
            model's, else the wrapped provider's (docs/PRICING.md).
        summaries: ``model`` to have the model summarise the turns a cut
            removes when a summary is due, ``basic`` for ctxwin's own summary,
            None to cut without one (docs/SUMMARIES.md).
        summary_model: the model asked for summaries (default: the request's).
    """

    def __init__(
        self,
        *,
        task: str | None,
        prefix: str,
        dialect: str | None,
        context_window: int | None = None,
        client: Client | None = None,
        endpoint: str | None = None,
        on_turn: Callable[[Turn], None] | None = None,
        ephemeral: bool = False,
        strategy: str = DEFAULT_STRATEGY,
        pricing: Any = None,
        summaries: str | None = None,
        summary_model: str | None = None,
    ) -> None:
        self._settings(strategy, pricing, summaries, summary_model)
        self.client = client if client is not None else Client(endpoint)
        self._own_client = client is None
        self._start(task, prefix, dialect, context_window, on_turn, ephemeral, self._open)

    def _open(self, task: str) -> Task:
        return self.client.task(task, **self._options)

    def begin(
        self,
        messages: Sequence[Any],
        model: str,
        head: Sequence[Any] = (),
        summarize: Summarize | None = None,
    ) -> Request:
        """Ask the daemon which messages to send for this request.

        When a summary is due, ``summarize`` sends the summary request (the
        view as the model saw it, and the instruction) and the answer is
        stored with ``condense``; a failing or useless one falls back to the
        basic summary. The request then sends the view after it.

        Args:
            messages: the caller's full history, in the window's dialect.
            model: the request's model id.
            head: what identifies the conversation when the task id is derived.
            summarize: sends a summary request with the caller's client.

        Returns:
            The request, whose ``view`` is what to send.
        """
        task, entry = self.state.entry(head)
        ts = int(time.time() * 1000)
        prepared = entry.handle.prepare_request(
            messages,
            self.state.model(model),
            previous_request=entry.previous,
            **self._budgeting(model),
        )
        request = self.state.request(task, entry, messages, model, prepared, ts)
        if prepared.get("summary_due") and self.summaries is not None:
            call = self._summary_call(request, prepared.get("summary_prompt", ""), summarize)
            condense(request, self.state.model(model), call, summarize)
        return request

    def send(self, request: Request, call: Callable[[list[Any]], R]) -> R:
        """``call(view)``; when the provider refuses it as too long, compact and call once more."""
        try:
            return call(request.view)
        except Exception as exc:
            if request.retried or not is_window_error(exc):
                raise
            self.compact(request)
            return call(request.view)

    def compact(self, request: Request) -> None:
        """After a context-window error: keep a quarter (SPEC.md §8), take the new view."""
        handle = request.conversation.handle
        compacted = handle.compact(request.messages, "quarter")
        view = handle.truncated_messages(request.messages)["messages"]
        request.compacted(view, compacted["deleted_range"])

    def close(self) -> None:
        """Close the ctxwin client, if this window made it."""
        if self._own_client:
            self.client.close()


class AsyncWindow(_Shared):
    """The asyncio twin of :class:`Window` (same arguments, with an :class:`AsyncClient`)."""

    def __init__(
        self,
        *,
        task: str | None,
        prefix: str,
        dialect: str | None,
        context_window: int | None = None,
        client: AsyncClient | None = None,
        endpoint: str | None = None,
        on_turn: Callable[[Turn], None] | None = None,
        ephemeral: bool = False,
        strategy: str = DEFAULT_STRATEGY,
        pricing: Any = None,
        summaries: str | None = None,
        summary_model: str | None = None,
    ) -> None:
        self._settings(strategy, pricing, summaries, summary_model)
        self.client = client if client is not None else AsyncClient(endpoint)
        self._own_client = client is None
        self._start(task, prefix, dialect, context_window, on_turn, ephemeral, self._open)

    def _open(self, task: str) -> AsyncTask:
        return self.client.task(task, **self._options)

    async def begin(
        self,
        messages: Sequence[Any],
        model: str,
        head: Sequence[Any] = (),
        summarize: AsyncSummarize | None = None,
    ) -> Request:
        """Ask the daemon which messages to send for this request (see :meth:`Window.begin`)."""
        task, entry = self.state.entry(head)
        ts = int(time.time() * 1000)
        prepared = await entry.handle.prepare_request(
            messages,
            self.state.model(model),
            previous_request=entry.previous,
            **self._budgeting(model),
        )
        request = self.state.request(task, entry, messages, model, prepared, ts)
        if prepared.get("summary_due") and self.summaries is not None:
            call = self._summary_call(request, prepared.get("summary_prompt", ""), summarize)
            await condense_async(request, self.state.model(model), call, summarize)
        return request

    async def send(self, request: Request, call: Callable[[list[Any]], Awaitable[R]]) -> R:
        """``await call(view)``; when refused as too long, compact and call once more."""
        try:
            return await call(request.view)
        except Exception as exc:
            if request.retried or not is_window_error(exc):
                raise
            await self.compact(request)
            return await call(request.view)

    async def compact(self, request: Request) -> None:
        """After a context-window error: keep a quarter (SPEC.md §8), take the new view."""
        handle = request.conversation.handle
        compacted = await handle.compact(request.messages, "quarter")
        view = (await handle.truncated_messages(request.messages))["messages"]
        request.compacted(view, compacted["deleted_range"])

    def close(self) -> None:
        """Close the ctxwin client now, if this window made it."""
        if self._own_client:
            self.client.close()

    async def aclose(self) -> None:
        """Close the ctxwin client, if this window made it, waiting for its reader to end."""
        if self._own_client:
            await self.client.aclose()


def window_of(wrapped: object) -> Window | AsyncWindow:
    """The window behind a wrapped client or an adapter object, to read its turns.

    Args:
        wrapped: what an adapter returned (a wrapped SDK client, a filter, a
            middleware, a history processor).

    Returns:
        Its :class:`Window` or :class:`AsyncWindow`; ``.last()`` is the latest :class:`Turn`.

    Raises:
        TypeError: ``wrapped`` did not come from an adapter.
    """
    window = getattr(wrapped, "_ctxwin_window", None)
    if not isinstance(window, Window | AsyncWindow):
        raise TypeError(f"{type(wrapped).__name__} object is not a ctxwin adapter")
    return window


@dataclass(frozen=True)
class WindowOptions:
    """What an adapter's window is made of; :meth:`window` and :meth:`async_window` make it.

    Attributes:
        prefix: the prefix of derived task ids.
        dialect: the message dialect of the tasks.
        task: the task id for every conversation, or None to derive them.
        context_window: the model's window in tokens, or None for the known one.
        endpoint: where the daemon listens (default: as the client finds it).
        on_turn: called with each :class:`Turn`.
        strategy: the strategy of every request (default ``auto``).
        pricing: the price sheet, or None for the model's or the provider's.
        ephemeral: keep the tasks in the daemon's memory only (nothing written).
        summaries: ``model``, ``basic`` or None (see :class:`Window`).
        summary_model: the model asked for summaries (default: the request's).
    """

    prefix: str
    dialect: str
    task: str | None = None
    context_window: int | None = None
    endpoint: str | None = None
    on_turn: Callable[[Turn], None] | None = None
    strategy: str = DEFAULT_STRATEGY
    pricing: Any = None
    ephemeral: bool = False
    summaries: str | None = None
    summary_model: str | None = None

    def _open(self, kind: type[Window] | type[AsyncWindow], owner: object) -> Window | AsyncWindow:
        window = kind(
            task=self.task,
            prefix=self.prefix,
            dialect=self.dialect,
            context_window=self.context_window,
            endpoint=self.endpoint,
            on_turn=self.on_turn,
            strategy=self.strategy,
            pricing=self.pricing,
            ephemeral=self.ephemeral,
            summaries=self.summaries,
            summary_model=self.summary_model,
        )
        weakref.finalize(owner, window.close)
        return window

    def window(self, owner: object) -> Window:
        """A blocking window with a client of its own, closed once ``owner`` is collected."""
        return cast(Window, self._open(Window, owner))

    def async_window(self, owner: object) -> AsyncWindow:
        """An asyncio window with a client of its own, closed once ``owner`` is collected."""
        return cast(AsyncWindow, self._open(AsyncWindow, owner))


W = TypeVar("W", Window, AsyncWindow)
S = TypeVar("S")


def keep_wrapped(client: S, window: W, rewrap: Callable[[S, W], S]) -> S:
    """Mark ``client`` as wrapped around ``window``; its copies (``with_options``) are wrapped too.

    Args:
        client: the SDK client whose methods were just replaced.
        window: the window they use.
        rewrap: wraps a copy of the client around the same window.

    Returns:
        ``client``.
    """
    copy = getattr(client, "copy")  # noqa: B009 - both SDKs' clients have it

    def copy_wrapped(*args: Any, **kwargs: Any) -> S:
        return rewrap(copy(*args, **kwargs), window)

    setattr(client, "copy", copy_wrapped)  # noqa: B010 - instance override
    setattr(client, "with_options", copy_wrapped)  # noqa: B010 - with_options is copy
    setattr(client, "_ctxwin_window", window)  # noqa: B010
    return client


def answered(
    window: Window | AsyncWindow,
    request: Request,
    result: Any,
    *,
    streaming: bool,
    watch: Callable[[dict[str, Any]], Callable[[Any], bool]],
    usage: Callable[[Any], Usage | None],
) -> Any:
    """What an SDK call returns, with the request finished once its usage is known.

    Args:
        window: the window the request was begun on.
        request: the request.
        result: the SDK's answer: a response, or a stream when ``streaming``.
        streaming: whether ``result`` is a stream (sync or async, as the window).
        watch: makes the stream's item filter; it keeps the usage it sees in
            the map it is given, under ``"usage"``.
        usage: the wire usage from the response's (or the stream's) usage, or None.

    Returns:
        ``result`` itself, or the stream watched so that its end finishes the request.
    """
    if not streaming:
        window.finish(request, usage(getattr(result, "usage", None)))
        return result
    seen: dict[str, Any] = {}
    kind = AsyncWatchedStream if isinstance(window, AsyncWindow) else WatchedStream
    return kind(result, watch(seen), lambda: window.finish(request, usage(seen.get("usage"))))
