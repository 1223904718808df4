"""The asyncio watched stream; ``_sync_streams.py`` is generated from this file.

Edit this file, then run ``python3 client/scripts/generate.py`` (a test fails
while the generated twin is stale).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from .._closing import AsyncClosing

__all__ = ["AsyncWatchedStream"]


class AsyncWatchedStream(AsyncClosing):
    """Iterates an SDK stream as it is, shows each item to ``see``, calls ``end`` once.

    ``see(item)`` returns whether the caller gets the item (a usage chunk the
    caller did not ask for is kept back). ``end()`` runs when the stream is
    exhausted, closed or left as a context manager, whichever comes first.
    Everything else (``response``, ``close``, ...) is the SDK stream's own.
    """

    def __init__(self, stream: Any, see: Callable[[Any], bool], end: Callable[[], object]) -> None:
        self._stream = stream
        self._see = see
        self._end: Callable[[], object] | None = end
        self._items = self._watch()

    def _done(self) -> None:
        end, self._end = self._end, None
        if end is not None:
            end()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

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

    # unasync: async only
    aclose = close
    """The same, under the name :class:`~ctxwin.client._closing.AsyncClosing` awaits on
    leaving ``async with`` (and :func:`contextlib.aclosing`)."""
    # unasync: end
