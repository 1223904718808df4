"""The asyncio client: one DEALER socket, many requests in flight, replies matched by id.

Works on asyncio and on anyio's asyncio backend (pyzmq's asyncio support means
asyncio only).
"""

# The per-call ``timeout=`` of the twins is the wire call's deadline (it also decides
# when the socket is renewed), not a substitute for cancel scopes: keep ASYNC109 off.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import itertools
import time
from types import TracebackType
from typing import Any, TypeVar

import zmq
import zmq.asyncio

from ctxwin import proto
from ctxwin.proto import (
    ApplyTruncationNoticeResult,
    CloseResult,
    CompactResult,
    CompactSubagentResult,
    CondensedResult,
    ContextWindowInfoResult,
    CountTokensResult,
    DeletedRange,
    FlushResult,
    InspectResult,
    Keep,
    Model,
    NextTruncationRangeResult,
    OptimizeFileReadsInMemoryResult,
    OptimizeFileReadsResult,
    PingResult,
    PlanResult,
    PrepareRequestResult,
    Reply,
    RollbackResult,
    ShouldCompactResult,
    StatsResult,
    TruncatedMessagesResult,
    Usage,
)

from . import _autostart, _core
from ._core import (
    DEFAULT_TIMEOUT,
    UNSET,
    Call,
    CompactKeep,
    Messages,
    RangeArg,
    RetryPolicy,
    Strategy,
)
from ._errors import ClientClosedError, DaemonUnavailableError, RequestTimeoutError
from ._task import AsyncTask

T = TypeVar("T")


class AsyncClient:
    """asyncio client of ``ctxwind``: one coroutine method per wire op.

    Any number of calls may be in flight at once on its single socket; each
    reply finds its caller by request id. Use it as an async context manager,
    or await :meth:`aclose`. Bound to the event loop that first uses it.

    Args:
        endpoint: where the daemon listens; else ``$CTXWIN_ENDPOINT``, else
            the default endpoint.
        timeout: default seconds each call waits for its reply (busy retries
            included); every method also takes ``timeout=``.
        retry: how ``busy`` replies are retried.
        autostart: when nothing answers, start ``ctxwind`` on the endpoint and
            wait until it does (off by default).
        context: the ZeroMQ asyncio context to use (the process-wide one by default).

    Each op method takes the op's arguments from the wire table (DESIGN.md),
    with ``deleted_range`` left out meaning "the task's stored range" and
    ``None`` clearing it, and ``ts`` defaulting to now; it returns the op's
    result map (a TypedDict from ``ctxwin.proto``). The ``close`` op is
    :meth:`close_task`, since ``close`` closes the client.

    Raises:
        CtxwinError: from every op method: the subclass for the daemon's error
            code (``BusyError`` once the retries are spent), or, before
            anything is sent, for arguments the daemon would refuse (``local``
            set); ``RequestTimeoutError`` when no reply comes in time.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        autostart: bool = False,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        self.endpoint = proto.resolve_endpoint(endpoint)
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.autostart = autostart
        self._context = context or zmq.asyncio.Context.instance()
        self._socket: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._ids = itertools.count(1)
        self._connecting: asyncio.Lock | None = None
        self._closed = False

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the socket (linger 0) and fail calls still waiting; later calls raise."""
        self._closed = True
        reader = self._drop_socket()
        if reader is not None and reader.get_loop() is asyncio.get_running_loop():
            # Wait for the reader to end without taking a cancellation of our own caller.
            await asyncio.wait([reader])

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._closed

    def task(self, task_id: str, *, ephemeral: bool = False, delta: bool = True) -> AsyncTask:
        """A handle bound to one task id.

        Args:
            task_id: the task.
            ephemeral: keep the task in the daemon's memory only (subagent runners).
            delta: sync the history by delta (send what each turn adds).
        """
        return AsyncTask(self, task_id, ephemeral=ephemeral, delta=delta)

    # Transport.

    def _drop_socket(self, reason: Exception | None = None) -> asyncio.Task[None] | None:
        """Close the socket, stop its reader, fail the calls still waiting on it."""
        reader, self._reader = self._reader, None
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
        if reader is not None and not reader.get_loop().is_closed():
            reader.cancel()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(reason or ClientClosedError("the client was closed"))
        self._pending.clear()
        return reader

    async def _connect(self) -> zmq.asyncio.Socket:
        if self._closed:
            raise ClientClosedError("the client is closed")
        loop = asyncio.get_running_loop()
        if self._reader is not None and self._reader.get_loop() is not loop:
            self._drop_socket()  # first used on another loop, now gone
            self._connecting = None
        if self._socket is not None:
            return self._socket
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._socket is None:
                if self.autostart:
                    await loop.run_in_executor(None, _autostart.ensure_daemon, self.endpoint)
                    if self._closed:
                        raise ClientClosedError("the client is closed")
                sock = self._context.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                try:
                    sock.connect(self.endpoint)
                except zmq.ZMQError as exc:
                    sock.close(linger=0)
                    raise _core.connect_error(self.endpoint, exc) from None
                self._socket = sock
                self._reader = loop.create_task(self._read(sock))
            return self._socket

    async def _read(self, sock: zmq.asyncio.Socket) -> None:
        """Hand each reply to the caller waiting for its id, for as long as the socket lives."""
        try:
            while True:
                frames = await sock.recv_multipart()
                reply = _core.decode(frames)
                if reply is None:
                    continue
                target = _core.reply_target(reply, self._pending.keys())
                future = self._pending.get(target) if target is not None else None
                if future is not None and not future.done():
                    future.set_result(reply)
        except zmq.ZMQError as exc:
            # The socket broke under us: fail the waiting calls, let the next one reconnect.
            if self._socket is sock:
                self._reader = None
                self._drop_socket(
                    DaemonUnavailableError(f"receiving failed: {exc}", endpoint=self.endpoint)
                )

    async def _exchange(self, call: Call[Any], deadline: float) -> Reply:
        sock = await self._connect()
        request_id = next(self._ids)
        body = _core.encode(call, request_id)
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        timed_out = False
        try:
            try:
                await sock.send(body, zmq.NOBLOCK)
            except zmq.Again:
                raise DaemonUnavailableError(
                    f"{call.op}: cannot queue the request for {self.endpoint}",
                    endpoint=self.endpoint,
                ) from None
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    return await future
            except TimeoutError:
                timed_out = True
                raise RequestTimeoutError(
                    f"{call.op}: no reply from {self.endpoint} within the timeout",
                    endpoint=self.endpoint,
                ) from None
        finally:
            self._pending.pop(request_id, None)
            # Replies are matched by id, so a late one is dropped; once nothing
            # else is in flight, start over on a fresh socket as the blocking
            # client does, so nothing queued for a stuck peer lingers.
            if timed_out and not self._pending and self._socket is sock:
                self._drop_socket()

    async def call(self, call: Call[T], *, timeout: float | None = None) -> T:
        """Send a built request and return its typed result.

        Args:
            call: from one of the builders in ``ctxwin.client._core``.
            timeout: seconds for the whole call, busy retries included.

        Raises:
            CtxwinError: the subclass for the error (see ``ctxwin.client``).
        """
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        attempt = 0
        while True:
            reply = await self._exchange(call, deadline)
            step = _core.outcome(call, reply, attempt, self.retry, deadline - time.monotonic())
            if not isinstance(step, _core.Retry):
                return step
            await asyncio.sleep(step.delay)
            attempt += 1

    # One method per wire op (DESIGN.md table); the logic is in _core.

    async def ping(self, *, timeout: float | None = None) -> PingResult:
        """``ping``: whether the daemon answers, its version and protocol."""
        return await self.call(_core.ping(), timeout=timeout)

    async def stats(self, *, timeout: float | None = None) -> StatsResult:
        """``stats``: the daemon's counters."""
        return await self.call(_core.stats(), timeout=timeout)

    async def context_window_info(
        self, model: Model, *, timeout: float | None = None
    ) -> ContextWindowInfoResult:
        """``context_window_info``: the window and the largest allowed size (SPEC.md §2)."""
        return await self.call(_core.context_window_info(model), timeout=timeout)

    async def should_compact(
        self,
        usage: Usage | None,
        model: Model,
        *,
        threshold: float | None = None,
        task: str | None = None,
        messages: Messages | None = None,
        timeout: float | None = None,
    ) -> ShouldCompactResult:
        """``should_compact``: whether the last request's usage calls for compaction."""
        return await self.call(
            _core.should_compact(usage, model, threshold=threshold, task=task, messages=messages),
            timeout=timeout,
        )

    async def next_truncation_range(
        self,
        messages: Messages,
        deleted_range: DeletedRange,
        keep: Keep,
        *,
        timeout: float | None = None,
    ) -> NextTruncationRangeResult:
        """``next_truncation_range`` (SPEC.md §3)."""
        return await self.call(
            _core.next_truncation_range(messages, deleted_range, keep), timeout=timeout
        )

    async def prepare_request(
        self,
        task: str,
        messages: Messages,
        model: Model,
        *,
        previous_request: Usage | None = None,
        use_auto_condense: bool | None = None,
        deleted_range: RangeArg = UNSET,
        ephemeral: bool | None = None,
        strategy: Strategy | None = None,
        proactive: bool | None = None,
        estimate: bool | None = None,
        timeout: float | None = None,
    ) -> PrepareRequestResult:
        """``prepare_request``: the messages to send to the model this turn (SPEC.md §7)."""
        return await self.call(
            _core.prepare_request(
                task,
                messages,
                model,
                previous_request=previous_request,
                use_auto_condense=use_auto_condense,
                deleted_range=deleted_range,
                ephemeral=ephemeral,
                strategy=strategy,
                proactive=proactive,
                estimate=estimate,
            ),
            timeout=timeout,
        )

    async def plan(
        self,
        task: str,
        messages: Messages,
        model: Model,
        *,
        previous_request: Usage | None = None,
        use_auto_condense: bool | None = None,
        ephemeral: bool | None = None,
        strategy: Strategy | None = None,
        proactive: bool | None = None,
        timeout: float | None = None,
    ) -> PlanResult:
        """``plan``: what ``prepare_request`` would do now, changing nothing."""
        return await self.call(
            _core.plan(
                task,
                messages,
                model,
                previous_request=previous_request,
                use_auto_condense=use_auto_condense,
                ephemeral=ephemeral,
                strategy=strategy,
                proactive=proactive,
            ),
            timeout=timeout,
        )

    async def truncated_messages(
        self,
        task: str,
        messages: Messages,
        *,
        deleted_range: RangeArg = UNSET,
        ephemeral: bool | None = None,
        timeout: float | None = None,
    ) -> TruncatedMessagesResult:
        """``truncated_messages``: the view under the task's range and overlay (SPEC.md §4)."""
        return await self.call(
            _core.truncated_messages(
                task, messages, deleted_range=deleted_range, ephemeral=ephemeral
            ),
            timeout=timeout,
        )

    async def optimize_file_reads(
        self,
        task: str,
        messages: Messages,
        *,
        ts: int | None = None,
        deleted_range: RangeArg = UNSET,
        ephemeral: bool | None = None,
        timeout: float | None = None,
    ) -> OptimizeFileReadsResult:
        """``optimize_file_reads``: replace stale duplicate file reads (SPEC.md §6)."""
        return await self.call(
            _core.optimize_file_reads(
                task, messages, ts=ts, deleted_range=deleted_range, ephemeral=ephemeral
            ),
            timeout=timeout,
        )

    async def optimize_file_reads_in_memory(
        self,
        task: str,
        messages: Messages,
        *,
        ts: int | None = None,
        deleted_range: RangeArg = UNSET,
        ephemeral: bool | None = None,
        timeout: float | None = None,
    ) -> OptimizeFileReadsInMemoryResult:
        """``optimize_file_reads_in_memory`` (SPEC.md §8)."""
        return await self.call(
            _core.optimize_file_reads_in_memory(
                task, messages, ts=ts, deleted_range=deleted_range, ephemeral=ephemeral
            ),
            timeout=timeout,
        )

    async def compact_subagent(
        self,
        task: str,
        messages: Messages,
        *,
        deleted_range: RangeArg = UNSET,
        ephemeral: bool | None = None,
        timeout: float | None = None,
    ) -> CompactSubagentResult:
        """``compact_subagent``: compact a subagent's conversation (SPEC.md §8)."""
        return await self.call(
            _core.compact_subagent(
                task, messages, deleted_range=deleted_range, ephemeral=ephemeral
            ),
            timeout=timeout,
        )

    async def apply_truncation_notice(
        self,
        task: str,
        messages: Messages,
        *,
        ts: int | None = None,
        ephemeral: bool | None = None,
        timeout: float | None = None,
    ) -> ApplyTruncationNoticeResult:
        """``apply_truncation_notice`` (SPEC.md §5)."""
        return await self.call(
            _core.apply_truncation_notice(task, messages, ts=ts, ephemeral=ephemeral),
            timeout=timeout,
        )

    async def compact(
        self,
        task: str,
        messages: Messages,
        keep: CompactKeep = "quarter",
        *,
        ts: int | None = None,
        ephemeral: bool | None = None,
        timeout: float | None = None,
    ) -> CompactResult:
        """``compact``: force a cut (``quarter`` after a context-window error) (SPEC.md §8)."""
        return await self.call(
            _core.compact(task, messages, keep, ts=ts, ephemeral=ephemeral), timeout=timeout
        )

    async def condensed(
        self,
        task: str,
        messages: Messages,
        *,
        ephemeral: bool | None = None,
        timeout: float | None = None,
    ) -> CondensedResult:
        """``condensed``: hide the summary request and its turn (SPEC.md §8)."""
        return await self.call(
            _core.condensed(task, messages, ephemeral=ephemeral), timeout=timeout
        )

    async def rollback(
        self,
        task: str,
        ts: int,
        *,
        deleted_range: RangeArg = UNSET,
        ephemeral: bool | None = None,
        timeout: float | None = None,
    ) -> RollbackResult:
        """``rollback``: drop overlay updates newer than ``ts`` (SPEC.md §9)."""
        return await self.call(
            _core.rollback(task, ts, deleted_range=deleted_range, ephemeral=ephemeral),
            timeout=timeout,
        )

    async def inspect(
        self, task: str, *, ephemeral: bool | None = None, timeout: float | None = None
    ) -> InspectResult:
        """``inspect``: the task's overlay, range and dirty flag."""
        return await self.call(_core.inspect(task, ephemeral=ephemeral), timeout=timeout)

    async def flush(self, task: str | None = None, *, timeout: float | None = None) -> FlushResult:
        """``flush``: returns once the task (or every task) is durable on disk."""
        return await self.call(_core.flush(task), timeout=timeout)

    async def close_task(self, task: str, *, timeout: float | None = None) -> CloseResult:
        """``close``: flush the task and stop its actor (``close`` closes the client)."""
        return await self.call(_core.close(task), timeout=timeout)

    async def count_tokens(
        self,
        messages: Messages | None = None,
        *,
        text: str | None = None,
        timeout: float | None = None,
    ) -> CountTokensResult:
        """``count_tokens``: tokens of either ``messages`` or ``text``."""
        return await self.call(_core.count_tokens(messages, text=text), timeout=timeout)
