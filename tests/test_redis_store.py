"""The Redis store's leases and fenced writes, against a real redis-server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from ctxwin.daemon.store._record import TaskRecord, decode_record, encode_task
from ctxwin.daemon.store._redis import (
    BadContent,
    Fenced,
    Lease,
    OwnedElsewhere,
    RedisStore,
    StoreUnavailable,
    Taken,
)
from tests._audited_store import AuditedRedisStore, audit_key
from tests._redis import RedisServer

pytestmark = pytest.mark.anyio

Stores = tuple[RedisStore, RedisStore]
"""Two daemons' stores on one server (the ``stores`` fixture)."""


def store(server: RedisServer, name: str, **options: object) -> RedisStore:
    """A store for a daemon advertised as ``name``."""
    return RedisStore(server.url, f"tcp://{name}:7878", **options)  # type: ignore[arg-type]


def audited(server: RedisServer, name: str, *, fence_check: bool = True) -> AuditedRedisStore:
    """A store for a daemon advertised as ``name`` that keeps the audit list of its writes."""
    return AuditedRedisStore(server.url, f"tcp://{name}:7878", fence_check=fence_check)


async def take(redis: RedisStore, task: str) -> Taken:
    """Take a task that must be free."""
    taken = await redis.take(task)
    assert isinstance(taken, Taken), taken
    return taken


@pytest.fixture
async def stores(redis_server: RedisServer) -> AsyncIterator[Stores]:
    """The stores of two daemons on one server, advertised as ``a`` and ``b`` (closed after)."""
    first, second = store(redis_server, "a"), store(redis_server, "b")
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


async def test_keys_share_one_hash_tag_under_the_prefix(redis_server: RedisServer) -> None:
    """Every key of a task carries ``{task}`` and the configured prefix."""
    redis = store(redis_server, "a", prefix="team7")
    try:
        assert (*redis.keys("t-1"), audit_key(redis.prefix, "t-1")) == (
            "team7:{t-1}:lease",
            "team7:{t-1}:fence",
            "team7:{t-1}:state",
            "team7:{t-1}:audit",
        )
    finally:
        await redis.close()


async def test_a_lease_excludes_others_until_released(stores: Stores) -> None:
    """A second daemon sees the owner's endpoint; after release it takes the next fence."""
    first, second = stores
    taken = await take(first, "t")
    assert (taken.lease.fence, taken.state) == (1, None)
    assert await second.take("t") == OwnedElsewhere("tcp://a:7878")
    assert await second.owner_of("t") == "tcp://a:7878"
    assert await second.release(Lease("t", 1, b"tcp://b:7878 x\n1")) is False
    assert await first.release(taken.lease) is True
    assert await second.owner_of("t") is None
    again = await take(second, "t")
    assert again.lease.fence == 2


async def test_writes_are_fenced(stores: Stores) -> None:
    """Once another daemon took the task, the earlier owner's write is refused, changing nothing."""
    first, second = stores
    old = await take(first, "t")
    state = encode_task(TaskRecord([], [2, 5]), fence=old.lease.fence).authority
    await first.write(old.lease, state)
    await expire(second, "t")
    new = await take(second, "t")
    assert new.state == state  # the state is read after the fence moved
    with pytest.raises(Fenced, match="fence 1 refused"):
        await first.write(old.lease, b"stale")
    assert await second.read_state("t") == state
    newer = encode_task(TaskRecord([], [2, 9]), fence=new.lease.fence).authority
    await second.write(new.lease, newer)
    record, fence = decode_record(json.loads(await second.read_state("t") or b""))
    assert (record.deleted_range, fence) == ([2, 9], 2)


async def expire(redis: RedisStore, task: str) -> None:
    """End the task's lease as its TTL would (deleted on the server)."""
    assert await redis.client.delete(redis.keys(task)[0]) == 1


async def test_a_control_store_without_the_fence_check_lets_a_stale_write_through(
    redis_server: RedisServer,
) -> None:
    """With the check off (a control store) the same stale write is accepted: the check refuses."""
    first = audited(redis_server, "a", fence_check=False)
    second = audited(redis_server, "b")
    try:
        old = await take(first, "t")
        await expire(second, "t")
        new = await take(second, "t")
        await second.write(new.lease, b"new")
        await first.write(old.lease, b"stale")
        assert await second.read_state("t") == b"stale"
        audit = await second.client.lrange(audit_key(second.prefix, "t"), 0, -1)
        assert audit == [b"2\nnew", b"1\nstale"]
    finally:
        await first.close()
        await second.close()


async def test_renew_extends_and_fails_once_taken_over(stores: Stores) -> None:
    """Renew keeps the lease, re-takes an expired one nobody took, and fails after a takeover."""
    first, second = stores
    lease = (await take(first, "t")).lease
    assert await first.renew(lease) is True
    await expire(first, "t")
    assert await first.renew(lease) is True  # expired, fence unmoved: set again
    assert await second.take("t") == OwnedElsewhere("tcp://a:7878")
    await expire(first, "t")
    await take(second, "t")
    assert await first.renew(lease) is False


async def test_the_state_survives_kill_9_by_the_append_only_file(redis_server: RedisServer) -> None:
    """A write acknowledged before redis-server is killed with -9 is there after its restart."""
    redis = store(redis_server, "a")
    try:
        lease = (await take(redis, "t")).lease
        await redis.write(lease, b"durable")
        redis_server.kill()
        with pytest.raises(StoreUnavailable):
            await redis.write(lease, b"lost")
        redis_server.start()
        assert await redis.read_state("t") == b"durable"
        await redis.write(lease, b"after")  # the same lease writes on, once the server is back
        assert await redis.read_state("t") == b"after"
    finally:
        await redis.close()


async def test_wait_for_replicas_says_how_many_answered(redis_server: RedisServer) -> None:
    """With no replica, a write that must wait for one is refused with the count."""
    redis = store(redis_server, "a", wait_replicas=1, wait_timeout_ms=10)
    try:
        lease = (await take(redis, "t")).lease
        with pytest.raises(StoreUnavailable, match="0 of 1 replicas"):
            await redis.write(lease, b"x")
    finally:
        await redis.close()


async def test_an_unreachable_store_is_a_clear_error(tmp_path: object) -> None:
    """A socket nobody listens on fails quickly with the reason, not a hang."""
    redis = RedisStore("unix:///nonexistent/redis.sock", "tcp://a:1", timeout_s=0.5)
    try:
        with pytest.raises(StoreUnavailable, match="take t"):
            await redis.take("t")
    finally:
        await redis.close()


@pytest.mark.parametrize(
    ("key", "command", "reason"),
    [
        ("fence", ("SET", "abc"), "does not hold a fence"),
        ("fence", ("SET", "9" * 19), "does not hold a fence"),
        ("fence", ("RPUSH", "1"), "is a list, not a string"),
        ("state", ("HSET", "f", "v"), "is a hash, not a string"),
        ("lease", ("SADD", "x"), "is a set, not a string"),
    ],
)
async def test_keys_no_daemon_wrote_are_refused_and_left_as_they_are(
    redis_server: RedisServer, key: str, command: tuple[str, ...], reason: str
) -> None:
    """A key of the wrong type, or a fence that is no number: a clear error, nothing changed."""
    redis = store(redis_server, "a")
    try:
        lease_key, fence_key, state_key = redis.keys("t")
        target = {"lease": lease_key, "fence": fence_key, "state": state_key}[key]
        await redis.client.execute_command(command[0], target, *command[1:])  # type: ignore[no-untyped-call]
        with pytest.raises(BadContent, match=rf"take t: .*{target}.* {reason}.*fix or delete"):
            await redis.take("t")
        assert [target.encode()] == await redis.client.keys("*")  # no lease, no fence set
        assert isinstance(await redis.take("u"), Taken)  # another task is not concerned
    finally:
        await redis.close()


async def test_a_write_after_the_fence_was_overwritten_is_refused_clearly(
    redis_server: RedisServer,
) -> None:
    """The owner's write with a fence key set to text: BadContent, not a crash; then it writes."""
    redis = store(redis_server, "a")
    try:
        taken = await take(redis, "t")
        fence_key = redis.keys("t")[1]
        await redis.client.set(fence_key, "abc")
        with pytest.raises(BadContent, match="does not hold a fence"):
            await redis.write(taken.lease, b"new")
        assert await redis.read_state("t") is None
        await redis.client.set(fence_key, "1")  # fixed by an operator
        await redis.write(taken.lease, b"new")
        assert await redis.read_state("t") == b"new"
        await redis.client.set(fence_key, "7")  # another daemon's number: fenced as before
        with pytest.raises(Fenced, match=r"\(fence 7\)"):
            await redis.write(taken.lease, b"newer")
    finally:
        await redis.close()


async def test_leases_are_renewed_while_the_event_loop_is_held(redis_server: RedisServer) -> None:
    """A 300 ms lease outlives the loop held for 1.5 s: its thread renews it meanwhile.

    Renewed from the event loop, the lease lapsed (the task served no more,
    its key expired) whenever a request held the loop longer than the TTL.
    """
    import time

    import anyio

    from ctxwin import engine
    from ctxwin.daemon.store._fleet import RedisStateStore

    redis = store(redis_server, "a", lease_ttl_ms=300, timeout_s=0.2)
    lost: list[str] = []
    async with anyio.create_task_group() as group:

        def spawn(run: Callable[[], Coroutine[Any, Any, None]]) -> None:
            group.start_soon(run)

        fleet = RedisStateStore(redis, engine.DEFAULT_NOTICES, spawn)
        try:
            task = fleet.open("held", lost.append)
            await task.load()
            time.sleep(1.5)  # noqa: ASYNC251 - the loop held, as by a long request
            assert task.serving()
            assert lost == []
            assert fleet.renewer.renewals >= 3
            assert await redis.owner_of("held") == "tcp://a:7878"
            await task.release()
            assert await redis.owner_of("held") is None
            await anyio.sleep(0.5)  # a renewal after the release would set it again
            assert await redis.owner_of("held") is None
        finally:
            await fleet.close()
