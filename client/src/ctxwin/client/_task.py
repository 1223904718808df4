"""Handles bound to one task id, for the blocking and the asyncio client."""

# The per-call ``timeout=`` of the twins is the wire call's deadline (it also decides
# when the socket is renewed), not a substitute for cancel scopes: keep ASYNC109 off.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, TypeVar

from ctxwin.proto import (
    TASK_ID_PATTERN,
    ApplyTruncationNoticeResult,
    CloseResult,
    CompactResult,
    CompactSubagentResult,
    CondensedResult,
    FlushResult,
    InspectResult,
    Model,
    OptimizeFileReadsInMemoryResult,
    OptimizeFileReadsResult,
    PlanResult,
    PrepareRequestResult,
    RollbackResult,
    ShouldCompactResult,
    TruncatedMessagesResult,
    Usage,
    is_valid_task_id,
)

from . import _core
from ._core import UNSET, Call, CompactKeep, Messages, RangeArg, Strategy
from ._errors import CtxwinError, InvalidTaskIdError
from ._turns import Turns

T = TypeVar("T")

if TYPE_CHECKING:
    from ._async import AsyncClient
    from ._sync import Client


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

    def __init__(self, task_id: str, *, ephemeral: bool = False, delta: bool = True) -> None:
        if not is_valid_task_id(task_id):  # fail where the handle is made, not on first use
            error = InvalidTaskIdError(
                f"task id {task_id!r} does not match {TASK_ID_PATTERN.pattern}"
            )
            error.local = True
            raise error
        self.id = task_id
        self.ephemeral = ephemeral
        self._delta = _core.DeltaSync(delta)

    @property
    def delta(self) -> bool:
        """Whether history ops sync by delta (off after a daemon refused it)."""
        return self._delta.enabled

    def resync(self) -> None:
        """Send the whole history with the next op (after editing old messages in place)."""
        self._delta.reset()

    @property
    def _open(self) -> bool | None:
        # Sent with every op that accepts it: an ephemeral task's state may be
        # dropped when idle, and the next call must re-create it as ephemeral.
        return True if self.ephemeral else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r}, ephemeral={self.ephemeral})"


class Task(_TaskBase):
    """A task of a blocking :class:`Client`; every method is the op of that name for the task.

    Args:
        client: the client to send through.
        task_id: the task.
        ephemeral: keep the task in the daemon's memory only (subagent runners).
    """

    def __init__(
        self, client: Client, task_id: str, *, ephemeral: bool = False, delta: bool = True
    ) -> None:
        super().__init__(task_id, ephemeral=ephemeral, delta=delta)
        self.client = client
        self._syncing = Turns()

    @contextlib.contextmanager
    def _turn(self, op: str, timeout: float | None) -> Iterator[float]:
        """Wait for this handle's history op before, within ``timeout``; yields the deadline."""
        budget = _core.budget(self.client.timeout if timeout is None else timeout)
        deadline = time.monotonic() + budget
        too_long = functools.partial(_core.queued_too_long, op, self.client.endpoint, "task handle")
        with self._syncing.take(_core.lock_wait(budget), too_long):
            yield deadline

    def _history(self, call: Call[T], messages: Messages, timeout: float | None) -> T:
        """Send a history op by delta, resending in full when the daemon asks to.

        History ops of one handle run one at a time, resync included, so the
        daemon applies them in the order they were called; ``timeout`` covers
        the whole op: the wait for the one before, the call and any resend.
        """
        snapshot = list(messages)  # as it is now, for the resend too
        with self._turn(call.op, timeout) as deadline:
            try:
                return self.client.call(
                    self._delta.call(call, snapshot), timeout=_core.left(deadline)
                )
            except CtxwinError as exc:
                retry = self._delta.retry(call, snapshot, exc)
                if retry is None:
                    raise
                return self.client.call(
                    retry, timeout=_core.left_for_resend(deadline, exc, self.client.endpoint)
                )

    def plan(
        self,
        messages: Messages,
        model: Model,
        *,
        previous_request: Usage | None = None,
        use_auto_condense: bool | None = None,
        strategy: Strategy | None = None,
        proactive: bool | None = None,
        timeout: float | None = None,
    ) -> PlanResult:
        """``plan`` for this task: what ``prepare_request`` would do, changing nothing."""
        return self._history(
            _core.plan(
                self.id,
                (),
                model,
                previous_request=previous_request,
                use_auto_condense=use_auto_condense,
                ephemeral=self._open,
                strategy=strategy,
                proactive=proactive,
            ),
            messages,
            timeout,
        )

    def prepare_request(
        self,
        messages: Messages,
        model: Model,
        *,
        previous_request: Usage | None = None,
        use_auto_condense: bool | None = None,
        deleted_range: RangeArg = UNSET,
        strategy: Strategy | None = None,
        proactive: bool | None = None,
        estimate: bool | None = None,
        timeout: float | None = None,
    ) -> PrepareRequestResult:
        """``prepare_request`` for this task (see :func:`ctxwin.client._core.prepare_request`)."""
        return self._history(
            _core.prepare_request(
                self.id,
                (),
                model,
                previous_request=previous_request,
                use_auto_condense=use_auto_condense,
                deleted_range=deleted_range,
                ephemeral=self._open,
                strategy=strategy,
                proactive=proactive,
                estimate=estimate,
            ),
            messages,
            timeout,
        )

    def should_compact(
        self,
        usage: Usage | None,
        model: Model,
        *,
        threshold: float | None = None,
        messages: Messages | None = None,
        timeout: float | None = None,
    ) -> ShouldCompactResult:
        """``should_compact`` for this task."""
        return self.client.call(
            _core.should_compact(
                usage,
                model,
                threshold=threshold,
                task=self.id,
                messages=messages,
                ephemeral=self._open,
            ),
            timeout=timeout,
        )

    def truncated_messages(
        self, messages: Messages, *, deleted_range: RangeArg = UNSET, timeout: float | None = None
    ) -> TruncatedMessagesResult:
        """``truncated_messages`` for this task."""
        return self._history(
            _core.truncated_messages(
                self.id, (), deleted_range=deleted_range, ephemeral=self._open
            ),
            messages,
            timeout,
        )

    def optimize_file_reads(
        self,
        messages: Messages,
        *,
        ts: int | None = None,
        deleted_range: RangeArg = UNSET,
        timeout: float | None = None,
    ) -> OptimizeFileReadsResult:
        """``optimize_file_reads`` for this task."""
        return self._history(
            _core.optimize_file_reads(
                self.id, (), ts=ts, deleted_range=deleted_range, ephemeral=self._open
            ),
            messages,
            timeout,
        )

    def optimize_file_reads_in_memory(
        self,
        messages: Messages,
        *,
        ts: int | None = None,
        deleted_range: RangeArg = UNSET,
        timeout: float | None = None,
    ) -> OptimizeFileReadsInMemoryResult:
        """``optimize_file_reads_in_memory`` for this task."""
        return self._history(
            _core.optimize_file_reads_in_memory(
                self.id, (), ts=ts, deleted_range=deleted_range, ephemeral=self._open
            ),
            messages,
            timeout,
        )

    def compact_subagent(
        self, messages: Messages, *, deleted_range: RangeArg = UNSET, timeout: float | None = None
    ) -> CompactSubagentResult:
        """``compact_subagent`` for this task."""
        return self._history(
            _core.compact_subagent(self.id, (), deleted_range=deleted_range, ephemeral=self._open),
            messages,
            timeout,
        )

    def apply_truncation_notice(
        self, messages: Messages, *, ts: int | None = None, timeout: float | None = None
    ) -> ApplyTruncationNoticeResult:
        """``apply_truncation_notice`` for this task."""
        return self._history(
            _core.apply_truncation_notice(self.id, (), ts=ts, ephemeral=self._open),
            messages,
            timeout,
        )

    def compact(
        self,
        messages: Messages,
        keep: CompactKeep = "quarter",
        *,
        ts: int | None = None,
        timeout: float | None = None,
    ) -> CompactResult:
        """``compact`` for this task."""
        return self._history(
            _core.compact(self.id, (), keep, ts=ts, ephemeral=self._open),
            messages,
            timeout,
        )

    def condensed(self, messages: Messages, *, timeout: float | None = None) -> CondensedResult:
        """``condensed`` for this task."""
        return self._history(
            _core.condensed(self.id, (), ephemeral=self._open),
            messages,
            timeout,
        )

    def rollback(
        self, ts: int, *, deleted_range: RangeArg = UNSET, timeout: float | None = None
    ) -> RollbackResult:
        """``rollback`` for this task."""
        return self.client.call(
            _core.rollback(self.id, ts, deleted_range=deleted_range, ephemeral=self._open),
            timeout=timeout,
        )

    def inspect(self, *, timeout: float | None = None) -> InspectResult:
        """``inspect`` for this task."""
        return self.client.call(_core.inspect(self.id, ephemeral=self._open), timeout=timeout)

    def flush(self, *, timeout: float | None = None) -> FlushResult:
        """``flush`` for this task."""
        return self.client.call(_core.flush(self.id), timeout=timeout)

    def close(self, *, timeout: float | None = None) -> CloseResult:
        """``close`` for this task."""
        return self.client.call(_core.close(self.id), timeout=timeout)


class AsyncTask(_TaskBase):
    """A task of an :class:`AsyncClient`; every method is the op of that name for the task.

    Args:
        client: the client to send through.
        task_id: the task.
        ephemeral: keep the task in the daemon's memory only (subagent runners).
    """

    def __init__(
        self, client: AsyncClient, task_id: str, *, ephemeral: bool = False, delta: bool = True
    ) -> None:
        super().__init__(task_id, ephemeral=ephemeral, delta=delta)
        self.client = client
        self._syncing: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    @contextlib.asynccontextmanager
    async def _turn(self, op: str, timeout: float | None) -> AsyncIterator[float]:
        """Wait for this handle's history op before, within ``timeout``; yields the deadline."""
        budget = _core.budget(self.client.timeout if timeout is None else timeout)
        deadline = time.monotonic() + budget
        loop = asyncio.get_running_loop()
        if self._syncing is None or self._syncing[0] is not loop:
            self._syncing = (loop, asyncio.Lock())  # a lock serves the loop it was used on
        lock = self._syncing[1]
        try:
            async with asyncio.timeout(_core.lock_wait(budget)):
                await lock.acquire()
        except TimeoutError:
            raise _core.queued_too_long(op, self.client.endpoint, "task handle") from None
        try:
            yield deadline
        finally:
            lock.release()

    async def _history(self, call: Call[T], messages: Messages, timeout: float | None) -> T:
        """Send a history op by delta, resending in full when the daemon asks to.

        History ops of one handle run one at a time, resync included, so the
        daemon applies them in the order they were called; ``timeout`` covers
        the whole op: the wait for the one before, the call and any resend.
        """
        snapshot = list(messages)  # as it is now, for the resend too
        async with self._turn(call.op, timeout) as deadline:
            try:
                return await self.client.call(
                    self._delta.call(call, snapshot), timeout=_core.left(deadline)
                )
            except CtxwinError as exc:
                retry = self._delta.retry(call, snapshot, exc)
                if retry is None:
                    raise
                return await self.client.call(
                    retry, timeout=_core.left_for_resend(deadline, exc, self.client.endpoint)
                )

    async def plan(
        self,
        messages: Messages,
        model: Model,
        *,
        previous_request: Usage | None = None,
        use_auto_condense: bool | None = None,
        strategy: Strategy | None = None,
        proactive: bool | None = None,
        timeout: float | None = None,
    ) -> PlanResult:
        """``plan`` for this task: what ``prepare_request`` would do, changing nothing."""
        return await self._history(
            _core.plan(
                self.id,
                (),
                model,
                previous_request=previous_request,
                use_auto_condense=use_auto_condense,
                ephemeral=self._open,
                strategy=strategy,
                proactive=proactive,
            ),
            messages,
            timeout,
        )

    async def prepare_request(
        self,
        messages: Messages,
        model: Model,
        *,
        previous_request: Usage | None = None,
        use_auto_condense: bool | None = None,
        deleted_range: RangeArg = UNSET,
        strategy: Strategy | None = None,
        proactive: bool | None = None,
        estimate: bool | None = None,
        timeout: float | None = None,
    ) -> PrepareRequestResult:
        """``prepare_request`` for this task (see :func:`ctxwin.client._core.prepare_request`)."""
        return await self._history(
            _core.prepare_request(
                self.id,
                (),
                model,
                previous_request=previous_request,
                use_auto_condense=use_auto_condense,
                deleted_range=deleted_range,
                ephemeral=self._open,
                strategy=strategy,
                proactive=proactive,
                estimate=estimate,
            ),
            messages,
            timeout,
        )

    async def should_compact(
        self,
        usage: Usage | None,
        model: Model,
        *,
        threshold: float | None = None,
        messages: Messages | None = None,
        timeout: float | None = None,
    ) -> ShouldCompactResult:
        """``should_compact`` for this task."""
        return await self.client.call(
            _core.should_compact(
                usage,
                model,
                threshold=threshold,
                task=self.id,
                messages=messages,
                ephemeral=self._open,
            ),
            timeout=timeout,
        )

    async def truncated_messages(
        self, messages: Messages, *, deleted_range: RangeArg = UNSET, timeout: float | None = None
    ) -> TruncatedMessagesResult:
        """``truncated_messages`` for this task."""
        return await self._history(
            _core.truncated_messages(
                self.id, (), deleted_range=deleted_range, ephemeral=self._open
            ),
            messages,
            timeout,
        )

    async def optimize_file_reads(
        self,
        messages: Messages,
        *,
        ts: int | None = None,
        deleted_range: RangeArg = UNSET,
        timeout: float | None = None,
    ) -> OptimizeFileReadsResult:
        """``optimize_file_reads`` for this task."""
        return await self._history(
            _core.optimize_file_reads(
                self.id, (), ts=ts, deleted_range=deleted_range, ephemeral=self._open
            ),
            messages,
            timeout,
        )

    async def optimize_file_reads_in_memory(
        self,
        messages: Messages,
        *,
        ts: int | None = None,
        deleted_range: RangeArg = UNSET,
        timeout: float | None = None,
    ) -> OptimizeFileReadsInMemoryResult:
        """``optimize_file_reads_in_memory`` for this task."""
        return await self._history(
            _core.optimize_file_reads_in_memory(
                self.id, (), ts=ts, deleted_range=deleted_range, ephemeral=self._open
            ),
            messages,
            timeout,
        )

    async def compact_subagent(
        self, messages: Messages, *, deleted_range: RangeArg = UNSET, timeout: float | None = None
    ) -> CompactSubagentResult:
        """``compact_subagent`` for this task."""
        return await self._history(
            _core.compact_subagent(self.id, (), deleted_range=deleted_range, ephemeral=self._open),
            messages,
            timeout,
        )

    async def apply_truncation_notice(
        self, messages: Messages, *, ts: int | None = None, timeout: float | None = None
    ) -> ApplyTruncationNoticeResult:
        """``apply_truncation_notice`` for this task."""
        return await self._history(
            _core.apply_truncation_notice(self.id, (), ts=ts, ephemeral=self._open),
            messages,
            timeout,
        )

    async def compact(
        self,
        messages: Messages,
        keep: CompactKeep = "quarter",
        *,
        ts: int | None = None,
        timeout: float | None = None,
    ) -> CompactResult:
        """``compact`` for this task."""
        return await self._history(
            _core.compact(self.id, (), keep, ts=ts, ephemeral=self._open),
            messages,
            timeout,
        )

    async def condensed(
        self, messages: Messages, *, timeout: float | None = None
    ) -> CondensedResult:
        """``condensed`` for this task."""
        return await self._history(
            _core.condensed(self.id, (), ephemeral=self._open),
            messages,
            timeout,
        )

    async def rollback(
        self, ts: int, *, deleted_range: RangeArg = UNSET, timeout: float | None = None
    ) -> RollbackResult:
        """``rollback`` for this task."""
        return await self.client.call(
            _core.rollback(self.id, ts, deleted_range=deleted_range, ephemeral=self._open),
            timeout=timeout,
        )

    async def inspect(self, *, timeout: float | None = None) -> InspectResult:
        """``inspect`` for this task."""
        return await self.client.call(_core.inspect(self.id, ephemeral=self._open), timeout=timeout)

    async def flush(self, *, timeout: float | None = None) -> FlushResult:
        """``flush`` for this task."""
        return await self.client.call(_core.flush(self.id), timeout=timeout)

    async def close(self, *, timeout: float | None = None) -> CloseResult:
        """``close`` for this task."""
        return await self.client.call(_core.close(self.id), timeout=timeout)
