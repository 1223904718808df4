"""The windows the adapters use, and what the adapters share around them.

:class:`Window` and :class:`AsyncWindow` (``_sync_window.py``, generated from
``_async_window.py``) add the daemon calls to what both share
(``_window_base.py``); here: finding the window behind a wrapped client, the
options a window is made of, and finishing a request once its answer is in.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from ctxwin.proto import Usage

from ._async_streams import AsyncWatchedStream
from ._async_window import AsyncWindow
from ._conversations import Request, Turn
from ._sync_streams import WatchedStream
from ._sync_window import Window
from ._window_base import DEFAULT_STRATEGY, is_window_error

__all__ = [
    "AsyncWindow",
    "Window",
    "WindowOptions",
    "answered",
    "is_window_error",
    "keep_wrapped",
    "window_of",
]


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
