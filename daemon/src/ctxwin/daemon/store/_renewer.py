"""Fleet leases renewed on a thread of their own, whatever the event loop is doing.

A lease lives ``lease_ttl_ms`` (10 s by default) unless renewed. Renewed by
a task on the event loop, it lapsed whenever the loop was held for longer:
a request whose patterns took 16 s to compile made every other task of the
daemon answer ``busy: lease lapsed``. Here one thread, with its own Redis
connection, renews every lease held every third of the TTL, a batch of
scripts per round trip, and releases them: renewal and release go through
the same thread one after the other, so a renewal can never set again a
lease just released. The thread runs whenever the interpreter lets it:
Python code on the loop hands it the interpreter lock every 5 ms; a single
C call that holds the lock (decoding, compiling) still delays it, which is
why those are bounded elsewhere.

What the loop reads (a task's deadline, whether it was lost) is written
here as single attribute assignments; what it must act on (a lease taken by
another daemon, or not renewed before its deadline) is handed to it with
``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import Any, Protocol

import structlog

from ._redis import _RELEASE, _RENEW, Lease, RedisStore, StoreUnavailable

__all__ = ["LeaseHolder", "LeaseRenewer"]

_log = structlog.get_logger("ctxwin.daemon.fleet")

_BATCH = 256
"""Renewals sent in one round trip."""
_RETRY_S = 0.2
"""How soon a renewal that failed (the store unreachable) is tried again."""


class LeaseHolder(Protocol):
    """A task's store as the renewer sees it."""

    task: str
    lease: Lease | None
    deadline: float
    lost: bool
    fenced: bool

    def lease_lost(self, reason: str) -> None:
        """Called on the event loop once the lease is lost (taken, or lapsed)."""


class _Entry:
    __slots__ = ("due", "holder")

    def __init__(self, holder: LeaseHolder, due: float) -> None:
        self.holder = holder
        self.due = due


class LeaseRenewer:
    """Renews and releases the leases of one daemon on a thread with its own connection.

    Args:
        redis: the daemon's Redis store (for its keys, URL and options).
        loop: the event loop to hand lost leases to.
    """

    def __init__(self, redis: RedisStore, loop: asyncio.AbstractEventLoop) -> None:
        self.redis = redis
        self.loop = loop
        self.ttl_s = redis.lease_ttl_ms / 1000
        self.interval_s = self.ttl_s / 3
        self._client = redis.sync_client()
        self._renew = self._client.register_script(_RENEW)
        self._release = self._client.register_script(_RELEASE)
        self._lock = threading.Lock()
        self._held: dict[int, _Entry] = {}
        self._releases: deque[tuple[LeaseHolder, asyncio.Future[bool]]] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.renewals = 0  # renewals that succeeded (for tests and stats)

    def add(self, holder: LeaseHolder) -> None:
        """Renew ``holder``'s lease from now on (its first renewal a third of the TTL away)."""
        with self._lock:
            self._held[id(holder)] = _Entry(holder, time.monotonic() + self.interval_s)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="ctxwin-lease-renewer", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def forget(self, holder: LeaseHolder) -> None:
        """Stop renewing ``holder``'s lease (it is lost: nothing to release)."""
        with self._lock:
            self._held.pop(id(holder), None)

    async def release(self, holder: LeaseHolder) -> bool:
        """Stop renewing and delete the lease if it is still this daemon's.

        Raises:
            StoreUnavailable: the store could not be reached (the lease expires by itself).
        """
        future: asyncio.Future[bool] = self.loop.create_future()
        with self._lock:
            self._held.pop(id(holder), None)
            self._releases.append((holder, future))
        self._wake.set()
        return await future

    async def close(self) -> None:
        """Stop the thread (the leases left expire by themselves) and close its connection."""
        self._stopping = True
        self._wake.set()
        thread = self._thread
        if thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, thread.join, 10.0)
        self._client.close()

    # -- the thread -----------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            self._wake.clear()
            self._do_releases()
            due = self._due()
            for start in range(0, len(due), _BATCH):
                self._renew_batch(due[start : start + _BATCH])
                self._do_releases()  # a release never waits for a whole round
            with self._lock:
                soonest = min((entry.due for entry in self._held.values()), default=None)
            wait = self.interval_s if soonest is None else soonest - time.monotonic()
            if wait > 0:
                self._wake.wait(wait)

    def _due(self) -> list[_Entry]:
        now = time.monotonic()
        with self._lock:
            return [entry for entry in self._held.values() if entry.due <= now]

    def _renew_batch(self, entries: list[_Entry]) -> None:
        pipe = self._client.pipeline(transaction=False)
        sent = time.monotonic()
        live: list[_Entry] = []
        for entry in entries:
            lease = entry.holder.lease
            if lease is None or entry.holder.fenced:
                self.forget(entry.holder)
                continue
            lease_key, fence_key, _ = self.redis.keys(lease.task)
            self._renew(
                keys=[lease_key, fence_key],
                args=[lease.value, self.redis.lease_ttl_ms, lease.fence],
                client=pipe,
            )
            live.append(entry)
        if not live:
            return
        try:
            replies: list[Any] = pipe.execute(raise_on_error=False)
        except Exception as exc:  # unreachable: every renewal failed
            replies = [exc] * len(live)
        for entry, reply in zip(live, replies, strict=True):
            self._renewed(entry, reply, sent)

    def _renewed(self, entry: _Entry, reply: Any, sent: float) -> None:
        holder = entry.holder
        if isinstance(reply, Exception):
            if time.monotonic() >= holder.deadline:
                self._lose(holder, f"lease not renewed before its deadline: {_reason(reply)}")
            else:
                _log.warning("lease_renew_failed", task=holder.task, error=_reason(reply))
                entry.due = time.monotonic() + _RETRY_S
            return
        if not reply:
            # Its final write goes to the server, whose fence check refuses it.
            self._lose(holder, "the lease was taken by another daemon")
            return
        holder.deadline = sent + self.ttl_s
        entry.due = sent + self.interval_s
        self.renewals += 1

    def _lose(self, holder: LeaseHolder, reason: str) -> None:
        holder.lost = True  # serving() sees it at once
        self.forget(holder)
        self.loop.call_soon_threadsafe(holder.lease_lost, reason)

    def _do_releases(self) -> None:
        while True:
            with self._lock:
                if not self._releases:
                    return
                holder, future = self._releases.popleft()
            lease = holder.lease
            try:
                if lease is None or holder.fenced:
                    released: bool | BaseException = False
                else:
                    key = self.redis.keys(lease.task)[0]
                    released = bool(self._release(keys=[key], args=[lease.value]))
            except Exception as exc:
                released = StoreUnavailable(f"release {holder.task}: {_reason(exc)}")
            self.loop.call_soon_threadsafe(_settle, future, released)


def _settle(future: asyncio.Future[bool], outcome: bool | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:200] if text else type(exc).__name__
