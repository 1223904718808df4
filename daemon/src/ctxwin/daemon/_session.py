"""One task as its actor runs it: settings, calibration, kept history, persistence, pipeline.

A :class:`TaskSession` answers every request of its task, one at a time (its
actor's mailbox keeps them in order). A history op runs one pipeline,
:meth:`TaskSession.handle`:

1. resolve the history: a delta is applied to the kept history
   (:class:`~._kept.KeptHistory`), a whole list replaces it;
2. map it to the internal form (a native dialect, docs/DIALECTS.md);
3. budget: when the request asks for estimates, count the new messages (in a
   worker thread), fold in the reported usage, and build the
   :class:`ctxwin.engine.Budgeting`;
4. run the engine call (:func:`~._ops.run_task_op`) on the task's state,
   starting the task over when the history is not the one its range and edits
   were made on;
5. map the view back to the caller's messages, and send it as a list or, when
   asked, as a patch (:class:`ctxwin.engine.PatchMaker`).

Ops that are not over a history go straight to the engine, except the
session's own: ``inspect``, ``flush`` and ``close``. The state is loaded from
and written to the task's :class:`~.store.TaskStore`; when it is written is the
task's :class:`~._schedule.WriteSchedule`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
import structlog

from ctxwin import engine, proto

from ._basis import engine_target, inspected_view, record_basis
from ._calibration import TaskCalibration
from ._errors import ActorStoppedError
from ._kept import HistoryCache, KeptHistory
from ._ops import HISTORY_OPS, asks_estimates, run_task_op
from ._patterns import PatternCompiler
from ._schedule import FlushError, WriteSchedule, WriteTiming
from ._settings import TaskSettings
from ._tokens import TokenCounter
from .store import StateStore, TaskExtras

__all__ = ["TaskServices", "TaskSession"]

_log = structlog.get_logger("ctxwin.daemon.actors")

Result = dict[str, Any]


@dataclass(frozen=True)
class TaskServices:
    """What the daemon lends every task: its store, caches, counters and timing."""

    store: StateStore
    notices: engine.Notices
    tokens: TokenCounter
    histories: HistoryCache
    read_rules: engine.ReadRules
    writes: WriteTiming
    patterns: PatternCompiler = field(default_factory=PatternCompiler)


class TaskSession:
    """The state of one task id and everything a request of it runs.

    What the task holds beside its :class:`ctxwin.engine.TaskState` lives
    here for as long as the actor runs: its settings, its calibration and
    how long the history of its last op was. Its kept history
    (:class:`~._kept.KeptHistory`) is the history cache's entry, which an
    eviction empties while the task goes on.

    Args:
        task: the task id (already validated).
        ephemeral: keep the state in memory only; never load or write it.
        services: what the daemon lends every task.
        lost: called once the store lost the task's lease: the actor stops.
        stopping: whether the task's actor is stopping (no write retry then).
    """

    def __init__(
        self,
        task: str,
        ephemeral: bool,
        services: TaskServices,
        *,
        lost: Callable[[], None],
        stopping: Callable[[], bool],
    ) -> None:
        self.task = task
        self.settings = TaskSettings(task, ephemeral, services.read_rules, services.patterns)
        self._services = services
        self.store = services.store.open(task, self._ownership_lost)
        self._lost: str | None = None  # why the task's ownership was lost, once it was
        self._on_lost = lost
        self.state: engine.TaskState | None = None
        self.closed = False  # a close was answered: the actor takes no more requests
        # The task's own, for as long as its actor runs (stored with its state); the kept
        # history is the cache's entry, which an eviction empties while the task lives.
        self.calibration = TaskCalibration()
        self.kept = KeptHistory(task=task, cache=services.histories, tokens=services.tokens)
        # How many messages (internal ones in a native dialect) the last history op ran on;
        # None before one since the task was loaded (an eviction of the history keeps it).
        self.last_length: int | None = None
        self.writes = WriteSchedule(
            task=task,
            write=self._save,
            revision=self._revision,
            timing=services.writes,
            stopping=stopping,
        )

    @property
    def ephemeral(self) -> bool:
        """Whether the state is kept in memory only."""
        return self.settings.ephemeral

    # -- start and stop -------------------------------------------------------------

    async def start(self) -> None:
        """Load the task's state from its store (a new, empty one when ephemeral)."""
        if self.ephemeral:
            self.state = engine.TaskState(self._services.notices)
            stored: tuple[dict[str, Any], ...] = ()
        else:
            self.state, extras = await self.store.load()
            self.calibration.restore(extras.calibration)
            stored = extras.read_tools
        await self.settings.loaded(self.state, stored)
        self.kept.use_dialect(self.state.dialect)
        self.writes.loaded(self._revision())
        _log.info("actor_started", task=self.task, ephemeral=self.ephemeral)

    async def stop(self) -> bool:
        """Make the state durable before the task goes away, then give it up.

        Returns:
            False when the final write failed while this daemon owned the task.
        """
        self.writes.cancel()
        durable = True
        if not self.ephemeral and self.state is not None:
            try:
                await self.flush()
            except FlushError as exc:
                if self._lost is None:
                    durable = False
                    _log.error("final_flush_failed", task=self.task, error=str(exc))
                else:
                    _log.warning(
                        "unwritten_changes_dropped",
                        task=self.task,
                        reason=self._lost,
                        error=str(exc),
                    )
        if not self.ephemeral:
            await self.store.release()
        return durable

    def _ownership_lost(self, reason: str) -> None:
        """The store lost the task's lease: stop serving it now (the store refuses its writes)."""
        if self._lost is not None:
            return
        self._lost = reason
        _log.warning("ownership_lost", task=self.task, reason=reason)
        self._on_lost()  # later requests start a fresh actor, which asks the store

    # -- one request ----------------------------------------------------------------

    async def handle(self, op: str, args: dict[str, Any]) -> Result:
        """Run one request of the task: its settings first, then the op.

        Everything a request names is checked before anything is fixed by
        it; a refused request leaves the read tools it gave unset.

        Raises:
            ProtocolError: the request is refused (its error code says why).
            ActorStoppedError: this daemon no longer holds the task's lease.
            FlushError: a write the op waits for failed.
        """
        state = self.state
        assert state is not None
        settings = self.settings
        tools = saved = None
        try:
            if not settings.ephemeral and not self.store.serving():
                # The lease may have passed to another daemon: answer nothing more from here.
                self._ownership_lost("lease not renewed in time")
                raise ActorStoppedError(
                    f"task {self.task}: this daemon's lease on it lapsed; send the request again"
                )
            if op == "rollback" and await self._check_rollback(state, args):
                # Nothing to roll back: answered as SPEC.md's rollback of an empty task,
                # and the task is left as it was found (not loaded, nothing written).
                result = run_task_op(state, op, args)
                await _close(self)
                return result
            tools = await settings.wanted_tools(state, op, args)
            if args.get("ephemeral") is True and not settings.ephemeral:
                settings.become_ephemeral(state, lambda: self.dirty)
                self.writes.cancel()
            elif op != "inspect":
                settings.only_inspected = False
            if settings.check_dialect(state, op, args):
                self.kept.use_dialect(state.dialect)
            if tools is not None:
                saved = settings.tools()
                settings.use_tools(state, tools)
            own = _OWN_OPS.get(op)
            if own is not None:
                result = await own(self, args)
            elif op in HISTORY_OPS:
                result = await self._history_op(state, op, args)
            else:
                result = run_task_op(state, op, args)
        except Exception:
            if saved is not None:
                settings.restore(state, saved)
            self._changed()  # a failing op may still have changed the state
            raise
        self._changed()
        return result

    async def _check_rollback(self, state: engine.TaskState, args: dict[str, Any]) -> bool:
        """Check a rollback before anything is loaded or kept; whether it has nothing to act on.

        A task that holds nothing and was never used here (nothing stored, not
        loaded) has no updates to drop: a rollback without a checkpoint range
        answers as on an empty task (the conformance scenarios roll back new
        tasks) but leaves no actor and no file behind, as ``inspect`` leaves
        none; ``ctxwin rollback`` tells the user the task does not exist. With
        the range, it starts the task on that range. A range that reaches past
        the history the task was last sent is no checkpoint's range of it.

        Raises:
            ProtocolError: ``bad_request``, a range past the history.
        """
        if "deleted_range" not in args:
            return self.settings.only_inspected and _holds_nothing(self, state)
        deleted = args["deleted_range"]
        length = self.last_length
        if deleted is not None and length is not None and deleted[1] >= length:
            what = "internal messages" if state.dialect.native else "messages"
            raise proto.ProtocolError(
                proto.ErrorCode.BAD_REQUEST,
                f"rollback: deleted_range [{deleted[0]}, {deleted[1]}] reaches past the task's "
                f"history, which has {length} {what} (the last is {length - 1}); a checkpoint's "
                "range lies within the history it was taken on",
            )
        return False

    def settle(self) -> None:
        """Once the reply is out: hash what the request added (for the next one)."""
        self.kept.settle()

    async def _history_op(self, state: engine.TaskState, op: str, args: dict[str, Any]) -> Result:
        """An op over the task's history: the pipeline of the module's docstring."""
        kept = self.kept
        budgeted = _wants_budgeting(op, args)
        # 1. The history, 2. in the internal form.
        history = kept.resolve(args, keep=budgeted)
        mapped = kept.internal(op, history, args)
        if mapped is not None:
            self.last_length = len(mapped.internal)
        else:
            self.last_length = len(history.messages if history is not None else args["messages"])
        await _checkpoint(args)
        # 3. Token estimates, when asked for.
        budgeting = None
        if budgeted:
            assert history is not None
            budgeting = await self._budgeting(op, args, history, mapped)
        if op == "prepare_request":
            self.calibration.forget_estimate()
        # 4. The engine, on the messages it runs on (with their view cache).
        cache = None
        if mapped is not None:
            messages: Any = mapped.internal
            cache = mapped.cache
        elif history is not None:
            messages, cache = history.messages, history.cache
        else:
            messages = args["messages"]
        target, restarted = engine_target(state, op, args, history, mapped)
        revision = (target.revision, target.overlay.version)
        target.cache = cache
        try:
            result = run_task_op(target, op, {**args, "messages": messages}, budgeting)
        finally:
            target.cache = None  # a dropped history is not kept alive by the state
        if target is state:
            record_basis(state, revision, "deleted_range" in args, history, mapped, args)
        if restarted:
            result["restarted"] = True
        if op == "prepare_request":
            self.calibration.note_estimate(result)
        elif op == "condense":
            # The caller sends the condensed view: the next report is of it, not of the view
            # the request before the condense answered with.
            self.calibration.note_estimate({"estimated_tokens": result["tokens_after"]})
        await _checkpoint(args)
        # 5. The view as the caller's messages, a list or a patch (with the gaps of the
        # deleted set the view was made with, to a caller that applies them).
        return kept.view_back(state, op, args, result, history, mapped)

    async def _budgeting(
        self,
        op: str,
        args: dict[str, Any],
        history: engine.History,
        mapped: engine.MappedHistory | None,
    ) -> engine.Budgeting:
        """How the engine estimates for this request, with the task's calibration."""
        kept = self.kept
        tokens = self._services.tokens
        if mapped is None:
            # Count new messages off the event loop: a cold 1 MB history takes ~100 ms.
            await anyio.to_thread.run_sync(history.count_missing, tokens.count_message)
        if op == "prepare_request":
            self.calibration.calibrate(args.get("previous_request"))
        pricing = args.get("pricing")
        return engine.Budgeting(
            history.counter(tokens.count_message),
            self.calibration.ratio,
            args.get("strategy") or "default",
            bool(args.get("proactive", False)),
            fixed=0 if mapped is None else kept.kept_out_tokens(mapped),
            pricing=None if pricing is None else proto.sheet_from_wire(pricing),
        )

    # -- persistence -------------------------------------------------------------

    def _revision(self) -> int:
        """Grows with every change of what is stored: the state, or a calibration sample."""
        assert self.state is not None
        return self.state.revision + self.calibration.samples + self.settings.read_tool_changes

    def _extras(self) -> TaskExtras:
        assert self.state is not None
        return TaskExtras(
            self.calibration.stored(), self.state.dialect.name, self.settings.read_tools
        )

    async def _save(self) -> bool:
        assert self.state is not None
        return await self.store.save(self.state, self._extras())

    def _changed(self) -> None:
        if not self.settings.ephemeral:
            self.writes.changed()

    @property
    def dirty(self) -> bool:
        """Whether the state has changes that are not durable yet."""
        if self.ephemeral or self.state is None:
            return False
        if self._revision() != self.writes.durable_revision:
            return True
        return not self.store.is_current(self.state, self._extras())

    async def flush(self) -> bool:
        """Write the current state unless it is durable already.

        Returns:
            Whether anything was written.

        Raises:
            FlushError: the write failed (logged; a retry is scheduled).
        """
        if self.ephemeral or self.state is None:
            return False
        return await self.writes.flush()


_LONG_HISTORY = 10_000
"""Messages past which a request's pipeline hands the loop back between its steps."""


async def _checkpoint(args: dict[str, Any]) -> None:
    """Let other clients be answered between two steps of a long history's pipeline.

    Each step over 100,000 messages takes the loop for 50-200 ms; nothing
    between the steps leaves the state half-changed (the range and the
    basis it was made on are recorded in one step).
    """
    if len(args.get("messages") or ()) + len(args.get("append") or ()) > _LONG_HISTORY:
        await asyncio.sleep(0)


def _wants_budgeting(op: str, args: dict[str, Any]) -> bool:
    """Whether a request needs token estimates (``plan`` and ``condense`` always do)."""
    if op in ("plan", "condense"):
        return True
    return op == "prepare_request" and (asks_estimates(args) or bool(args.get("summaries")))


# The session's own ops ------------------------------------------------------


async def _inspect(session: TaskSession, args: dict[str, Any]) -> Result:
    """The task as it stands (the ``inspect`` op); given ``messages``, also the view a
    request with them would now get (:func:`~._basis.inspected_view`): inspecting changes
    nothing of what it looks at."""
    state = session.state
    assert state is not None
    result: Result = {
        "updates": state.dump_updates(),
        "deleted_range": state.deleted_range,
        "dirty": session.dirty,
        "calibration": session.calibration.wire(),
        "history": session.kept.kept_messages(),
        "read_tools": list(session.settings.read_tools),
        **session.store.describe(),
    }
    if session.settings.unused_tools:
        result["read_tools_unused"] = [list(item) for item in session.settings.unused_tools]
    if state.ledger.requests:
        result["cache"] = state.ledger.totals()
    if state.pricing is not None:
        result["pricing"] = state.pricing.wire()
    sources = session.kept.sources(state.overlay)
    if sources is not None:
        result["sources"] = sources
    if "messages" in args:
        result.update(inspected_view(state, args["messages"]))
        if "origins" not in result:
            # The Cline dialect's view is the history's own messages, less the range and
            # the deleted set (a restarted task's: all of them).
            length = len(args["messages"])
            origins = (
                list(range(length))
                if result.get("restarted")
                else engine.view_origins(length, state.deleted_range, state.dropped)
            )
            if len(origins) == len(result["view"]):
                result["origins"] = origins
    if state.dropped:
        result["dropped"] = [list(pair) for pair in state.dropped]
    if state.summaries:
        result["summaries"] = [summary.wire() for summary in state.summaries]
        shown = state.summary
        result["summary"] = None if shown is None else shown.wire()
    if session.settings.only_inspected and _holds_nothing(session, state):
        # Nothing stored, nothing sent: the task does not exist, and inspecting it
        # leaves no actor behind.
        result["exists"] = False
        await _close(session)
    return result


def _holds_nothing(session: TaskSession, state: engine.TaskState) -> bool:
    """Whether the task holds nothing a store would keep, nor a history."""
    return (
        state.empty
        and not session.dirty
        and not session.settings.read_tools
        and not session.settings.unused_tools
        and not state.ledger.requests
        and not state.summaries
        and session.calibration.samples == 0
        and session.kept.kept_messages() is None
    )


async def _flush(session: TaskSession, args: dict[str, Any]) -> Result:
    return {"flushed": int(await session.flush()), "loaded": True}


async def _close(session: TaskSession, args: dict[str, Any] | None = None) -> Result:
    if not session.ephemeral:
        await session.flush()
        await session.store.release()  # before the reply: the task is free once closed
    session.closed = True
    return {"closed": True, "loaded": True}


_OWN_OPS: dict[str, Callable[[TaskSession, dict[str, Any]], Awaitable[Result]]] = {
    "inspect": _inspect,
    "flush": _flush,
    "close": _close,
}
"""Task ops the session answers itself; every other one is the engine's (``_ops``)."""
