"""Handles bound to one task id, for the blocking and the asyncio client.

A handle's methods are made from the op builders in ``_ops`` (every builder
whose first argument is the task): each takes its builder's arguments after
the task id, and arguments the handle holds (``ephemeral``) default to the
handle's. Handles type against the small :class:`~ctxwin.client._methods.Caller`
protocols, not against the clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from ctxwin.proto import OPS, TASK_ID_PATTERN, is_valid_task_id

from . import _core, _delta, _methods, _ops
from ._core import Call, Messages
from ._errors import CtxwinError, InvalidTaskIdError
from ._methods import AsyncCaller, Caller
from ._turns import Turns

__all__ = ["AsyncTask", "Task"]

P = ParamSpec("P")
T = TypeVar("T")

NO_FEATURES: frozenset[str] = frozenset()
"""What a handle that does not sync by delta needs of the daemon's features."""

HISTORY_OPS = frozenset(name for name, spec in OPS.items() if spec.over_history)
"""Ops over a task's history: a handle syncs their ``messages`` by delta."""


class _TaskBase:
    """What both handles hold: the task id, whether it is ephemeral, its delta sync.

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


class _Shape(Generic[T]):
    """How a handle calls one builder: with its id first, its defaults, its history apart."""

    __slots__ = ("build", "history", "opens")

    def __init__(self, build: Callable[..., Call[T]]) -> None:
        self.build = build
        self.history = build.__name__ in HISTORY_OPS
        # Sent with every op that accepts it: an ephemeral task's state may be
        # dropped when idle, and the next call must re-create it as ephemeral.
        self.opens = "ephemeral" in inspect.signature(build).parameters

    def call(
        self, handle: _TaskBase, args: tuple[Any, ...], kwargs: dict[str, Any]
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


def _blocking(build: Callable[Concatenate[str, P], Call[T]]) -> Callable[Concatenate[Task, P], T]:
    shape = _Shape(build)

    def method(self: Task, /, *args: P.args, **kwargs: P.kwargs) -> T:
        call, messages = shape.call(self, args, kwargs)
        if messages is None:
            return self.client.call(call)
        return self._history(call, messages)

    _methods.as_method(method, build, drop=1)
    return method


def _awaiting(
    build: Callable[Concatenate[str, P], Call[T]],
) -> Callable[Concatenate[AsyncTask, P], Coroutine[Any, Any, T]]:
    shape = _Shape(build)

    async def method(self: AsyncTask, /, *args: P.args, **kwargs: P.kwargs) -> T:
        call, messages = shape.call(self, args, kwargs)
        if messages is None:
            return await self.client.call(call)
        return await self._history(call, messages)

    _methods.as_method(method, build, drop=1)
    return method


class Task(_TaskBase):
    """A task of a blocking client; every method is the op of that name for the task.

    Args:
        client: the client to send through.
        task_id: the task.
        ephemeral: keep the task in the daemon's memory only (subagent runners).
        delta: sync the history by delta (send what each turn adds).
        dialect: the task's message dialect (``openai-chat``, ``anthropic``,
            ``openai-responses``, ``gemini``; None: the daemon's default, ``cline``),
            sent with every op that takes it.
        read_tools: the task's own read tools, besides the daemon's table
            (``{"name", "arg", "when"?, "pattern"?}`` maps, docs/DIALECTS.md),
            sent with every op that takes them; native dialects only.
    """

    def __init__(
        self,
        client: Caller,
        task_id: str,
        *,
        ephemeral: bool = False,
        delta: bool = True,
        dialect: str | None = None,
        read_tools: _ops.ReadTools | None = None,
    ) -> None:
        super().__init__(
            task_id, ephemeral=ephemeral, delta=delta, dialect=dialect, read_tools=read_tools
        )
        self.client = client
        self._syncing = Turns()

    @contextlib.contextmanager
    def _turn(self, call: Call[Any]) -> Iterator[float]:
        """Wait for this handle's history op before, within the call's time; yields the deadline."""
        budget = _core.call_budget(call, None, self.client.timeout)
        deadline = time.monotonic() + budget
        too_long = functools.partial(
            _core.queued_too_long, call.op, self.client.endpoint, "task handle"
        )
        with self._syncing.take(_core.lock_wait(budget), too_long):
            yield deadline

    def _history(self, call: Call[T], messages: Messages) -> T:
        """Send a history op by delta, resending in full when the daemon asks to.

        History ops of one handle run one at a time, resync included, so the
        daemon applies them in the order they were called. What is asked for
        follows the daemon's features (a ping, once per connection). The call's
        timeout covers the whole op: the wait for the one before, that ping, the
        call and any resend.
        """
        snapshot = list(messages)  # as it is now, for the resend too
        with self._turn(call) as deadline:
            features = self.client._features(deadline) if self._delta.enabled else NO_FEATURES
            try:
                return self.client.call(
                    self._delta.call(call, snapshot, features, owned=True),
                    timeout=_core.left(deadline),
                )
            except CtxwinError as exc:
                retry = self._delta.retry(call, snapshot, exc, owned=True)
                if retry is None:
                    raise
                return self.client.call(
                    retry, timeout=_core.left_for_resend(deadline, exc, self.client.endpoint)
                )

    # -- the op methods: generated by client/scripts/generate.py from proto.OPS --
    should_compact = _blocking(_ops.task_should_compact)
    prepare_request = _blocking(_ops.prepare_request)
    plan = _blocking(_ops.plan)
    truncated_messages = _blocking(_ops.truncated_messages)
    optimize_file_reads = _blocking(_ops.optimize_file_reads)
    optimize_file_reads_in_memory = _blocking(_ops.optimize_file_reads_in_memory)
    compact_subagent = _blocking(_ops.compact_subagent)
    apply_truncation_notice = _blocking(_ops.apply_truncation_notice)
    compact = _blocking(_ops.compact)
    condensed = _blocking(_ops.condensed)
    condense = _blocking(_ops.condense)
    rollback = _blocking(_ops.rollback)
    inspect = _blocking(_ops.inspect)
    flush = _blocking(_ops.flush)
    close = _blocking(_ops.close)
    # -- end of the generated op methods --


class AsyncTask(_TaskBase):
    """A task of an asyncio client; every method is the op of that name for the task.

    Args:
        client: the client to send through.
        task_id: the task.
        ephemeral: keep the task in the daemon's memory only (subagent runners).
        delta: sync the history by delta (send what each turn adds).
        dialect: the task's message dialect (see :class:`Task`).
        read_tools: the task's own read tools (see :class:`Task`).
    """

    def __init__(
        self,
        client: AsyncCaller,
        task_id: str,
        *,
        ephemeral: bool = False,
        delta: bool = True,
        dialect: str | None = None,
        read_tools: _ops.ReadTools | None = None,
    ) -> None:
        super().__init__(
            task_id, ephemeral=ephemeral, delta=delta, dialect=dialect, read_tools=read_tools
        )
        self.client = client
        self._syncing: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    @contextlib.asynccontextmanager
    async def _turn(self, call: Call[Any]) -> AsyncIterator[float]:
        """Wait for this handle's history op before, within the call's time; yields the deadline."""
        budget = _core.call_budget(call, None, self.client.timeout)
        deadline = time.monotonic() + budget
        loop = asyncio.get_running_loop()
        if self._syncing is None or self._syncing[0] is not loop:
            self._syncing = (loop, asyncio.Lock())  # a lock serves the loop it was used on
        lock = self._syncing[1]
        try:
            async with asyncio.timeout(_core.lock_wait(budget)):
                await lock.acquire()
        except TimeoutError:
            raise _core.queued_too_long(call.op, self.client.endpoint, "task handle") from None
        try:
            yield deadline
        finally:
            lock.release()

    async def _history(self, call: Call[T], messages: Messages) -> T:
        """Send a history op by delta, resending in full when the daemon asks to (see Task)."""
        snapshot = list(messages)  # as it is now, for the resend too
        async with self._turn(call) as deadline:
            enabled = self._delta.enabled
            features = await self.client._features(deadline) if enabled else NO_FEATURES
            try:
                return await self.client.call(
                    self._delta.call(call, snapshot, features, owned=True),
                    timeout=_core.left(deadline),
                )
            except CtxwinError as exc:
                retry = self._delta.retry(call, snapshot, exc, owned=True)
                if retry is None:
                    raise
                return await self.client.call(
                    retry, timeout=_core.left_for_resend(deadline, exc, self.client.endpoint)
                )

    # -- the op methods: generated by client/scripts/generate.py from proto.OPS --
    should_compact = _awaiting(_ops.task_should_compact)
    prepare_request = _awaiting(_ops.prepare_request)
    plan = _awaiting(_ops.plan)
    truncated_messages = _awaiting(_ops.truncated_messages)
    optimize_file_reads = _awaiting(_ops.optimize_file_reads)
    optimize_file_reads_in_memory = _awaiting(_ops.optimize_file_reads_in_memory)
    compact_subagent = _awaiting(_ops.compact_subagent)
    apply_truncation_notice = _awaiting(_ops.apply_truncation_notice)
    compact = _awaiting(_ops.compact)
    condensed = _awaiting(_ops.condensed)
    condense = _awaiting(_ops.condense)
    rollback = _awaiting(_ops.rollback)
    inspect = _awaiting(_ops.inspect)
    flush = _awaiting(_ops.flush)
    close = _awaiting(_ops.close)
    # -- end of the generated op methods --
