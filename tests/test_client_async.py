"""The AsyncClient against the real daemon: every op, AsyncTask, concurrency, recovery."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import pytest

from ctxwin.client import (
    AsyncClient,
    BusyError,
    Call,
    InvalidTaskIdError,
    RequestTimeoutError,
    RetryPolicy,
    UnknownOpError,
)
from tests._client_data import MODEL, PONG, conversation, with_duplicate_reads
from tests._daemon import DaemonFactory, DaemonProcess

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def shared(daemon_factory: DaemonFactory) -> DaemonProcess:
    """The shared daemon, for the tests that do not disturb it."""
    return daemon_factory()


@pytest.fixture
async def client(shared: DaemonProcess) -> AsyncIterator[AsyncClient]:
    """An asyncio client of the shared daemon."""
    async with AsyncClient(shared.endpoint, timeout=10) as connected:
        yield connected


async def test_ping_stats_window_and_counts(client: AsyncClient) -> None:
    """ping, stats, context_window_info, should_compact, next_truncation_range, count_tokens."""
    assert PONG == (await client.ping())
    assert (await client.stats())["requests"] >= 1
    assert 37000 == (await client.context_window_info(MODEL))["max_allowed_size"]
    assert (await client.should_compact({"tokens_in": 37000}, MODEL))["compact"] is True
    assert {"deleted_range": [2, 7]} == await client.next_truncation_range(
        conversation(4)[:11], None, "quarter"
    )
    assert {"tokens": 2} == await client.count_tokens(text="hello world")
    assert (await client.count_tokens(conversation(1)))["tokens"] > 0


async def test_task_ops(client: AsyncClient) -> None:
    """The task ops of the wire table, in an agent's order."""
    task = "async-ops"
    messages = conversation(10)
    prepared = await client.prepare_request(
        task, messages, MODEL, previous_request={"ts": 1, "tokens_in": 40000}
    )
    assert ([2, 11], True) == (prepared["deleted_range"], prepared["range_updated"])
    assert 12 == len((await client.truncated_messages(task, messages))["messages"])
    assert (await client.optimize_file_reads(task, messages, ts=2))["changed"] is False
    memory = await client.optimize_file_reads_in_memory(
        "async-mem", with_duplicate_reads(), ts=2, deleted_range=None
    )
    assert memory["changed"] is True
    assert (await client.compact_subagent("async-sub", messages, ephemeral=True))["compacted"]
    assert (await client.apply_truncation_notice(task, messages, ts=3))["changed"] is True
    assert [2, 17] == (await client.compact(task, messages, "quarter", ts=4))["deleted_range"]
    assert {"deleted_range": [2, 19]} == await client.condensed(task, messages)
    inspected = await client.inspect(task)
    assert [2, 19] == inspected["deleted_range"]
    assert (await client.rollback(task, 0))["removed"] >= 1
    assert (await client.flush(task))["flushed"] >= 0
    assert (await client.flush())["flushed"] >= 0
    assert {"closed": True, "loaded": True} == await client.close_task(task)


async def test_async_task_handle(client: AsyncClient) -> None:
    """Every AsyncTask method is the op for its task id; ephemeral tasks stay in memory."""
    task = client.task("async-handle", ephemeral=True)
    messages = conversation(10)
    assert (await task.prepare_request(messages, MODEL))["range_updated"] is False
    assert (await task.should_compact({"tokens_in": 1}, MODEL))["compact"] is False
    assert len(messages) == len((await task.truncated_messages(messages))["messages"])
    assert (await task.optimize_file_reads(messages, ts=1))["changed"] is False
    assert (await task.optimize_file_reads_in_memory(messages, ts=1))["changed"] is False
    assert (await task.compact_subagent(messages))["compacted"] is True
    assert (await task.apply_truncation_notice(messages, ts=2))["changed"] is True
    assert (await task.compact(messages, ts=3))["deleted_range"] is not None
    assert (await task.condensed(messages))["deleted_range"] is not None
    assert (await task.rollback(1))["removed"] >= 1
    assert [] == (await task.inspect())["updates"]
    assert (await task.flush())["flushed"] >= 0
    assert {"closed": True, "loaded": True} == await task.close()


async def test_many_requests_in_flight_on_one_socket(client: AsyncClient) -> None:
    """Fifty concurrent calls over several tasks each get their own answer."""
    texts = [" ".join(["word"] * n) for n in range(1, 51)]
    counts = await asyncio.gather(*(client.count_tokens(text=text) for text in texts))
    assert [{"tokens": n} for n in range(1, 51)] == counts
    views = await asyncio.gather(
        *(client.truncated_messages(f"async-many-{n % 5}", conversation(n)) for n in range(1, 21))
    )
    assert [2 + 2 * n for n in range(1, 21)] == [len(view["messages"]) for view in views]


async def test_errors_map_to_their_classes(client: AsyncClient) -> None:
    """Daemon errors are raised as their CtxwinError subclasses by the async client too."""
    with pytest.raises(UnknownOpError):
        await client.call(Call("no_such_op", {}))
    with pytest.raises(InvalidTaskIdError) as caught:
        await client.call(Call("close", {"task": "-bad"}))
    assert caught.value.local is False


async def test_busy_replies_are_retried_then_surface(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """With a one-slot mailbox, a burst on one task meets busy: retried by default, else raised."""
    daemon = DaemonProcess(tmp_path_factory.mktemp("busy"), "--mailbox-size", "1")
    daemon.start()
    messages = with_duplicate_reads(copies=6, size=20_000)
    try:
        async with AsyncClient(daemon.endpoint, retry=RetryPolicy(busy_retries=0)) as eager:
            outcomes: list[object] = []
            for _ in range(5):  # a burst that happens to trickle in may find the slot free
                outcomes += await asyncio.gather(
                    *(eager.optimize_file_reads_in_memory("burst", messages) for _ in range(30)),
                    return_exceptions=True,
                )
                if any(isinstance(outcome, BusyError) for outcome in outcomes):
                    break
        assert any(isinstance(outcome, BusyError) for outcome in outcomes)
        assert all(isinstance(outcome, BusyError | dict) for outcome in outcomes)
        patient = RetryPolicy(busy_retries=50, initial_delay=0.01, max_delay=0.05)
        async with AsyncClient(daemon.endpoint, retry=patient, timeout=30) as client:
            results = await asyncio.gather(
                *(client.optimize_file_reads_in_memory("burst", messages) for _ in range(30))
            )
        assert 30 == len(results)
    finally:
        daemon.stop()


async def test_timeout_then_recovery(daemon: DaemonProcess) -> None:
    """A frozen daemon makes a call time out; once it runs again the client works."""
    assert daemon.proc is not None
    async with AsyncClient(daemon.endpoint, timeout=10) as client:
        assert (await client.ping())["pong"]
        os.kill(daemon.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(RequestTimeoutError):
                await client.ping(timeout=0.3)
        finally:
            os.kill(daemon.proc.pid, signal.SIGCONT)
        assert {"tokens": 1} == await client.count_tokens(text="hello")


async def test_reconnects_after_a_daemon_restart(daemon: DaemonProcess) -> None:
    """The same async client keeps working after the daemon restarts."""
    async with AsyncClient(daemon.endpoint, timeout=20) as client:
        await client.compact("async-restart", conversation(10), "quarter", ts=1)
        await client.flush("async-restart")
        await asyncio.to_thread(daemon.restart)
        assert [2, 15] == (await client.inspect("async-restart"))["deleted_range"]


async def test_works_inside_anyio_task_groups(client: AsyncClient) -> None:
    """Calls started from an anyio task group share the client and finish in time."""
    import anyio

    results: dict[int, int] = {}

    async def count(n: int) -> None:
        results[n] = (await client.count_tokens(text=" ".join(["word"] * n)))["tokens"]

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            for n in range(1, 9):
                group.start_soon(count, n)
    assert {n: n for n in range(1, 9)} == results


async def test_a_cancellation_during_aclose_is_not_swallowed(client: AsyncClient) -> None:
    """A task cancelled while it closes its client stops there, as cancelled."""
    own = AsyncClient(client.endpoint, timeout=5)
    went_on = False

    async def use_and_close() -> None:
        nonlocal went_on
        await own.ping()
        await own.aclose()
        went_on = True

    task = asyncio.create_task(use_and_close())
    for _ in range(10_000):  # until the task is inside aclose()
        if own.closed:
            break
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not went_on


def test_a_client_outlives_an_event_loop_closed_under_it(shared: DaemonProcess) -> None:
    """First used on a loop closed without cancelling its tasks, the client works on the next."""
    client = AsyncClient(shared.endpoint, timeout=5)
    loop = asyncio.new_event_loop()
    assert loop.run_until_complete(client.ping())["pong"] is True
    loop.close()
    assert asyncio.run(client.ping())["pong"] is True
    assert asyncio.run(client.ping())["pong"] is True
    asyncio.run(client.aclose())
