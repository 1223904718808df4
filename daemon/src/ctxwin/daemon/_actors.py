"""One actor per task: a bounded mailbox in front of the task's state.

Vocabulary after pykka: :meth:`TaskActor.tell` queues a message whose reply
goes to the ``reply`` object carried in the envelope (for wire requests, the
socket); :meth:`TaskActor.ask` returns a future instead. Hooks ``on_start``
(load the state in a worker thread), ``on_stop`` (final flush) and
``on_failure`` (log). On stop the mailbox is drained and every pending
request is answered with :class:`ActorStoppedError`, never left silent.

The actor only receives, dispatches and stops: what it keeps of the history
is a :class:`~._kept.KeptHistory`, when it writes is a
:class:`~._schedule.WriteSchedule`, and where the state lives is the
:class:`~.store.TaskStore` both load and write through.

Requests of one task run in order; different tasks run concurrently. The
mailbox is a deque plus an event rather than an anyio memory stream: one hop
costs about 10 us against about 50 us measured for the stream.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import structlog

from ctxwin import engine, proto

from ._kept import HistoryCache, KeptHistory
from ._ops import HISTORY_OPS, run_task_op
from ._schedule import FlushError, WriteSchedule
from ._tokens import TokenCounter
from .store import StateStore, StoreUnavailableError, TaskExtras

__all__ = [
    "ActorStoppedError",
    "ActorSystem",
    "BusyError",
    "Counters",
    "ReplyTo",
    "TaskActor",
]

_log = structlog.get_logger("ctxwin.daemon.actors")

COMPACT_MAX_TASKS = 100_000
"""Above this many known task ids they are not compacted (about 37 ms per 100000)."""


class BusyError(Exception):
    """The task's mailbox is full; the client should retry later."""


class ActorStoppedError(Exception):
    """The task's actor stopped before it could handle this request; send it again."""


class ReplyTo(Protocol):
    """Where a request's outcome goes: an asyncio future or the wire."""

    def set_result(self, result: dict[str, Any], /) -> None:
        """Deliver the result map."""

    def set_exception(self, exc: BaseException, /) -> None:
        """Deliver a failure."""


@dataclass
class Counters:
    """Mutable counters behind the ``stats`` op."""

    flushes: int = 0
    write_failures: int = 0


class _Stop:
    """The message that stops an actor once everything before it was handled."""


_STOP = _Stop()


class Envelope:
    """A message in a mailbox and where its reply goes."""

    # __slots__: one envelope per request.
    __slots__ = ("args", "op", "reply")

    def __init__(self, op: str | _Stop, args: dict[str, Any], reply: ReplyTo | None) -> None:
        self.op = op
        self.args = args
        self.reply = reply


_CLINE_READ_TOOLS = (
    "read_tools applies to the native dialects; the cline dialect recognises a read "
    "by its result's header (SPEC.md §6)"
)


class TaskActor:
    """The actor of one task id.

    Args:
        system: the actor system that owns it.
        task: the task id (already validated).
        ephemeral: keep the state in memory only; never load or write it.
    """

    def __init__(self, system: ActorSystem, task: str, ephemeral: bool) -> None:
        self.system = system
        self.task = task
        self.ephemeral = ephemeral
        self._only_inspected = True  # every request so far was an inspect (see _become_ephemeral)
        self.store = system.store.open(task, self._ownership_lost)
        self._lost: str | None = None  # why the task's ownership was lost, once it was
        self._dialect_fixed = False  # the task's dialect is fixed at its first use
        # The task's own read tools (wire form) and the tools built from them.
        self._read_tools: tuple[dict[str, Any], ...] = ()
        self._own_tools: tuple[engine.ReadTool, ...] = ()
        self._read_tool_changes = 0  # counted in the revision: they are stored
        # Stored tools that no longer build: [position, reason], kept aside, never run.
        self._unused_tools: tuple[tuple[int, str], ...] = ()
        self.state: engine.TaskState | None = None
        self.mailbox: deque[Envelope] = deque()
        self._wakeup = asyncio.Event()
        self.done = asyncio.Event()
        self.stopping = False
        self._closed = False
        self.handling = False
        self.idle_since = system.loop.time()
        self.kept = KeptHistory(task=task, cache=system.histories, tokens=system.tokens)
        self.writes = WriteSchedule(
            task=task,
            write=self._save,
            revision=self._revision,
            loop=system.loop,
            spawn=system.spawn,
            counters=system.counters,
            debounce_s=system.debounce_s,
            debounce_max_s=system.debounce_max_s,
            stopping=lambda: self.stopping,
        )

    # -- pykka-style API ------------------------------------------------------

    def tell(
        self, op: str, args: dict[str, Any], reply: ReplyTo | None, force: bool = False
    ) -> None:
        """Queue a message; its outcome goes to ``reply``.

        Raises:
            BusyError: the mailbox holds ``mailbox_size`` messages already.
            ActorStoppedError: the actor no longer takes messages.
        """
        if self.stopping:
            raise ActorStoppedError(f"task {self.task} is stopping")
        if not force and len(self.mailbox) >= self.system.mailbox_size:
            raise BusyError(
                f"task {self.task} has {len(self.mailbox)} requests queued; retry later"
            )
        self.mailbox.append(Envelope(op, args, reply))
        self._wakeup.set()

    def ask(self, op: str, args: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
        """Queue a message (past the mailbox bound) and return a future of its result."""
        future: asyncio.Future[dict[str, Any]] = self.system.loop.create_future()
        self.tell(op, args, future, force=True)
        return future

    def stop(self) -> None:
        """Stop once every message queued before this one was handled."""
        if not self.stopping:
            self.mailbox.append(Envelope(_STOP, {}, None))
            self.stopping = True
            self._wakeup.set()

    # -- hooks ---------------------------------------------------------------

    async def on_start(self) -> None:
        """Load the task's state from its store (a new, empty one when ephemeral)."""
        if self.ephemeral:
            self.state = engine.TaskState(self.system.notices)
        else:
            self.state, extras = await self.store.load()
            if extras.calibration is not None:
                calibration = self.kept.calibration
                calibration.ratio, calibration.samples = extras.calibration
            self._load_read_tools(extras.read_tools)
        state = self.state
        # A stored task has its dialect already; a new one gets it from its first call.
        self._dialect_fixed = not state.empty
        state.set_dialect(state.dialect, self._reads(state.dialect.name))
        self.kept.use_dialect(state.dialect)
        self.writes.loaded(self._revision())
        _log.info("actor_started", task=self.task, ephemeral=self.ephemeral)

    async def on_stop(self) -> None:
        """Make the state durable before the actor goes away, then give up the task."""
        self.writes.cancel()
        if not self.ephemeral and self.state is not None:
            try:
                await self.flush()
            except FlushError as exc:
                if self._lost is None:
                    self.system.final_flush_failures += 1
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

    def _ownership_lost(self, reason: str) -> None:
        """The store lost the task's lease: stop serving it now (the store refuses its writes)."""
        if self._lost is not None:
            return
        self._lost = reason
        _log.warning("ownership_lost", task=self.task, reason=reason)
        self.system.detach(self)  # later requests start a fresh actor, which asks the store
        self.stop()

    def on_failure(self, exc: BaseException) -> None:
        """Log an unexpected failure of the actor itself."""
        _log.error("actor_failed", task=self.task, error_type=type(exc).__name__, exc_info=exc)

    # -- the loop: receive, dispatch, stop ------------------------------------------

    async def run(self, previous: asyncio.Event | None) -> None:
        """The actor's life: wait for its predecessor, start, handle messages, stop."""
        failure: BaseException | None = None
        started = False
        try:
            if previous is not None:
                await previous.wait()
            await self.on_start()
            started = True
            while not self._closed:
                while not self.mailbox:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                envelope = self.mailbox.popleft()
                if isinstance(envelope.op, _Stop):
                    break
                self.handling = True
                try:
                    await self._handle(envelope)
                finally:
                    self.handling = False
                    self.idle_since = self.system.loop.time()
        except Exception as exc:
            failure = exc
            self.on_failure(exc)
        finally:
            self.stopping = True
            self.system.detach(self)
            if started:
                await self.on_stop()
            self._drain(failure)
            self.done.set()
            self.system.forget(self)
            _log.info("actor_stopped", task=self.task)

    def _drain(self, failure: BaseException | None) -> None:
        while self.mailbox:
            envelope = self.mailbox.popleft()
            if envelope.reply is None:
                continue
            if isinstance(failure, proto.ProtocolError):
                envelope.reply.set_exception(failure)  # owned_elsewhere, say
            elif isinstance(failure, StoreUnavailableError):
                envelope.reply.set_exception(BusyError(f"task {self.task}: {failure}"))
            elif failure is not None:
                envelope.reply.set_exception(
                    FlushError(f"task {self.task} failed to start: {failure}")
                    if self.state is None
                    else failure
                )
            else:
                envelope.reply.set_exception(
                    ActorStoppedError(f"task {self.task} was stopped; send the request again")
                )

    async def _handle(self, envelope: Envelope) -> None:
        """Run one request and deliver its outcome."""
        state = self.state
        assert state is not None
        assert isinstance(envelope.op, str)
        op, args, reply = envelope.op, envelope.args, envelope.reply
        tools: tuple[tuple[dict[str, Any], ...], tuple[engine.ReadTool, ...]] | None = None
        before = self._read_tools, self._own_tools
        unused_before = self._unused_tools
        try:
            if not self.ephemeral and not self.store.serving():
                # The lease may have passed to another daemon: answer nothing more from here.
                self._ownership_lost("lease not renewed in time")
                raise ActorStoppedError(
                    f"task {self.task}: this daemon's lease on it lapsed; send the request again"
                )
            # Everything a request names is checked before anything is fixed by it.
            tools = self._wanted_tools(state, op, args)
            if args.get("ephemeral") is True and not self.ephemeral:
                self._become_ephemeral(state)
            elif op != "inspect":
                self._only_inspected = False
            self._check_dialect(state, op, args)
            if tools is not None:
                self._use_tools(state, *tools)
            own = _OWN_OPS.get(op)
            if own is not None:
                result = await own(self)
            elif op in HISTORY_OPS:
                result = await self.kept.run(state, op, args)
            else:
                result = run_task_op(state, op, args)
        except Exception as exc:
            if tools is not None and (self._read_tools, self._own_tools) != before:
                self._use_tools(state, *before)  # a refused request leaves its tools unset
                self._unused_tools = unused_before
            self._changed()  # a failing op may still have changed the state
            if reply is not None:
                reply.set_exception(exc)
            self.kept.settle()
            return
        self._changed()
        if reply is not None:
            reply.set_result(result)
        self.kept.settle()  # after the reply: what it hashes is for the next request

    # -- the actor's own ops ---------------------------------------------------------

    async def _inspect(self) -> dict[str, Any]:
        state = self.state
        assert state is not None
        calibration = self.kept.calibration
        result: dict[str, Any] = {
            "updates": state.dump_updates(),
            "deleted_range": state.deleted_range,
            "dirty": self.dirty,
            "calibration": {"ratio": calibration.ratio, "samples": calibration.samples},
            "history": self.kept.kept_messages(),
            "read_tools": list(self._read_tools),
            **self.store.describe(),
        }
        if self._unused_tools:
            result["read_tools_unused"] = [list(item) for item in self._unused_tools]
        if state.ledger.requests:
            result["cache"] = state.ledger.totals()
        if state.pricing is not None:
            result["pricing"] = state.pricing.wire()
        sources = self.kept.sources(state.overlay)
        if sources is not None:
            result["sources"] = sources
        if state.summaries:
            result["summaries"] = [summary.wire() for summary in state.summaries]
            shown = state.summary
            result["summary"] = None if shown is None else shown.wire()
        if self._only_inspected and self._holds_nothing(state):
            # Nothing stored, nothing sent: the task does not exist, and inspecting it
            # leaves no actor behind.
            result["exists"] = False
            await self._close()
        return result

    def _holds_nothing(self, state: engine.TaskState) -> bool:
        """Whether the task holds nothing a store would keep, nor a history."""
        return (
            state.empty
            and not self.dirty
            and not self._read_tools
            and not self._unused_tools
            and not state.ledger.requests
            and not state.summaries
            and self.kept.calibration.samples == 0
            and self.kept.kept_messages() is None
        )

    async def _flush_op(self) -> dict[str, Any]:
        return {"flushed": int(await self.flush()), "loaded": True}

    async def _close(self) -> dict[str, Any]:
        if not self.ephemeral:
            await self.flush()
            await self.store.release()  # before the reply: the task is free once closed
        # Detach now: later requests for this task start a fresh actor.
        self.stopping = True
        self.system.detach(self)
        self._closed = True
        return {"closed": True, "loaded": True}

    def _check_dialect(self, state: engine.TaskState, op: str, args: dict[str, Any]) -> None:
        """Fix the task's dialect at its first use; refuse a call that names another.

        Raises:
            ProtocolError: ``bad_request`` when the call's ``dialect`` is not the task's.
        """
        asked = args.get("dialect")
        if asked is not None and asked != state.dialect.name:
            if self._dialect_fixed:
                raise proto.ProtocolError(
                    proto.ErrorCode.BAD_REQUEST,
                    f"{op}: task {self.task} has dialect {state.dialect.name!r}, not {asked!r} "
                    "(a task's dialect is fixed at its first use; close it, or use another "
                    "task id)",
                )
            if asked == engine.CLINE and self._own_tools:
                raise proto.ProtocolError(proto.ErrorCode.BAD_REQUEST, f"{op}: {_CLINE_READ_TOOLS}")
            state.set_dialect(engine.get_dialect(asked), self._reads(asked))
            self.kept.use_dialect(state.dialect)
        if op != "inspect":
            self._dialect_fixed = True

    def _reads(self, dialect: str) -> engine.ReadRules | None:
        return self.system.reads_for(dialect, self._own_tools)

    def _load_read_tools(self, stored: tuple[dict[str, Any], ...]) -> None:
        """Take the stored read tools; each one that no longer builds is kept aside, not used.

        A pattern RE2 refuses (a backreference, one too long) is such a tool:
        the log and ``inspect``'s ``read_tools_unused`` name it and the reason.
        """
        self._read_tools = stored
        built = []
        unused = []
        for position, item in enumerate(stored):
            try:
                built.append(engine.read_tool_from_config(item))
            except ValueError as exc:
                unused.append((position, str(exc)))
                _log.warning(
                    "stored_read_tools_unused", task=self.task, tool=position, error=str(exc)
                )
        self._own_tools = tuple(built)
        self._unused_tools = tuple(unused)

    def _wanted_tools(
        self, state: engine.TaskState, op: str, args: dict[str, Any]
    ) -> tuple[tuple[dict[str, Any], ...], tuple[engine.ReadTool, ...]] | None:
        """The read tools a request gives, built; None when it gives none or the ones in use.

        Raises:
            ProtocolError: ``bad_request`` naming the tool that is not of the
                configuration form, or for a task of the Cline dialect.
        """
        asked = args.get("read_tools")
        if asked is None:
            return None
        wanted = tuple(asked)
        if wanted == self._read_tools and len(self._own_tools) == len(wanted):
            return None
        built = []
        for position, item in enumerate(wanted):
            try:
                built.append(engine.read_tool_from_config(item))
            except ValueError as exc:
                raise proto.ProtocolError(
                    proto.ErrorCode.BAD_REQUEST, f"{op}: read_tools[{position}]: {exc}"
                ) from None
        dialect = args.get("dialect") or state.dialect.name
        if built and dialect == engine.CLINE:
            raise proto.ProtocolError(proto.ErrorCode.BAD_REQUEST, f"{op}: {_CLINE_READ_TOOLS}")
        return wanted, tuple(built)

    def _use_tools(
        self,
        state: engine.TaskState,
        wanted: tuple[dict[str, Any], ...],
        built: tuple[engine.ReadTool, ...],
    ) -> None:
        """Make these the task's own read tools (besides the daemon's table)."""
        self._read_tools, self._own_tools = wanted, built
        self._unused_tools = ()  # every tool sent was built
        self._read_tool_changes += 1
        state.set_dialect(state.dialect, self._reads(state.dialect.name))

    def _become_ephemeral(self, state: engine.TaskState) -> None:
        """Keep the task in memory only from now on, as a request asks, if nothing is lost.

        An actor that so far only answered ``inspect`` (someone looked at an
        ephemeral task after its idle eviction, say) for a task with nothing
        stored is taken over. Any other persistent task is in use as one, with
        state or soon to have it, and is not.

        Raises:
            ProtocolError: ``bad_request`` when the task is in use as a persistent one.
        """
        if (
            not self._only_inspected
            or state.deleted_range is not None
            or state.dump_updates()
            or self.dirty
        ):
            raise proto.ProtocolError(
                proto.ErrorCode.BAD_REQUEST,
                f"task {self.task} is open as a persistent task; ephemeral applies only to "
                "a new task (close it first, or use another task id)",
            )
        self.ephemeral = True
        self.writes.cancel()
        _log.info("actor_made_ephemeral", task=self.task)

    # -- persistence -------------------------------------------------------------

    def _revision(self) -> int:
        """Grows with every change of what is stored: the state, or a calibration sample."""
        assert self.state is not None
        return self.state.revision + self.kept.calibration.samples + self._read_tool_changes

    def _extras(self) -> TaskExtras:
        calibration = self.kept.calibration
        pair = (calibration.ratio, calibration.samples) if calibration.samples else None
        assert self.state is not None
        return TaskExtras(pair, self.state.dialect.name, self._read_tools)

    async def _save(self) -> bool:
        assert self.state is not None
        return await self.store.save(self.state, self._extras())

    def _changed(self) -> None:
        if not self.ephemeral:
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

    def is_idle(self, now: float, timeout: float) -> bool:
        """Whether the actor has had nothing to do for ``timeout`` seconds."""
        return (
            not self.handling
            and not self.mailbox
            and not self.stopping
            and self.state is not None
            and now - self.idle_since >= timeout
        )


_OWN_OPS: dict[str, Callable[[TaskActor], Awaitable[dict[str, Any]]]] = {
    "inspect": TaskActor._inspect,
    "flush": TaskActor._flush_op,
    "close": TaskActor._close,
}
"""Task ops the actor answers itself; every other one is the engine's."""


class ActorSystem:
    """The registry of task actors.

    Args:
        store: where task states are loaded from and written to.
        notices: notice texts for new (and ephemeral) task states.
        mailbox_size: bound of every mailbox.
        debounce_ms: write delay after the last change.
        debounce_max_ms: latest write after the first unwritten change.
        idle_timeout: seconds after which an idle actor stops.
        spawn: starts a coroutine function in the daemon's task group.
        counters: the daemon's counters.
        max_tasks: most actors held at once (running and stopping); a request
            for another task past it is answered ``busy``.
    """

    def __init__(
        self,
        *,
        store: StateStore,
        notices: engine.Notices,
        mailbox_size: int,
        debounce_ms: int,
        debounce_max_ms: int,
        idle_timeout: float,
        spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], None],
        counters: Counters,
        tokens: TokenCounter,
        history_cache_bytes: int,
        read_rules: engine.ReadRules = engine.DEFAULT_READ_RULES,
        max_tasks: int = 10_000,
    ) -> None:
        self.store = store
        self.max_tasks = max_tasks
        self.notices = notices
        self.mailbox_size = mailbox_size
        self.debounce_s = debounce_ms / 1000
        self.debounce_max_s = debounce_max_ms / 1000
        self.idle_timeout = idle_timeout
        self.spawn = spawn
        self.counters = counters
        self.tokens = tokens
        self.histories = HistoryCache(history_cache_bytes)
        self.read_rules = read_rules
        self.loop = asyncio.get_running_loop()
        self.actors: dict[str, TaskActor] = {}
        self._stopping: dict[str, TaskActor] = {}
        self.known_tasks: set[str] = set()
        self.started = 0  # actors started since the daemon started
        self.final_flush_failures = 0
        self.accepting = True

    def reads_for(
        self, dialect: str, own: tuple[engine.ReadTool, ...] = ()
    ) -> engine.ReadRules | None:
        """The read tools a task of ``dialect`` counts (None: Cline's own rules, SPEC.md §6).

        ``own``: the task's own tools (``read_tools``), counted besides the daemon's.
        """
        if dialect == engine.CLINE:
            return None
        return self.read_rules.extended(own) if own else self.read_rules

    def compact_known_tasks(self, limit: int = COMPACT_MAX_TASKS) -> bool:
        """Re-create the ids of stopped tasks that ``known_tasks`` keeps.

        Each id was decoded from a request in the middle of that request's
        allocations, so after the actors stop, a few dozen bytes still pin each
        of CPython's 1 MiB object arenas the actors filled: measured, 72 arenas
        after 5000 actors stopped against 21 before. The ids go into one string,
        the old ones are freed (and with them most of those arenas), then they are
        split again into the arenas still in use. Skipped above 100000 ids, where
        it would hold up the event loop for more than about 40 ms.
        """
        if len(self.known_tasks) > limit:
            return False
        live = self.actors
        known = self.known_tasks
        joined = "\n".join(task for task in known if task not in live)  # "\n" is never in an id
        kept = {task for task in known if task in live}
        self.known_tasks = kept
        del known
        if joined:
            kept.update(joined.split("\n"))
        return True

    def get(self, task: str) -> TaskActor | None:
        """The running actor of ``task``, if any."""
        return self.actors.get(task)

    def actor_for(self, task: str, ephemeral: bool = False) -> TaskActor:
        """The actor of ``task``, started on first use.

        Raises:
            ActorStoppedError: the daemon is shutting down.
            BusyError: ``max_tasks`` actors are held already.
        """
        actor = self.actors.get(task)
        if actor is not None:
            return actor
        if not self.accepting:
            raise ActorStoppedError("the daemon is shutting down")
        held = len(self.actors) + len(self._stopping)
        if held >= self.max_tasks:
            raise BusyError(
                f"task {task}: this daemon holds {held} tasks, its limit (max_tasks); "
                "retry once idle ones stop, or close tasks no longer in use"
            )
        actor = TaskActor(self, task, ephemeral)
        previous = self._stopping.get(task)
        self.actors[task] = actor
        self.known_tasks.add(task)
        self.started += 1

        async def run() -> None:
            await actor.run(previous.done if previous is not None else None)

        self.spawn(run)
        return actor

    def detach(self, actor: TaskActor) -> None:
        """Take a stopping actor out of the registry; it stays known until done."""
        if self.actors.get(actor.task) is actor:
            del self.actors[actor.task]
            self._stopping[actor.task] = actor

    def forget(self, actor: TaskActor) -> None:
        """Drop a stopped actor."""
        self.histories.forget(actor.kept)
        if self.actors.get(actor.task) is actor:
            del self.actors[actor.task]
        if self._stopping.get(actor.task) is actor:
            del self._stopping[actor.task]

    def stopping_actor(self, task: str) -> TaskActor | None:
        """An actor of ``task`` that is stopping, if any."""
        return self._stopping.get(task)

    async def flush_all(self) -> int:
        """Make every task durable, each after the requests queued before.

        Returns:
            How many tasks were written.

        Raises:
            FlushError: some task could not be written (all are tried).
        """
        futures = [
            (actor.task, actor.ask("flush", {}))
            for actor in list(self.actors.values())
            if not actor.ephemeral and not actor.stopping
        ]
        waits = [actor.done.wait() for actor in list(self._stopping.values())]
        written = 0
        failures: list[str] = []
        for task, future in futures:
            try:
                written += int((await future)["flushed"])
            except FlushError as exc:
                failures.append(str(exc))
            except ActorStoppedError:
                pass  # it flushed when it stopped
            except Exception as exc:
                failures.append(f"task {task}: {type(exc).__name__}")
        for wait in waits:
            await wait
        if failures:
            raise FlushError("; ".join(failures))
        return written

    async def reap_idle(self) -> None:
        """Stop actors idle for longer than the idle timeout, forever (runs as a task)."""
        interval = max(0.02, min(self.idle_timeout / 4, 5.0))
        while True:
            await anyio.sleep(interval)
            now = self.loop.time()
            for actor in list(self.actors.values()):
                if not actor.is_idle(now, self.idle_timeout):
                    continue
                if actor.dirty:
                    # Never stop with unwritten changes: write first, stop next round.
                    # After a failed write its own back-off timer retries, not this loop.
                    actor.writes.write_soon()
                    continue
                self.detach(actor)
                actor.stop()

    async def stop_all(self, grace: float) -> None:
        """Stop every actor after the messages already queued; wait up to ``grace`` seconds."""
        self.accepting = False
        actors = list(self.actors.values()) + list(self._stopping.values())
        for actor in actors:
            actor.stop()
        with anyio.move_on_after(grace):
            for actor in actors:
                await actor.done.wait()

    def statistics(self) -> dict[str, Any]:
        """Counts for ``stats``: tasks, actors, kept histories and calibration."""
        ratios = sorted(
            actor.kept.calibration.ratio
            for actor in self.actors.values()
            if actor.kept.calibration.samples > 0
        )
        ledgers = [
            actor.state.ledger
            for actor in self.actors.values()
            if actor.state is not None and actor.state.ledger.requests
        ]
        cache = {
            "tasks": len(ledgers),
            "requests": sum(ledger.requests for ledger in ledgers),
            "cached_tokens": sum(ledger.cached_tokens for ledger in ledgers),
            "written_tokens": sum(ledger.written_tokens for ledger in ledgers),
            "cost": round(sum(ledger.cost for ledger in ledgers), 3),
            "keep_all_cost": round(sum(ledger.keep_all_cost for ledger in ledgers), 3),
        }
        return {
            "cache": cache,
            "tasks": len(self.known_tasks),
            "actors": len(self.actors),
            "histories": len(self.histories),
            "history_bytes": self.histories.total,
            "calibrated_tasks": len(ratios),
            "calibration_median": ratios[len(ratios) // 2] if ratios else None,
        }
