"""Handles bound to one task id, for the blocking and the asyncio client."""

# The per-call ``timeout=`` of the twins is the wire call's deadline (it also decides
# when the socket is renewed), not a substitute for cancel scopes: keep ASYNC109 off.
# ruff: noqa: ASYNC109

from __future__ import annotations

from typing import TYPE_CHECKING

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
    PrepareRequestResult,
    RollbackResult,
    ShouldCompactResult,
    TruncatedMessagesResult,
    Usage,
    is_valid_task_id,
)

from . import _core
from ._core import UNSET, CompactKeep, Messages, RangeArg
from ._errors import InvalidTaskIdError

if TYPE_CHECKING:
    from ._async import AsyncClient
    from ._sync import Client


class _TaskBase:
    """What both handles hold: the task id and whether the task is ephemeral."""

    def __init__(self, task_id: str, *, ephemeral: bool = False) -> None:
        if not is_valid_task_id(task_id):  # fail where the handle is made, not on first use
            error = InvalidTaskIdError(
                f"task id {task_id!r} does not match {TASK_ID_PATTERN.pattern}"
            )
            error.local = True
            raise error
        self.id = task_id
        self.ephemeral = ephemeral

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

    def __init__(self, client: Client, task_id: str, *, ephemeral: bool = False) -> None:
        super().__init__(task_id, ephemeral=ephemeral)
        self.client = client

    def prepare_request(
        self,
        messages: Messages,
        model: Model,
        *,
        previous_request: Usage | None = None,
        use_auto_condense: bool | None = None,
        deleted_range: RangeArg = UNSET,
        timeout: float | None = None,
    ) -> PrepareRequestResult:
        """``prepare_request`` for this task."""
        return self.client.call(
            _core.prepare_request(
                self.id,
                messages,
                model,
                previous_request=previous_request,
                use_auto_condense=use_auto_condense,
                deleted_range=deleted_range,
                ephemeral=self._open,
            ),
            timeout=timeout,
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
                usage, model, threshold=threshold, task=self.id, messages=messages
            ),
            timeout=timeout,
        )

    def truncated_messages(
        self, messages: Messages, *, deleted_range: RangeArg = UNSET, timeout: float | None = None
    ) -> TruncatedMessagesResult:
        """``truncated_messages`` for this task."""
        return self.client.call(
            _core.truncated_messages(
                self.id, messages, deleted_range=deleted_range, ephemeral=self._open
            ),
            timeout=timeout,
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
        return self.client.call(
            _core.optimize_file_reads(
                self.id, messages, ts=ts, deleted_range=deleted_range, ephemeral=self._open
            ),
            timeout=timeout,
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
        return self.client.call(
            _core.optimize_file_reads_in_memory(
                self.id, messages, ts=ts, deleted_range=deleted_range, ephemeral=self._open
            ),
            timeout=timeout,
        )

    def compact_subagent(
        self, messages: Messages, *, deleted_range: RangeArg = UNSET, timeout: float | None = None
    ) -> CompactSubagentResult:
        """``compact_subagent`` for this task."""
        return self.client.call(
            _core.compact_subagent(
                self.id, messages, deleted_range=deleted_range, ephemeral=self._open
            ),
            timeout=timeout,
        )

    def apply_truncation_notice(
        self, messages: Messages, *, ts: int | None = None, timeout: float | None = None
    ) -> ApplyTruncationNoticeResult:
        """``apply_truncation_notice`` for this task."""
        return self.client.call(
            _core.apply_truncation_notice(self.id, messages, ts=ts, ephemeral=self._open),
            timeout=timeout,
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
        return self.client.call(
            _core.compact(self.id, messages, keep, ts=ts, ephemeral=self._open), timeout=timeout
        )

    def condensed(self, messages: Messages, *, timeout: float | None = None) -> CondensedResult:
        """``condensed`` for this task."""
        return self.client.call(
            _core.condensed(self.id, messages, ephemeral=self._open), timeout=timeout
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

    def __init__(self, client: AsyncClient, task_id: str, *, ephemeral: bool = False) -> None:
        super().__init__(task_id, ephemeral=ephemeral)
        self.client = client

    async def prepare_request(
        self,
        messages: Messages,
        model: Model,
        *,
        previous_request: Usage | None = None,
        use_auto_condense: bool | None = None,
        deleted_range: RangeArg = UNSET,
        timeout: float | None = None,
    ) -> PrepareRequestResult:
        """``prepare_request`` for this task."""
        return await self.client.call(
            _core.prepare_request(
                self.id,
                messages,
                model,
                previous_request=previous_request,
                use_auto_condense=use_auto_condense,
                deleted_range=deleted_range,
                ephemeral=self._open,
            ),
            timeout=timeout,
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
                usage, model, threshold=threshold, task=self.id, messages=messages
            ),
            timeout=timeout,
        )

    async def truncated_messages(
        self, messages: Messages, *, deleted_range: RangeArg = UNSET, timeout: float | None = None
    ) -> TruncatedMessagesResult:
        """``truncated_messages`` for this task."""
        return await self.client.call(
            _core.truncated_messages(
                self.id, messages, deleted_range=deleted_range, ephemeral=self._open
            ),
            timeout=timeout,
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
        return await self.client.call(
            _core.optimize_file_reads(
                self.id, messages, ts=ts, deleted_range=deleted_range, ephemeral=self._open
            ),
            timeout=timeout,
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
        return await self.client.call(
            _core.optimize_file_reads_in_memory(
                self.id, messages, ts=ts, deleted_range=deleted_range, ephemeral=self._open
            ),
            timeout=timeout,
        )

    async def compact_subagent(
        self, messages: Messages, *, deleted_range: RangeArg = UNSET, timeout: float | None = None
    ) -> CompactSubagentResult:
        """``compact_subagent`` for this task."""
        return await self.client.call(
            _core.compact_subagent(
                self.id, messages, deleted_range=deleted_range, ephemeral=self._open
            ),
            timeout=timeout,
        )

    async def apply_truncation_notice(
        self, messages: Messages, *, ts: int | None = None, timeout: float | None = None
    ) -> ApplyTruncationNoticeResult:
        """``apply_truncation_notice`` for this task."""
        return await self.client.call(
            _core.apply_truncation_notice(self.id, messages, ts=ts, ephemeral=self._open),
            timeout=timeout,
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
        return await self.client.call(
            _core.compact(self.id, messages, keep, ts=ts, ephemeral=self._open), timeout=timeout
        )

    async def condensed(
        self, messages: Messages, *, timeout: float | None = None
    ) -> CondensedResult:
        """``condensed`` for this task."""
        return await self.client.call(
            _core.condensed(self.id, messages, ephemeral=self._open), timeout=timeout
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
