"""What the task handles of both clients share (``_async_task.py``, ``_sync_task.py``).

A handle's methods are made from the op builders in ``_ops`` (every builder
whose first argument is the task): each takes its builder's arguments after
the task id, and arguments the handle holds (``ephemeral``) default to the
handle's. Handles type against the small :class:`~ctxwin.client._methods.Caller`
protocols, not against the clients. ``AsyncTask`` is written once
(``_async_task.py``) and ``Task`` generated from it; what differs between them
and is not a name is here: how a handle's history ops take turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Generic, ParamSpec, TypeVar

from ctxwin.proto import OPS, TASK_ID_PATTERN, is_valid_task_id

from . import _core, _delta, _ops
from ._core import Call, Messages
from ._errors import InvalidTaskIdError
from ._methods import AsyncCaller, Caller
from ._turns import Turns

__all__ = ["HISTORY_OPS", "AsyncTurns", "BlockingTurns", "TaskBase"]

P = ParamSpec("P")
T = TypeVar("T")
C = TypeVar("C")
U = TypeVar("U")

NO_FEATURES: frozenset[str] = frozenset()
"""What a handle that does not sync by delta needs of the daemon's features."""

HISTORY_OPS = frozenset(name for name, spec in OPS.items() if spec.over_history)
"""Ops over a task's history: a handle syncs their ``messages`` by delta."""


class TaskBase(Generic[C, U]):
    """What both handles hold: the client, the task id, whether it is ephemeral, its delta sync,
    and the turns its history ops take (``U``, made by :meth:`_turns`).

    History ops (those that take ``messages``) sync by delta: after the first
    full list only the messages a turn adds are sent, and views come back as
    patches applied to the caller's own list, so the view shares the caller's
    message objects. Messages already sent are taken as unchanged while they
    are the same objects (the newest two are always checked again); after
    editing older messages in place, call :meth:`resync`. ``delta=False``
    sends whole lists every time.
    """

    def __init__(
        self,
        client: C,
        task_id: str,
        *,
        ephemeral: bool = False,
        delta: bool = True,
        dialect: str | None = None,
        read_tools: _ops.ReadTools | None = None,
    ) -> None:
        if not is_valid_task_id(task_id):  # fail where the handle is made, not on first use
            error = InvalidTaskIdError(
                f"task id {task_id!r} does not match {TASK_ID_PATTERN.pattern}"
            )
            error.local = True
            raise error
        self.id = task_id
        self.ephemeral = ephemeral
        self.dialect = dialect
        self.read_tools = _ops.copy_read_tools(read_tools)
        self._delta = _delta.DeltaSync(delta)
        self.client = client
        self._syncing = self._turns()

    def _turns(self) -> U:
        """A new lock for the handle's history ops, of its client's kind."""
        raise NotImplementedError

    @property
    def delta(self) -> bool:
        """Whether history ops sync by delta (off after a daemon refused it)."""
        return self._delta.enabled

    def resync(self) -> None:
        """Send the whole history with the next op (after editing old messages in place)."""
        self._delta.reset()

    def view_origins(self) -> list[int | None] | None:
        """The history index each message of the last view a history op returned stands
        for (None: a message the view added, such as a filled-in result or a notice of
        its own); None when that view did not come as a patch (no delta sync, a view
        holding no message of the history).

        Raises:
            ValueError: the daemon's patch named origins that do not fit it.
        """
        return self._delta.patches.origins() if self._delta.enabled else None

    def __repr__(self) -> str:
        shown = "" if self.dialect is None else f", dialect={self.dialect!r}"
        return f"{type(self).__name__}({self.id!r}, ephemeral={self.ephemeral}{shown})"


class Shape(Generic[T]):
    """How a handle calls one builder: with its id first, its defaults, its history apart."""

    __slots__ = ("build", "history", "opens")

    def __init__(self, build: Callable[..., Call[T]]) -> None:
        self.build = build
        self.history = build.__name__ in HISTORY_OPS
        # Sent with every op that accepts it: an ephemeral task's state may be
        # dropped when idle, and the next call must re-create it as ephemeral.
        self.opens = "ephemeral" in inspect.signature(build).parameters

    def call(
        self, handle: TaskBase[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Call[T], Messages | None]:
        """The call for ``handle``, and for a history op the caller's messages (else None).

        A history op is built with no messages: the handle's delta sync adds
        them (whole or as a delta) from the caller's list.
        """
        if self.opens and handle.ephemeral and kwargs.get("ephemeral") is None:
            kwargs = {**kwargs, "ephemeral": True}
        if self.opens and handle.dialect is not None and kwargs.get("dialect") is None:
            kwargs = {**kwargs, "dialect": handle.dialect}
        if self.opens and handle.read_tools is not None and kwargs.get("read_tools") is None:
            kwargs = {**kwargs, "read_tools": handle.read_tools}
        messages: Messages | None = None
        if self.history:
            if "messages" in kwargs:
                messages, kwargs = kwargs["messages"], {**kwargs, "messages": ()}
            elif args:
                messages, args = args[0], ((), *args[1:])
        return self.build(handle.id, *args, **kwargs), messages


class BlockingTurns:
    """A blocking handle's history ops, one at a time (threads wait in order of arrival)."""

    __slots__ = ("_turns",)

    def __init__(self) -> None:
        self._turns = Turns()

    @contextlib.contextmanager
    def take(self, call: Call[Any], client: Caller) -> Iterator[float]:
        """Wait for the handle's history op before, within the call's time; yields the deadline."""
        budget = _core.call_budget(call, None, client.timeout)
        deadline = time.monotonic() + budget
        wait = _core.lock_wait(budget)
        with self._turns.take(wait, _core.queued_too_long, call.op, client.endpoint, "task handle"):
            yield deadline


class AsyncTurns:
    """An asyncio handle's history ops, one at a time (a lock for the loop it is used on)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    @contextlib.asynccontextmanager
    async def take(self, call: Call[Any], client: AsyncCaller) -> AsyncIterator[float]:
        """Wait for the handle's history op before, within the call's time; yields the deadline."""
        budget = _core.call_budget(call, None, client.timeout)
        deadline = time.monotonic() + budget
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock[0] is not loop:
            self._lock = (loop, asyncio.Lock())  # a lock serves the loop it was used on
        lock = self._lock[1]
        try:
            async with asyncio.timeout(_core.lock_wait(budget)):
                await lock.acquire()
        except TimeoutError:
            raise _core.queued_too_long(call.op, client.endpoint, "task handle") from None
        try:
            yield deadline
        finally:
            lock.release()
