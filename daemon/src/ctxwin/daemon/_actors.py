"""Actors: a bounded mailbox in front of each task's session, and the registry of them.

Vocabulary after pykka: :meth:`Actor.tell` queues a message whose reply
goes to the ``reply`` object carried in the envelope (for wire requests, the
socket); :meth:`Actor.ask` returns a future instead. Hooks ``on_start``
(the session loads the state), ``on_stop`` (its final flush) and
``on_failure`` (log). On stop the mailbox is drained and every pending
request is answered with :class:`ActorStoppedError`, never left silent.

The actor only receives, runs and stops: what a message does is its
:class:`~._session.TaskSession`'s. :class:`ActorSystem` starts an actor on a
task's first request, reaps idle ones, and decides once how ``flush`` and
``close`` reach a task that is running, stopping or not loaded.

Requests of one task run in order; different tasks run concurrently. The
mailbox is a deque plus an event rather than an anyio memory stream: one hop
costs about 10 us against about 50 us measured for the stream.

Shares: each actor belongs to the client that opened it (the connection's
name, ``key:NAME`` or ``uid:N``, see ``_auth.py``). Past ``max_tasks`` a
client's new task is admitted by stopping an idle, written task of the client
that holds the most tasks when that client holds more than its share
(``max_tasks`` over the clients holding tasks); a client at or over its own
share is answered ``busy``. So one client can fill an idle daemon, and
another can still open tasks at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import structlog

from ctxwin import engine, proto

from ._errors import ActorStoppedError, BusyError
from ._kept import HistoryCache
from ._schedule import FlushError, WriteTiming
from ._session import TaskServices, TaskSession
from ._tokens import TokenCounter
from .store import Spawn, StateStore, StoreUnavailableError

__all__ = [
    "Actor",
    "ActorStoppedError",
    "ActorSystem",
    "BusyError",
    "Counters",
    "ReplyTo",
]

_log = structlog.get_logger("ctxwin.daemon.actors")


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


class Actor:
    """The mailbox of one task id, in front of its session.

    Args:
        system: the actor system that owns it.
        task: the task id (already validated).
        ephemeral: keep the state in memory only; never load or write it.
    """

    def __init__(self, system: ActorSystem, task: str, ephemeral: bool, owner: str) -> None:
        self.system = system
        self.task = task
        self.owner = owner
        self.session = TaskSession(
            task, ephemeral, system.services, lost=self._lost, stopping=lambda: self.stopping
        )
        self.session.kept.owner = owner
        self.mailbox: deque[Envelope] = deque()
        self._wakeup = asyncio.Event()
        self.done = asyncio.Event()
        self.stopping = False
        self.handling = False
        self.idle_since = system.loop.time()

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
        """Load the task's state (a new, empty one when ephemeral)."""
        await self.session.start()

    async def on_stop(self) -> None:
        """Make the state durable before the actor goes away, then give up the task."""
        if not await self.session.stop():
            self.system.final_flush_failures += 1

    def _lost(self) -> None:
        """The task's lease is lost: stop serving it now."""
        self.system.detach(self)  # later requests start a fresh actor, which asks the store
        self.stop()

    def on_failure(self, exc: BaseException) -> None:
        """Log an unexpected failure of the actor itself."""
        _log.error("actor_failed", task=self.task, error_type=type(exc).__name__, exc_info=exc)

    # -- the loop: receive, run, stop ------------------------------------------------

    async def run(self, previous: asyncio.Event | None) -> None:
        """The actor's life: wait for its predecessor, start, handle messages, stop."""
        failure: BaseException | None = None
        started = False
        try:
            if previous is not None:
                await previous.wait()
            await self.on_start()
            started = True
            while not self.session.closed:
                while not self.mailbox:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                envelope = self.mailbox.popleft()
                if isinstance(envelope.op, _Stop):
                    break
                self.handling = True
                try:
                    # Awaited here, not in a coroutine of its own: one hop costs one less.
                    try:
                        result = await self.session.handle(envelope.op, envelope.args)
                    except Exception as exc:
                        self._deliver(envelope.reply, None, exc)
                    else:
                        self._deliver(envelope.reply, result, None)
                finally:
                    self.handling = False
                    self.idle_since = self.system.loop.time()
                    self.system.used(self)
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
                    if self.session.state is None
                    else failure
                )
            else:
                envelope.reply.set_exception(
                    ActorStoppedError(f"task {self.task} was stopped; send the request again")
                )

    def _deliver(
        self, reply: ReplyTo | None, result: dict[str, Any] | None, exc: Exception | None
    ) -> None:
        """Deliver a request's outcome, then have the session settle what it added."""
        session = self.session
        if session.closed:
            # Detach before the reply: later requests for this task start a fresh actor.
            self.stopping = True
            self.system.detach(self)
        if exc is not None:
            if reply is not None:
                reply.set_exception(exc)
        else:
            assert result is not None
            if reply is not None:
                reply.set_result(result)
        session.settle()  # after the reply: what it hashes is for the next request

    def is_idle(self, now: float, timeout: float) -> bool:
        """Whether the actor has had nothing to do for ``timeout`` seconds."""
        return (
            not self.handling
            and not self.mailbox
            and not self.stopping
            and self.session.state is not None
            and now - self.idle_since >= timeout
        )


class ActorSystem:
    """The registry of task actors: started on first use, reaped when idle, stopped at
    shutdown; :meth:`flush` and :meth:`close` reach a task whatever its actor's state.

    Args:
        store: where task states are loaded from and written to.
        notices: notice texts for new (and ephemeral) task states.
        mailbox_size: bound of every mailbox.
        debounce_ms: write delay after the last change.
        debounce_max_ms: latest write after the first unwritten change.
        idle_timeout: seconds after which an idle actor stops.
        spawn: starts a coroutine function in the daemon's task group.
        counters: the daemon's counters.
        tokens: the token counter for estimates.
        history_cache_bytes: the cap of the kept histories' resident size.
        read_rules: the daemon's read tools, which native dialects count.
        max_tasks: most actors held at once (running and stopping); a request
            for another task past it takes an idle task of a client over its
            share, or is answered ``busy``.
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
        spawn: Spawn,
        counters: Counters,
        tokens: TokenCounter,
        history_cache_bytes: int,
        read_rules: engine.ReadRules = engine.DEFAULT_READ_RULES,
        max_tasks: int = 10_000,
    ) -> None:
        self.store = store
        self.max_tasks = max_tasks
        self.mailbox_size = mailbox_size
        self.idle_timeout = idle_timeout
        self.spawn = spawn
        self.counters = counters
        self.histories = HistoryCache(history_cache_bytes)
        self.loop = asyncio.get_running_loop()
        self.services = TaskServices(
            store=store,
            notices=notices,
            tokens=tokens,
            histories=self.histories,
            read_rules=read_rules,
            writes=WriteTiming(
                loop=self.loop,
                spawn=spawn,
                counters=counters,
                debounce_s=debounce_ms / 1000,
                debounce_max_s=debounce_max_ms / 1000,
            ),
        )
        self.actors: dict[str, Actor] = {}
        self._stopping: dict[str, Actor] = {}
        # client -> its actors (running and stopping), least recently used first
        self.owned: dict[str, dict[Actor, None]] = {}
        self._making_room: set[Actor] = set()  # stopped to admit another client's task
        self.evicted = 0  # actors stopped to make room for another client
        self.known_tasks: set[str] = set()
        self.started = 0  # actors started since the daemon started
        self.final_flush_failures = 0
        self.accepting = True

    def actor_for(self, task: str, ephemeral: bool = False, client: str = "?") -> Actor:
        """The actor of ``task``, started on first use (owned by ``client``).

        Raises:
            ActorStoppedError: the daemon is shutting down.
            BusyError: ``max_tasks`` actors are held already, and ``client``
                holds its share or no other client has an idle task over its share.
        """
        actor = self.actors.get(task)
        if actor is not None:
            return actor
        if not self.accepting:
            raise ActorStoppedError("the daemon is shutting down")
        held = len(self.actors) + len(self._stopping) - len(self._making_room)
        if held >= self.max_tasks:
            self._make_room(task, client, held)
        actor = Actor(self, task, ephemeral, client)
        self.owned.setdefault(client, {})[actor] = None
        previous = self._stopping.get(task)
        self.actors[task] = actor
        self.known_tasks.add(task)
        self.started += 1

        async def run() -> None:
            await actor.run(previous.done if previous is not None else None)

        self.spawn(run)
        return actor

    def share(self, client: str) -> int:
        """The tasks ``client`` may hold when the daemon is full: ``max_tasks`` over the
        clients holding tasks (``client`` counted)."""
        clients = len(self.owned) + (client not in self.owned)
        return max(1, self.max_tasks // clients)

    def _make_room(self, task: str, client: str, held: int) -> None:
        """Stop the least recently used idle task of the client furthest over its share.

        Raises:
            BusyError: ``client`` holds its share already, or no client over its
                share has an idle task with nothing left to write.
        """
        share = self.share(client)
        mine = len(self.owned.get(client, ()))
        if mine >= share:
            raise BusyError(
                f"task {task}: this daemon holds {held} tasks, its limit (max_tasks), and "
                f"this client ({client}) holds {mine}, its share; close tasks no longer "
                "in use, or retry once idle ones stop"
            )
        # Room being made (actors still stopping) is bounded: a slow disk must not
        # let admissions outrun the stops.
        if len(self._making_room) < max(16, self.max_tasks // 8):
            for owner, actors in sorted(self.owned.items(), key=lambda item: -len(item[1])):
                if len(actors) <= share:
                    break
                victim = self._idle_of(actors)
                if victim is not None:
                    self.evicted += 1
                    self._making_room.add(victim)
                    _log.info(
                        "task_evicted",
                        task=victim.task,
                        owner=owner,
                        held=len(actors),
                        share=share,
                        reason=f"room for a task of {client}",
                    )
                    self.detach(victim)
                    victim.stop()
                    return
        raise BusyError(
            f"task {task}: this daemon holds {held} tasks, its limit (max_tasks), and no "
            "client over its share has an idle task to give up; retry once idle ones stop"
        )

    def used(self, actor: Actor) -> None:
        """``actor`` handled a message: it goes last in its client's order (least recently
        used first; a dict's delete and insert, about 0.1 us)."""
        owned = self.owned.get(actor.owner)
        if owned is not None and actor in owned:
            del owned[actor]
            owned[actor] = None

    def _idle_of(self, actors: dict[Actor, None]) -> Actor | None:
        """The least recently used of ``actors`` that may stop now: idle, nothing unwritten."""
        for actor in actors:
            if not (
                actor.stopping
                or actor.handling
                or actor.mailbox
                or actor.session.state is None
                or actor.session.dirty
            ):
                return actor
        return None

    def detach(self, actor: Actor) -> None:
        """Take a stopping actor out of the registry; it stays known until done."""
        if self.actors.get(actor.task) is actor:
            del self.actors[actor.task]
            self._stopping[actor.task] = actor

    def forget(self, actor: Actor) -> None:
        """Drop a stopped actor."""
        self.histories.forget(actor.session.kept)
        self._making_room.discard(actor)
        owned = self.owned.get(actor.owner)
        if owned is not None:
            owned.pop(actor, None)
            if not owned:
                del self.owned[actor.owner]
        if self.actors.get(actor.task) is actor:
            del self.actors[actor.task]
        if self._stopping.get(actor.task) is actor:
            del self._stopping[actor.task]

    def flush(self, task: str | None, reply: ReplyTo) -> None:
        """Make ``task`` durable (every task when None) after the requests queued before;
        ``{"flushed": n, "loaded": ...}`` goes to ``reply``.

        A running actor flushes in turn (past the mailbox bound); a stopping
        one flushes as it stops, so the reply waits for that; a task not
        loaded has nothing unwritten here.
        """
        if task is None:
            self.spawn(lambda: self._flush_all(reply))
            return
        actor = self.actors.get(task)
        if actor is not None:
            try:
                actor.tell("flush", {}, reply, force=True)
            except ActorStoppedError as exc:
                reply.set_exception(exc)
            return
        stopping = self._stopping.get(task)
        if stopping is None:
            reply.set_result({"flushed": 0, "loaded": False})
            return

        async def wait_for_stop() -> None:
            await stopping.done.wait()
            reply.set_result({"flushed": 0, "loaded": True})  # it flushed as it stopped

        self.spawn(wait_for_stop)

    def close(self, task: str, args: dict[str, Any], reply: ReplyTo) -> None:
        """Write ``task`` and stop its actor after the requests queued before; the result
        goes to ``reply`` (``loaded`` false: no actor of it was running, nothing closed).
        """
        actor = self.actors.get(task)
        if actor is None:
            reply.set_result({"closed": False, "loaded": False})
            return
        try:
            actor.tell("close", args, reply)
        except Exception as exc:
            reply.set_exception(exc)

    async def _flush_all(self, reply: ReplyTo) -> None:
        """Make every task durable, each after the requests queued before; the count of
        tasks written goes to ``reply``, or a ``FlushError`` when some could not be (all
        are tried)."""
        futures = [
            (actor.task, actor.ask("flush", {}))
            for actor in list(self.actors.values())
            if not actor.session.ephemeral and not actor.stopping
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
            reply.set_exception(FlushError("; ".join(failures)))
        else:
            reply.set_result({"flushed": written})

    async def reap_idle(self) -> None:
        """Stop actors idle for longer than the idle timeout, forever (runs as a task)."""
        interval = max(0.02, min(self.idle_timeout / 4, 5.0))
        while True:
            await anyio.sleep(interval)
            now = self.loop.time()
            for actor in list(self.actors.values()):
                if not actor.is_idle(now, self.idle_timeout):
                    continue
                if actor.session.dirty:
                    # Never stop with unwritten changes: write first, stop next round.
                    # After a failed write its own back-off timer retries, not this loop.
                    actor.session.writes.write_soon()
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
        sessions = [actor.session for actor in self.actors.values()]
        ratios = sorted(
            session.calibration.ratio for session in sessions if session.calibration.samples > 0
        )
        ledgers = [
            session.state.ledger
            for session in sessions
            if session.state is not None and session.state.ledger.requests
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

    def clients(self) -> dict[str, dict[str, int]]:
        """What each client holds: its ``tasks`` (actors) and its kept ``history_bytes``."""
        held: dict[str, dict[str, int]] = {
            client: {"tasks": len(actors), "history_bytes": 0}
            for client, actors in self.owned.items()
        }
        for client, size in self.histories.by_owner.items():
            held.setdefault(client, {"tasks": 0, "history_bytes": 0})["history_bytes"] = size
        return held
