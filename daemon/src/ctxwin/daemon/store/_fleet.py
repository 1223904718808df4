"""Fleet mode: the task store on Redis, one owning daemon per task (see ``_redis.py``).

A task's store takes the lease when its actor starts (``load``): another
daemon's live lease is answered with ``owned_elsewhere`` naming its
endpoint. While the actor runs, the lease is renewed every third of its TTL
by the daemon's lease thread (``_renewer.py``), whatever the event loop is
doing; the task is served only while the local deadline (the send time of
the last successful renew plus the TTL, which the server's expiry can only
follow) has not passed. A renew the server refuses, or a write refused by
the fence, means another daemon owns the task: the actor is told
(``on_lost``), drops the task from memory and this store never writes it
again. The actor's final write on stop is followed by the release
(compare-and-delete, by the same thread, so no renewal can follow it).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import structlog

from ctxwin import engine, proto

from ._base import Spawn, StoreError, StoreUnavailableError, TaskExtras
from ._record import TaskRecord, build_state, decode_record, encode_task, extras_of, record_of
from ._redis import BadContent, Fenced, Lease, OwnedElsewhere, RedisStore, StoreUnavailable
from ._renewer import LeaseRenewer

__all__ = ["RedisStateStore", "RedisTaskStore"]

_log = structlog.get_logger("ctxwin.daemon.fleet")


class RedisTaskStore:
    """One task in Redis, owned by this daemon while its actor runs.

    Args:
        parent: the daemon's Redis state store.
        task: the task id.
        on_lost: called once with the reason when ownership is lost.
    """

    def __init__(self, parent: RedisStateStore, task: str, on_lost: Callable[[str], None]) -> None:
        self.parent = parent
        self.redis = parent.redis
        self.task = task
        self.on_lost = on_lost
        self.lease: Lease | None = None
        self.deadline = 0.0  # written by the lease thread
        self._current: bytes | None = None
        self.fenced = False  # a write was refused: never write again
        self.lost = False  # the renew was refused or came too late: serve no more
        self._released = False

    def _encode(self, state: engine.TaskState, extras: TaskExtras) -> bytes:
        assert self.lease is not None
        return encode_task(record_of(state, extras), fence=self.lease.fence).authority

    async def load(self) -> tuple[engine.TaskState, TaskExtras]:
        """Take the task's lease, then read its state.

        Raises:
            ProtocolError: ``owned_elsewhere`` with the owner's endpoint.
            StoreUnavailableError: the store cannot be reached.
        """
        loop = self.parent.loop
        sent = loop.time()
        try:
            taken = await self.redis.take(self.task)
        except BadContent as exc:
            _log.error("store_content_refused", task=self.task, reason=str(exc))
            raise StoreUnavailableError(str(exc)) from None
        except StoreUnavailable as exc:
            raise StoreUnavailableError(f"state store unavailable: {exc}") from None
        if isinstance(taken, OwnedElsewhere) and taken.owner == self.parent.advertise:
            # An earlier run of this daemon (killed) still holds it: free within the TTL.
            raise StoreUnavailableError(
                f"task {self.task} is still leased by an earlier run of this daemon "
                f"(free within {self.parent.ttl_s:g} s)"
            )
        if isinstance(taken, OwnedElsewhere):
            raise proto.ProtocolError(
                proto.ErrorCode.OWNED_ELSEWHERE,
                f"task {self.task} is served by the daemon at {taken.owner}; send it there",
                owner=taken.owner,
            )
        self.lease = taken.lease
        self.deadline = sent + self.parent.ttl_s
        self.parent.owned[self.task] = self
        self.parent.renewer.add(self)
        record = TaskRecord()
        if taken.state is not None:
            try:
                record = decode_record(json.loads(taken.state))[0]
                state = build_state(record, self.parent.notices)
            except Exception as exc:  # a value this daemon cannot read: keep it aside
                await self._set_aside(f"{type(exc).__name__}")
                record = TaskRecord()
                state = build_state(record, self.parent.notices)
        else:
            state = build_state(record, self.parent.notices)
        extras = extras_of(record)
        # What is stored is current as loaded, whatever fence wrote it (and an empty
        # new task has nothing to write).
        self._current = self._encode(state, extras)
        return state, extras

    async def _set_aside(self, reason: str) -> None:
        state_key = self.redis.keys(self.task)[2]
        aside = f"{state_key}.corrupt-{int(time.time() * 1000)}"
        try:
            await self.redis.client.rename(state_key, aside)
        except Exception as exc:
            _log.error("corrupt_state_kept", task=self.task, error=type(exc).__name__)
        _log.error("corrupt_state", task=self.task, moved_to=aside, reason=reason)

    async def save(self, state: engine.TaskState, extras: TaskExtras) -> bool:
        """Write the state with this lease's fence unless it is stored as is.

        Raises:
            StoreError: another daemon owns the task (never written again), or
                the store refused or could not be reached (retried).
        """
        if self.fenced or self.lease is None:
            raise StoreError(f"task {self.task}: another daemon owns it; not written")
        data = self._encode(state, extras)
        if data == self._current:
            return False
        try:
            await self.redis.write(self.lease, data)
        except Fenced as exc:
            self.fenced = True
            _log.error("write_fenced", task=self.task, fence=self.lease.fence, reason=str(exc))
            self.on_lost(str(exc))
            raise StoreError(str(exc)) from None
        except StoreUnavailable as exc:
            raise StoreUnavailableError(str(exc)) from None
        self._current = data
        return True

    def is_current(self, state: engine.TaskState, extras: TaskExtras) -> bool:
        """Whether this content is what was last loaded or written."""
        return self.lease is not None and self._encode(state, extras) == self._current

    def serving(self) -> bool:
        """Whether the lease is this daemon's for sure: not lost, local deadline ahead."""
        return not self.fenced and not self.lost and self.parent.loop.time() < self.deadline

    def lease_lost(self, reason: str) -> None:
        """The lease thread lost the lease (taken by another daemon, or lapsed)."""
        self.on_lost(reason)

    async def release(self) -> None:
        """Stop renewing and delete the lease if it is still this daemon's (once)."""
        if self._released:
            return
        self._released = True
        self.parent.owned.pop(self.task, None)
        if self.lease is None or self.fenced:
            self.parent.renewer.forget(self)
            return
        try:
            released = await self.parent.renewer.release(self)  # compare-and-delete
        except StoreUnavailable as exc:
            _log.warning("lease_release_failed", task=self.task, error=str(exc))
            return
        if released:
            _log.info("lease_released", task=self.task, fence=self.lease.fence)

    def describe(self) -> dict[str, Any]:
        """The store, this daemon as owner, and the lease's fence."""
        return {
            "store": "redis",
            "owner": self.parent.advertise,
            "fence": None if self.lease is None else self.lease.fence,
        }


class RedisStateStore:
    """Every task's state in one Redis server, leased task by task.

    Args:
        redis: the connection and scripts.
        notices: notice texts for loaded states.
        spawn: starts a coroutine function in the daemon's task group.
    """

    features: tuple[str, ...] = ("fleet",)

    def __init__(
        self,
        redis: RedisStore,
        notices: engine.Notices,
        spawn: Spawn,
    ) -> None:
        self.redis = redis
        self.notices = notices
        self.spawn = spawn
        self.loop = asyncio.get_running_loop()
        self.ttl_s = redis.lease_ttl_ms / 1000
        self.advertise = redis.advertise
        self.owned: dict[str, RedisTaskStore] = {}
        self.renewer = LeaseRenewer(redis, self.loop)

    def open(self, task: str, on_lost: Callable[[str], None]) -> RedisTaskStore:
        """The store of one task (nothing is asked of Redis until ``load``)."""
        return RedisTaskStore(self, task, on_lost)

    def describe(self) -> dict[str, Any]:
        """What ``stats`` shows: kind, URL without password, prefix, TTL, owner, leases held."""
        return {
            "kind": "redis",
            "url": self.redis.description,
            "prefix": self.redis.prefix,
            "lease_ttl_ms": self.redis.lease_ttl_ms,
            "owner": self.advertise,
            "leases": len(self.owned),
        }

    async def close(self) -> None:
        """Stop the lease thread and close the connections."""
        await self.renewer.close()
        await self.redis.close()
