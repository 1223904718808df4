"""Objects that are their own context manager and close themselves on leaving it.

The clients and the SDK streams the integrations hand back are used as ``with
thing:`` (``async with``), as :func:`contextlib.closing` would wrap them: the
block gets the thing itself, and leaving the block, by an exception or not,
closes it.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["AsyncClosing", "Closing"]


class Closing:
    """``with thing:`` gives the thing and calls its :meth:`close` on leaving."""

    def close(self) -> None:
        """Release what the object holds (each subclass says what)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncClosing:
    """``async with thing:`` gives the thing and awaits its :meth:`aclose` on leaving."""

    async def aclose(self) -> None:
        """Release what the object holds (each subclass says what)."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
