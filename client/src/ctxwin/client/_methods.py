"""Client and task handle methods made from the op builders in ``_ops.py``.

A method takes exactly its builder's arguments (the signature is copied, so
``help()`` and a test can see it) and sends the built call through the small
:class:`Caller` protocols the clients offer, so ``_task.py`` types against
them, not against the clients.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from ._core import Call

__all__ = ["AsyncCaller", "Caller", "as_method", "awaiting", "blocking"]

P = ParamSpec("P")
T = TypeVar("T")


class Caller(Protocol):
    """What a blocking client offers to the methods made from builders and to task handles."""

    endpoint: str
    timeout: float

    def call(self, call: Call[T], *, timeout: float | None = None) -> T:
        """Send ``call``; return its typed result."""
        ...

    def _features(self, deadline: float) -> frozenset[str]:
        """What the daemon on this connection supports (ping's ``features``), asked once."""
        ...


class AsyncCaller(Protocol):
    """What an asyncio client offers to the methods made from builders and to task handles."""

    endpoint: str
    timeout: float

    async def call(self, call: Call[T], *, timeout: float | None = None) -> T:  # noqa: ASYNC109
        """Send ``call``; return its typed result."""
        ...

    async def _features(self, deadline: float) -> frozenset[str]:
        """What the daemon on this connection supports (ping's ``features``), asked once."""
        ...


def as_method(method: Callable[..., Any], build_call: Callable[..., Any], drop: int = 0) -> None:
    """Give ``method`` the name, docstring and signature of ``build_call`` (``self`` first).

    Args:
        method: the method made from the builder.
        build_call: the builder.
        drop: how many of the builder's leading arguments the method fills in
            itself (a task handle's id).
    """
    functools.update_wrapper(method, build_call)
    signature = inspect.signature(build_call)
    this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    kept = list(signature.parameters.values())[drop:]
    method.__signature__ = signature.replace(parameters=[this, *kept])  # type: ignore[attr-defined]


def blocking(build_call: Callable[P, Call[T]]) -> Callable[Concatenate[Caller, P], T]:
    """A blocking client method taking exactly ``build_call``'s arguments."""

    def method(self: Caller, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.call(build_call(*args, **kwargs))

    as_method(method, build_call)
    return method


def awaiting(
    build_call: Callable[P, Call[T]],
) -> Callable[Concatenate[AsyncCaller, P], Coroutine[Any, Any, T]]:
    """An asyncio client method taking exactly ``build_call``'s arguments."""

    async def method(self: AsyncCaller, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.call(build_call(*args, **kwargs))

    as_method(method, build_call)
    return method
