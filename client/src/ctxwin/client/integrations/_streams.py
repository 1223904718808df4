"""SDK stream objects that report what they saw once they end, for usage after a stream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from .._closing import AsyncClosing, Closing

__all__ = ["AsyncWatchedStream", "WatchedStream"]


class _Watched:
    """What both twins hold: the SDK stream, the filter, and the end not yet reported."""

    def __init__(self, stream: Any, see: Callable[[Any], bool], end: Callable[[], object]) -> None:
        self._stream = stream
        self._see = see
        self._end: Callable[[], object] | None = end

    def _done(self) -> None:
        end, self._end = self._end, None
        if end is not None:
            end()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class WatchedStream(_Watched, Closing):
    """Iterates an SDK stream as it is, shows each item to ``see``, calls ``end`` once.

    ``see(item)`` returns whether the caller gets the item (a usage chunk the
    caller did not ask for is kept back). ``end()`` runs when the stream is
    exhausted, closed or left as a context manager, whichever comes first.
    Everything else (``response``, ``close``, ...) is the SDK stream's own.
    """

    def __init__(self, stream: Any, see: Callable[[Any], bool], end: Callable[[], object]) -> None:
        super().__init__(stream, see, end)
        self._items = self._watch()

    def _watch(self) -> Iterator[Any]:
        try:
            for item in self._stream:
                if self._see(item):
                    yield item
        finally:
            self._done()

    def __iter__(self) -> Iterator[Any]:
        return self._items

    def __next__(self) -> Any:
        return next(self._items)

    def close(self) -> None:
        """Close the SDK stream (its connection) and report what was seen."""
        try:
            self._stream.close()
        finally:
            self._done()


class AsyncWatchedStream(_Watched, AsyncClosing):
    """The asyncio twin of :class:`WatchedStream`."""

    def __init__(self, stream: Any, see: Callable[[Any], bool], end: Callable[[], object]) -> None:
        super().__init__(stream, see, end)
        self._items = self._watch()

    async def _watch(self) -> AsyncIterator[Any]:
        try:
            async for item in self._stream:
                if self._see(item):
                    yield item
        finally:
            self._done()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._items

    async def __anext__(self) -> Any:
        return await self._items.__anext__()

    async def close(self) -> None:
        """Close the SDK stream (its connection) and report what was seen."""
        try:
            await self._stream.close()
        finally:
            self._done()

    aclose = close
    """The same, under the name :class:`~ctxwin.client._closing.AsyncClosing` awaits on
    leaving ``async with`` (and :func:`contextlib.aclosing`)."""
