"""Task state in Redis: one owner per task by a lease, every write fenced.

Keys of a task share one hash tag, so a Redis Cluster keeps them in one slot:

- ``<prefix>:{<task>}:lease``: ``<owner>\\n<fence>`` with a TTL (the lease);
- ``<prefix>:{<task>}:fence``: a counter that only grows, one step per lease taken;
- ``<prefix>:{<task>}:state``: the task's record as ``ctxwin.json`` holds it
  (``_record.encode_task``), with the fence of the daemon that wrote it.

Taking a task (one script, so nothing can come between): set the lease if
absent with its TTL, increment the fence, put the fence in the lease, read the
state. Renewing: extend the TTL if the lease still holds this owner and fence;
a lease that expired while nobody took the task (the fence did not move) is
set again. Writing: set the state only if the fence counter still equals the
writer's fence (no daemon has taken the task since). Releasing: delete the
lease only if it is still this owner's. Every script runs on the server, so a
daemon paused at any moment can never overwrite the state of a later owner.

Durability is the server's own (``appendfsync``); with ``wait_replicas`` a
write also waits (``WAIT``) until that many replicas have it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import structlog

from .._redact import redact_url

try:  # an optional extra: ctxwin[redis]
    import redis
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import RedisError, ResponseError
except ImportError:  # pragma: no cover - exercised by a daemon without the extra
    aioredis = None  # type: ignore[assignment]

__all__ = [
    "BadContent",
    "Fenced",
    "Lease",
    "OwnedElsewhere",
    "RedisStore",
    "StoreUnavailable",
    "Taken",
    "redis_available",
]

_log = structlog.get_logger("ctxwin.daemon.redis")

_ODD = """
local function odd(key, fence)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'none' then return false end
  if kind ~= 'string' then return key .. ' is a ' .. kind .. ', not a string' end
  if fence then
    local value = redis.call('GET', key)
    if string.len(value) > 18 or not string.match(value, '^[0-9]+$') then
      return key .. ' does not hold a fence (a whole number)'
    end
  end
  return false
end
"""
"""Lua: why a task's key holds what no daemon wrote (a wrong type, a fence not a number)."""

_ACQUIRE = (
    _ODD
    + """
local odd_content = odd(KEYS[1], false) or odd(KEYS[2], true) or odd(KEYS[3], false)
if odd_content then return {2, odd_content} end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = redis.call('INCR', KEYS[2])
  redis.call('SET', KEYS[1], ARGV[1] .. '\\n' .. fence, 'XX', 'PX', ARGV[2])
  local state = redis.call('GET', KEYS[3])
  if state then return {1, fence, state} end
  return {1, fence}
end
return {0, redis.call('GET', KEYS[1])}
"""
)

_RENEW = """
local lease = redis.call('GET', KEYS[1])
if lease == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not lease and redis.call('GET', KEYS[2]) == ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
  return 2
end
return 0
"""

_WRITE = (
    _ODD
    + """
local odd_content = odd(KEYS[2], true)
if odd_content then return {2, odd_content} end
local current = redis.call('GET', KEYS[2])
if current ~= ARGV[1] then
  return {0, current or '0'}
end
redis.call('SET', KEYS[3], ARGV[2])
return {1, current or '0'}
"""
)
"""Lua: set the state (``ARGV[2]``) only while the fence counter is the writer's (``ARGV[1]``)."""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""


def redis_available() -> bool:
    """Whether the ``redis`` package (the ``ctxwin[redis]`` extra) is installed."""
    return aioredis is not None


class StoreUnavailable(Exception):
    """The store could not be reached or refused the command; the message says why."""


class BadContent(StoreUnavailable):
    """A task's keys hold what no daemon wrote (a wrong type, a fence that is no number).

    Nothing was changed; the task stays unserved until an operator fixes or
    deletes the key the message names. Other tasks are not concerned.
    """


def _bad_content(what: str, reason: bytes) -> BadContent:
    text = reason.decode("utf-8", "replace")[:300]
    return BadContent(
        f"{what}: the store holds what ctxwin did not write: {text}; "
        "fix or delete that key (nothing was changed)"
    )


class Fenced(Exception):
    """A write was refused: another daemon has taken the task since this lease."""


@dataclass(frozen=True)
class OwnedElsewhere:
    """The task is leased by another daemon.

    Attributes:
        owner: the owner's advertised endpoint.
    """

    owner: str


@dataclass(frozen=True)
class Lease:
    """A lease held on one task.

    Attributes:
        task: the task id.
        fence: the fencing token this lease wrote with.
        value: the lease key's value (owner and fence).
    """

    task: str
    fence: int
    value: bytes


@dataclass(frozen=True)
class Taken:
    """A task just taken: the lease and the stored state (None for a new task)."""

    lease: Lease
    state: bytes | None


def _owner_endpoint(value: bytes | None) -> str:
    """The advertised endpoint in a lease value (``<endpoint> <instance>\\n<fence>``)."""
    if not value:
        return ""
    owner = value.split(b"\n", 1)[0].decode("utf-8", "replace")
    return owner.rsplit(" ", 1)[0]


def _reason(exc: BaseException) -> str:
    """A short reason for a store failure (never a value)."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:200] if text else type(exc).__name__


_CONNECTIONS = 100
"""Connections to Redis at most, per daemon."""
_CONNECTION_WAIT_S = 30.0
"""How long a call waits for a free connection (the daemon's shutdown grace)."""


class RedisStore:
    """The Redis side of fleet mode: leases, fenced writes, state reads.

    Args:
        url: ``redis://host:port/db``, ``rediss://...`` or ``unix:///path?db=N``.
        advertise: this daemon's endpoint as other daemons should name it.
        password: the server's password (from the config file or environment).
        prefix: key prefix (for a server shared with other applications).
        lease_ttl_ms: lease lifetime; renewed every third of it.
        wait_replicas: replicas a write waits for (``WAIT``; 0: none).
        wait_timeout_ms: longest ``WAIT``.
        timeout_s: longest wait for one command (connect or reply).
    """

    def __init__(
        self,
        url: str,
        advertise: str,
        *,
        password: str | None = None,
        prefix: str = "ctxwin",
        lease_ttl_ms: int = 10_000,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
        timeout_s: float = 2.0,
    ) -> None:
        if aioredis is None:
            raise RuntimeError(
                "the Redis state store needs the redis extra: pip install 'ctxwin[redis]'"
            )
        self.url = url
        self.advertise = advertise
        self.prefix = prefix
        self.lease_ttl_ms = lease_ttl_ms
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.owner = f"{advertise} {os.urandom(6).hex()}"
        self._password = password
        self._timeout_s = timeout_s
        # A blocking pool: past its connections a call waits for one to come free. At a
        # stop every task writes and gives up its lease at once, and the default pool
        # failed the writes past its 100th connection (Too many connections).
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=_CONNECTIONS,
            timeout=_CONNECTION_WAIT_S,
            password=password,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            # One quick retry on a fresh connection (a restarted server); every script
            # is safe to repeat: the same fence and state give the same outcome.
            retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 1),
            decode_responses=False,
        )
        self.client = aioredis.Redis.from_pool(pool)
        self._acquire = self.client.register_script(_ACQUIRE)
        self._renew = self.client.register_script(_RENEW)
        self._write = self.client.register_script(_WRITE)
        self._release = self.client.register_script(_RELEASE)

    def sync_client(self) -> Any:
        """A blocking client of the same server and options, for a thread of its own."""
        return redis.Redis.from_url(
            self.url,
            password=self._password,
            socket_timeout=self._timeout_s,
            socket_connect_timeout=self._timeout_s,
            decode_responses=False,
        )

    def keys(self, task: str) -> tuple[str, str, str]:
        """The lease, fence and state keys of ``task``."""
        base = f"{self.prefix}:{{{task}}}:"
        return base + "lease", base + "fence", base + "state"

    @property
    def description(self) -> str:
        """The store as ``stats`` names it (no password)."""
        return redact_url(self.url)

    async def _run(self, what: str, coro: Any) -> Any:
        try:
            return await coro
        except ResponseError as exc:
            raise StoreUnavailable(f"{what}: the server refused: {_reason(exc)}") from None
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"{what}: {_reason(exc)}") from None

    async def take(self, task: str) -> Taken | OwnedElsewhere:
        """Take the task's lease (set if absent, then the next fence), then read its state.

        Raises:
            BadContent: the task's keys hold what no daemon wrote (nothing changed).
            StoreUnavailable: the store could not be reached.
        """
        lease_key, fence_key, state_key = self.keys(task)
        reply = await self._run(
            f"take {task}",
            self._acquire(
                keys=[lease_key, fence_key, state_key], args=[self.owner, self.lease_ttl_ms]
            ),
        )
        if reply[0] == 2:
            raise _bad_content(f"take {task}", reply[1])
        if reply[0] == 0:
            return OwnedElsewhere(_owner_endpoint(reply[1]))
        fence = int(reply[1])
        value = f"{self.owner}\n{fence}".encode()
        _log.info("lease_taken", task=task, fence=fence)
        return Taken(Lease(task, fence, value), reply[2] if len(reply) > 2 else None)

    async def owner_of(self, task: str) -> str | None:
        """The advertised endpoint of the task's owner, or None when it has none.

        Raises:
            StoreUnavailable: the store could not be reached.
        """
        value = await self._run(f"owner of {task}", self.client.get(self.keys(task)[0]))
        return _owner_endpoint(value) if value else None

    async def renew(self, lease: Lease) -> bool:
        """Extend the lease; False when it is no longer this daemon's.

        A lease that expired while no other daemon took the task is set again.

        Raises:
            StoreUnavailable: the store could not be reached (the lease may still hold).
        """
        lease_key, fence_key, _ = self.keys(lease.task)
        reply = await self._run(
            f"renew {lease.task}",
            self._renew(
                keys=[lease_key, fence_key], args=[lease.value, self.lease_ttl_ms, lease.fence]
            ),
        )
        return bool(reply)

    async def write(self, lease: Lease, state: bytes) -> None:
        """Set the task's state if no daemon has taken the task since ``lease``.

        Waits for ``wait_replicas`` replicas when configured.

        Raises:
            Fenced: another daemon holds a later fence; this one must never write again.
            BadContent: the fence key holds no fence (not written; retried).
            StoreUnavailable: not written (unreachable, out of memory, too few replicas).
        """
        reply = await self._run(f"write {lease.task}", self._write_script(lease, state))
        if reply[0] == 2:
            raise _bad_content(f"write {lease.task}", reply[1])
        if reply[0] == 0:
            current = reply[1].decode("ascii", "replace")[:20]
            raise Fenced(
                f"task {lease.task}: fence {lease.fence} refused, another daemon took it "
                f"(fence {current})"
            )
        if self.wait_replicas > 0:
            acked = await self._run(
                f"wait {lease.task}",
                self.client.wait(self.wait_replicas, self.wait_timeout_ms),
            )
            if int(acked) < self.wait_replicas:
                raise StoreUnavailable(
                    f"write {lease.task}: {int(acked)} of {self.wait_replicas} replicas "
                    f"acknowledged within {self.wait_timeout_ms} ms"
                )

    def _write_script(self, lease: Lease, state: bytes) -> Any:
        """The fenced write's script call (its reply: ``[1|0|2, fence or reason]``)."""
        return self._write(keys=list(self.keys(lease.task)), args=[lease.fence, state])

    async def release(self, lease: Lease) -> bool:
        """Delete the lease if it is still this daemon's; returns whether it was.

        Raises:
            StoreUnavailable: the store could not be reached (the lease expires by itself).
        """
        reply = await self._run(
            f"release {lease.task}",
            self._release(keys=[self.keys(lease.task)[0]], args=[lease.value]),
        )
        if reply:
            _log.info("lease_released", task=lease.task, fence=lease.fence)
        return bool(reply)

    async def read_state(self, task: str) -> bytes | None:
        """The stored state of a task, whoever owns it (for checks and ``inspect``).

        Raises:
            StoreUnavailable: the store could not be reached.
        """
        value: bytes | None = await self._run(f"read {task}", self.client.get(self.keys(task)[2]))
        return value

    async def ping(self) -> None:
        """Check that the store answers.

        Raises:
            StoreUnavailable: it does not.
        """
        await self._run("ping", self.client.ping())

    async def close(self) -> None:
        """Close the connections."""
        try:
            await self.client.aclose()
        except (RedisError, OSError):
            pass
