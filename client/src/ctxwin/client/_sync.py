"""The blocking client: one DEALER socket, one request at a time."""

from __future__ import annotations

import functools
import itertools
import time
from types import TracebackType
from typing import Any, TypeVar

import zmq

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
from ._task import Task
from ._turns import Turns

T = TypeVar("T")


class Client:
    """Blocking client of ``ctxwind``: one method per wire op.

    Safe to share between threads (calls are serialised). Use it as a context
    manager, or call :meth:`close`.

    Args:
        endpoint: where the daemon listens; else ``$CTXWIN_ENDPOINT``, else
            the default endpoint.
        timeout: default seconds each call waits for its reply (busy retries
            included); every method also takes ``timeout=``.
        retry: how ``busy`` replies are retried.
        autostart: when nothing answers, start ``ctxwind`` on the endpoint and
            wait until it does (off by default).
        context: the ZeroMQ context to use (the process-wide one by default).

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
        context: zmq.Context[Any] | None = None,
    ) -> None:
        self.endpoint = proto.resolve_endpoint(endpoint)
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.autostart = autostart
        self._context = context or zmq.Context.instance()
        self._socket: zmq.Socket[bytes] | None = None
        self._ids = itertools.count(1)
        self._turns = Turns()
        self._closed = False

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the socket (linger 0); later calls raise ClientClosedError."""
        with self._turns.take(None, RuntimeError):  # after the call in flight, if any
            self._closed = True
            self._drop_socket()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def task(self, task_id: str, *, ephemeral: bool = False, delta: bool = True) -> Task:
        """A handle bound to one task id.

        Args:
            task_id: the task.
            ephemeral: keep the task in the daemon's memory only (subagent runners).
            delta: sync the history by delta (send what each turn adds).
        """
        return Task(self, task_id, ephemeral=ephemeral, delta=delta)

    # Transport.

    def _drop_socket(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None

    def _connect(self) -> zmq.Socket[bytes]:
        if self._closed:
            raise ClientClosedError("the client is closed")
        if self._socket is None:
            if self.autostart:
                _autostart.ensure_daemon(self.endpoint)
            sock = self._context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            try:
                sock.connect(self.endpoint)
            except zmq.ZMQError as exc:
                sock.close(linger=0)
                raise _core.connect_error(self.endpoint, exc) from None
            self._socket = sock
        return self._socket

    def _exchange(self, call: Call[Any], deadline: float) -> Reply:
        sock = self._connect()
        request_id = next(self._ids)
        try:
            sock.send(_core.encode(call, request_id), zmq.NOBLOCK)
        except zmq.Again:
            self._drop_socket()
            raise DaemonUnavailableError(
                f"{call.op}: cannot queue the request for {self.endpoint}", endpoint=self.endpoint
            ) from None
        while True:
            remaining = deadline - time.monotonic()
            if not remaining > 0:  # NaN included
                # A late reply must never meet a later request: start over.
                self._drop_socket()
                raise RequestTimeoutError(
                    f"{call.op}: no reply from {self.endpoint} within the timeout",
                    endpoint=self.endpoint,
                )
            if not sock.poll(_core.poll_ms(remaining), zmq.POLLIN):
                continue  # one slice of a long wait: look at the clock again
            reply = _core.decode(sock.recv_multipart())
            if reply is not None and _core.reply_target(reply, (request_id,)) == request_id:
                return reply

    def call(self, call: Call[T], *, timeout: float | None = None) -> T:
        """Send a built request and return its typed result.

        Args:
            call: from one of the builders in ``ctxwin.client._core``.
            timeout: seconds for the whole call, busy retries included.

        Raises:
            CtxwinError: the subclass for the error (see ``ctxwin.client``).
        """
        budget = _core.budget(self.timeout if timeout is None else timeout)
        deadline = time.monotonic() + budget
        too_long = functools.partial(_core.queued_too_long, call.op, self.endpoint, "client")
        with self._turns.take(_core.lock_wait(budget), too_long):
            attempt = 0
            while True:
                reply = self._exchange(call, deadline)
                step = _core.outcome(call, reply, attempt, self.retry, deadline - time.monotonic())
                if not isinstance(step, _core.Retry):
                    return step
                time.sleep(step.delay)
                attempt += 1

    # One method per wire op (DESIGN.md table); the logic is in _core.

    def ping(self, *, timeout: float | None = None) -> PingResult:
        """``ping``: whether the daemon answers, its version and protocol."""
        return self.call(_core.ping(), timeout=timeout)

    def stats(self, *, timeout: float | None = None) -> StatsResult:
        """``stats``: the daemon's counters."""
        return self.call(_core.stats(), timeout=timeout)

    def context_window_info(
        self, model: Model, *, timeout: float | None = None
    ) -> ContextWindowInfoResult:
        """``context_window_info``: the window and the largest allowed size (SPEC.md §2)."""
        return self.call(_core.context_window_info(model), timeout=timeout)

    def should_compact(
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
        return self.call(
            _core.should_compact(usage, model, threshold=threshold, task=task, messages=messages),
            timeout=timeout,
        )

    def next_truncation_range(
        self,
        messages: Messages,
        deleted_range: DeletedRange,
        keep: Keep,
        *,
        timeout: float | None = None,
    ) -> NextTruncationRangeResult:
        """``next_truncation_range`` (SPEC.md §3)."""
        return self.call(
            _core.next_truncation_range(messages, deleted_range, keep), timeout=timeout
        )

    def prepare_request(
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
        return self.call(
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

    def plan(
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
        return self.call(
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

    def truncated_messages(
        self,
        task: str,
        messages: Messages,
        *,
        deleted_range: RangeArg = UNSET,
        ephemeral: bool | None = None,
        timeout: float | None = None,
    ) -> TruncatedMessagesResult:
        """``truncated_messages``: the view under the task's range and overlay (SPEC.md §4)."""
        return self.call(
            _core.truncated_messages(
                task, messages, deleted_range=deleted_range, ephemeral=ephemeral
            ),
            timeout=timeout,
        )

    def optimize_file_reads(
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
        return self.call(
            _core.optimize_file_reads(
                task, messages, ts=ts, deleted_range=deleted_range, ephemeral=ephemeral
            ),
            timeout=timeout,
        )

    def optimize_file_reads_in_memory(
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
        return self.call(
            _core.optimize_file_reads_in_memory(
                task, messages, ts=ts, deleted_range=deleted_range, ephemeral=ephemeral
            ),
            timeout=timeout,
        )

    def compact_subagent(
        self,
        task: str,
        messages: Messages,
        *,
        deleted_range: RangeArg = UNSET,
        ephemeral: bool | None = None,
        timeout: float | None = None,
    ) -> CompactSubagentResult:
        """``compact_subagent``: compact a subagent's conversation (SPEC.md §8)."""
        return self.call(
            _core.compact_subagent(
                task, messages, deleted_range=deleted_range, ephemeral=ephemeral
            ),
            timeout=timeout,
        )

    def apply_truncation_notice(
        self,
        task: str,
        messages: Messages,
        *,
        ts: int | None = None,
        ephemeral: bool | None = None,
        timeout: float | None = None,
    ) -> ApplyTruncationNoticeResult:
        """``apply_truncation_notice`` (SPEC.md §5)."""
        return self.call(
            _core.apply_truncation_notice(task, messages, ts=ts, ephemeral=ephemeral),
            timeout=timeout,
        )

    def compact(
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
        return self.call(
            _core.compact(task, messages, keep, ts=ts, ephemeral=ephemeral), timeout=timeout
        )

    def condensed(
        self,
        task: str,
        messages: Messages,
        *,
        ephemeral: bool | None = None,
        timeout: float | None = None,
    ) -> CondensedResult:
        """``condensed``: hide the summary request and its turn (SPEC.md §8)."""
        return self.call(_core.condensed(task, messages, ephemeral=ephemeral), timeout=timeout)

    def rollback(
        self,
        task: str,
        ts: int,
        *,
        deleted_range: RangeArg = UNSET,
        ephemeral: bool | None = None,
        timeout: float | None = None,
    ) -> RollbackResult:
        """``rollback``: drop overlay updates newer than ``ts`` (SPEC.md §9)."""
        return self.call(
            _core.rollback(task, ts, deleted_range=deleted_range, ephemeral=ephemeral),
            timeout=timeout,
        )

    def inspect(
        self, task: str, *, ephemeral: bool | None = None, timeout: float | None = None
    ) -> InspectResult:
        """``inspect``: the task's overlay, range and dirty flag."""
        return self.call(_core.inspect(task, ephemeral=ephemeral), timeout=timeout)

    def flush(self, task: str | None = None, *, timeout: float | None = None) -> FlushResult:
        """``flush``: returns once the task (or every task) is durable on disk."""
        return self.call(_core.flush(task), timeout=timeout)

    def close_task(self, task: str, *, timeout: float | None = None) -> CloseResult:
        """``close``: flush the task and stop its actor (``close`` closes the client)."""
        return self.call(_core.close(task), timeout=timeout)

    def count_tokens(
        self,
        messages: Messages | None = None,
        *,
        text: str | None = None,
        timeout: float | None = None,
    ) -> CountTokensResult:
        """``count_tokens``: tokens of either ``messages`` or ``text``."""
        return self.call(_core.count_tokens(messages, text=text), timeout=timeout)
