"""Fleet mode end to end: real daemons sharing a real redis-server, one owner per task."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from ctxwin import proto
from ctxwin.daemon.store._record import decode_record
from tests._daemon import DaemonProcess, wait_until
from tests._redis import RedisServer, require_redis_server

FIRST = [
    {"role": "user", "content": [{"type": "text", "text": "Refactor the parser."}]},
    {"role": "assistant", "content": [{"type": "text", "text": "Reading it."}]},
]


def ok(reply: proto.Reply) -> dict[str, Any]:
    """The result of a reply that must have succeeded."""
    assert reply.ok, (reply.code, reply.message)
    assert reply.result is not None
    return reply.result


def fleet_daemon(root: Path, redis: RedisServer, *extra: str) -> DaemonProcess:
    """A daemon with the Redis store, its own state dir and endpoint under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    return DaemonProcess(root, "--state-store", redis.url, *extra)


def stored(redis: RedisServer, task: str, prefix: str = "ctxwin") -> dict[str, Any] | None:
    """The task's state as Redis holds it (read with a client of the test's own)."""
    import redis as redis_sync

    client = redis_sync.Redis(unix_socket_path=str(redis.socket))
    try:
        raw = client.get(f"{prefix}:{{{task}}}:state")
    finally:
        client.close()
    if raw is None:
        return None
    value = json.loads(raw)
    decode_record(value)  # a whole, valid record
    assert isinstance(value, dict)
    return value


def set_range(daemon: DaemonProcess, task: str, end: int) -> proto.Reply:
    """One change: the task's deleted range becomes ``[2, end]``."""
    args = {"task": task, "messages": FIRST, "deleted_range": [2, end]}
    return daemon.call("truncated_messages", args)


def test_one_owner_per_task_and_the_other_names_it(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """B answers owned_elsewhere naming A while A owns the task; once A closes it, B serves it."""
    with (
        fleet_daemon(tmp_path / "a", redis_server) as first,
        fleet_daemon(tmp_path / "b", redis_server) as second,
    ):
        assert "fleet" in ok(first.call("ping"))["features"]
        ok(set_range(first, "t", 5))
        ok(first.call("flush", {"task": "t"}))
        assert stored(redis_server, "t") is not None
        assert (stored(redis_server, "t") or {})["deleted_range"] == [2, 5]
        refused = set_range(second, "t", 6)
        assert (refused.ok, refused.code, refused.owner) == (
            False,
            "owned_elsewhere",
            first.endpoint,
        )
        shown = ok(first.call("inspect", {"task": "t"}))
        assert (shown["store"], shown["owner"], shown["fence"]) == ("redis", first.endpoint, 1)
        store = ok(first.call("stats"))["store"]
        assert (store["kind"], store["owner"], store["leases"]) == ("redis", first.endpoint, 1)
        assert ok(first.call("close", {"task": "t"}))["closed"] is True
        ok(set_range(second, "t", 7))
        shown = ok(second.call("inspect", {"task": "t"}))
        assert (shown["deleted_range"], shown["owner"], shown["fence"]) == (
            [2, 7],
            second.endpoint,
            2,
        )


def test_a_write_refused_by_the_fence_drops_the_task(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """An owner whose lease another daemon took stops serving the task and never writes it again."""
    with fleet_daemon(tmp_path / "a", redis_server, "--lease-ttl-ms", "60000") as first:
        ok(set_range(first, "t", 3))
        ok(first.call("flush", {"task": "t"}))
        # Another daemon takes the task as if the lease had expired (its TTL, ended early).
        asyncio.run(_take_over(redis_server, "t"))
        reply = set_range(first, "t", 4)
        assert reply.ok  # answered from memory: the loss is seen at the next write
        flushed = first.call("flush", {"task": "t"})
        assert (flushed.ok, flushed.code) == (False, "internal")
        assert "another daemon" in (flushed.message or "")
        wait_until(
            lambda: set_range(first, "t", 5).code == "owned_elsewhere",
            10,
            "the daemon refers the task to its new owner",
        )
        value = stored(redis_server, "t") or {}
        assert (value["deleted_range"], value["fence"]) == ([2, 3], 1)


async def _take_over(redis_server: RedisServer, task: str) -> None:
    from ctxwin.daemon.store._redis import RedisStore, Taken

    other = RedisStore(redis_server.url, "tcp://other:1")
    try:
        await other.client.delete(other.keys(task)[0])
        assert isinstance(await other.take(task), Taken)
    finally:
        await other.close()


def _redis_command(redis: RedisServer, *command: str) -> None:
    import redis as redis_sync

    client = redis_sync.Redis(unix_socket_path=str(redis.socket))
    try:
        client.execute_command(*command)  # type: ignore[no-untyped-call]
    finally:
        client.close()


def test_bad_store_content_is_one_tasks_problem(tmp_path: Path, redis_server: RedisServer) -> None:
    """A fence set to text and a key of the wrong type: clear errors for those tasks only.

    The owner's background write meets the text fence (it used to end the
    daemon); the task keeps being answered from memory, flush names the key,
    another task is served, and once the key is fixed the write goes through.
    """
    with fleet_daemon(tmp_path / "a", redis_server, "--debounce-ms", "50") as daemon:
        ok(set_range(daemon, "t", 3))
        ok(daemon.call("flush", {"task": "t"}))
        _redis_command(redis_server, "SET", "ctxwin:{t}:fence", "abc")
        ok(set_range(daemon, "t", 4))  # its background write meets the bad fence
        wait_until(lambda: "write_failed" in daemon.log(), 10, "the background write is tried")
        flushed = daemon.call("flush", {"task": "t"})
        assert not flushed.ok
        assert "ctxwin:{t}:fence does not hold a fence" in (flushed.message or "")
        ok(set_range(daemon, "u", 5))  # other tasks are served
        assert ok(daemon.call("inspect", {"task": "u"}))["deleted_range"] == [2, 5]
        _redis_command(redis_server, "HSET", "ctxwin:{v}:state", "f", "x")
        refused = set_range(daemon, "v", 5)
        assert (refused.ok, refused.code) == (False, "busy")
        assert "ctxwin:{v}:state is a hash, not a string" in (refused.message or "")
        assert ok(daemon.call("ping"))["features"]
        _redis_command(redis_server, "SET", "ctxwin:{t}:fence", "1")  # an operator fixes it
        ok(daemon.call("flush", {"task": "t"}))
        assert (stored(redis_server, "t") or {})["deleted_range"] == [2, 4]
        _redis_command(redis_server, "DEL", "ctxwin:{v}:state")
        ok(set_range(daemon, "v", 6))
        assert ok(daemon.call("inspect", {"task": "v"}))["deleted_range"] == [2, 6]


def test_a_store_password_in_the_url_is_shown_to_no_client(tmp_path: Path) -> None:
    """A Redis password as ?password= in the config file: used, never in stats, inspect or logs."""
    import shutil
    import tempfile

    require_redis_server()
    root = Path(tempfile.mkdtemp(prefix="ctxwin-redis-"))
    secret = "hunter2-in-the-url"
    try:
        with RedisServer(root, "--requirepass", secret) as server:
            config = tmp_path / "ctxwin"
            config.mkdir()
            url = f"{server.url}?password={secret}"
            (config / "config.toml").write_text(f'state_store = "{url}"\n')
            env = {"XDG_CONFIG_HOME": str(tmp_path)}
            (tmp_path / "a").mkdir()
            with DaemonProcess(tmp_path / "a", env=env) as daemon:
                ok(set_range(daemon, "t", 3))
                ok(daemon.call("flush", {"task": "t"}))  # the password was used
                stats = ok(daemon.call("stats"))
                shown = ok(daemon.call("inspect", {"task": "t"}))
                assert stats["store"]["url"] == f"{server.url}?password=***"
                for text in (json.dumps(stats), json.dumps(shown), daemon.log()):
                    assert secret not in text
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_clients_follow_owned_elsewhere_once(tmp_path: Path, redis_server: RedisServer) -> None:
    """A client of B asking for A's task is moved to A by itself, blocking and asyncio alike."""
    from ctxwin.client import AsyncClient, Client

    with (
        fleet_daemon(tmp_path / "a", redis_server) as first,
        fleet_daemon(tmp_path / "b", redis_server) as second,
    ):
        ok(set_range(first, "t", 4))
        with Client(second.endpoint, timeout=10) as client:
            shown = client.inspect("t")
            assert (shown["deleted_range"], client.endpoint) == ([2, 4], first.endpoint)

        async def asynchronous() -> tuple[Any, str]:
            async with AsyncClient(second.endpoint, timeout=10) as client:
                result = await client.truncated_messages("t", FIRST, deleted_range=[2, 6])
                return result, client.endpoint

        result, endpoint = asyncio.run(asynchronous())
        assert (result["messages"], endpoint) == (FIRST, first.endpoint)
        assert ok(first.call("inspect", {"task": "t"}))["deleted_range"] == [2, 6]


def test_hand_over_under_chaos_keeps_one_writer() -> None:
    """Owner paused past the TTL and killed once: fences and states only move forward."""
    from bench.reliability import fleet

    require_redis_server()
    summary = fleet.run(pauses=1, kills=1, ttl_ms=500, flush_every=5, control=False, seed=3)
    assert summary["passed"], summary
    assert summary["writes_refused_by_fence"] >= 1, summary  # a stale owner did try
    assert len(summary["fences_seen"]) >= 3, summary  # two hand-overs


def test_the_chaos_acts_only_on_an_owner_that_acknowledged_a_change(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No owner between two leases, then an owner that refuses (its lease lapsed under load):
    the chaos asks again until an owner acknowledges, or says it could not act."""
    from bench.reliability import fleet

    daemon = DaemonProcess(tmp_path)
    daemon.proc = object()  # type: ignore[assignment]  # never started: only its endpoint is used
    owners: list[DaemonProcess | None] = [None, daemon, daemon]
    replies = [
        proto.Reply(1, False, None, "actor_stopped", "lease lapsed"),
        proto.Reply(2, True, {}),
    ]
    asked: list[tuple[str, Any]] = []

    class Cluster:
        def owner(self) -> DaemonProcess | None:
            return owners.pop(0) if len(owners) > 1 else owners[0]

    def call(endpoint: str, op: str, args: Any, timeout: float) -> proto.Reply:
        asked.append((endpoint, args["deleted_range"]))
        return replies.pop(0)

    monkeypatch.setattr(fleet, "call", call)
    writer = fleet.Writer([daemon], 5, step=7)
    assert (daemon, 8) == fleet.acknowledged(Cluster(), writer, 10)  # type: ignore[arg-type]
    assert [(daemon.endpoint, [2, 10]), (daemon.endpoint, [2, 10])] == asked
    assert 8 == writer.step
    replies.extend([proto.Reply(3, False, None, "owned_elsewhere", "moved")] * 1000)
    assert fleet.acknowledged(Cluster(), writer, 0.2) is None  # type: ignore[arg-type]
    assert 8 == writer.step


def test_the_same_chaos_without_the_fence_check_fails() -> None:
    """Control: with Redis accepting every write, a resumed owner's stale state lands."""
    from bench.reliability import fleet

    require_redis_server()
    summary = fleet.run(pauses=1, kills=0, ttl_ms=500, flush_every=5, control=True, seed=3)
    assert not summary["passed"]
    assert summary["state_went_back"], summary


@pytest.mark.parametrize("fault", ["kill", "unreachable", "oom"])
def test_store_faults_fail_no_request_and_writes_resume(fault: str, tmp_path: Path) -> None:
    """Redis killed, stopped 2 s or out of memory: answers go on, flush says why, writes resume."""
    from bench.reliability import fleet_faults

    require_redis_server()
    if fault == "kill":
        result = fleet_faults.kill_fault(tmp_path)
    elif fault == "unreachable":
        result = fleet_faults.unreachable_fault(tmp_path, 2.0)
    else:
        result = fleet_faults.oom_fault(tmp_path)
    assert result["passed"], result
