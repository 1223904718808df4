"""Client transport edge cases against a scripted ROUTER: timeouts, late replies, busy, order."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from ctxwin import proto
from ctxwin.client import (
    AsyncClient,
    BadRequestError,
    BusyError,
    Client,
    ClientClosedError,
    RequestTimeoutError,
    RetryPolicy,
    TooLargeError,
)
from tests._client_fake import FakeRouter, error, ok

FAST = RetryPolicy(busy_retries=3, initial_delay=0.001, max_delay=0.002)


def test_sync_late_reply_is_never_taken_for_the_next_one(tmp_path: Path) -> None:
    """A reply that arrives after its call timed out is not returned to the next call."""
    seen: list[proto.Request] = []

    def handler(request: proto.Request) -> list[bytes]:
        seen.append(request)
        if len(seen) == 1:
            return []  # first request: silence, so the call times out
        if len(seen) == 2:  # answer the timed-out one now, then this one
            late = ok(seen[0], {"tokens": 111})
            return late + ok(request, {"tokens": 222})
        return ok(request, {"tokens": 333})

    with FakeRouter(tmp_path, handler) as fake, Client(fake.endpoint) as client:
        with pytest.raises(RequestTimeoutError):
            client.count_tokens(text="a", timeout=0.2)
        assert {"tokens": 222} == client.count_tokens(text="b")
        assert {"tokens": 333} == client.count_tokens(text="c")


def test_sync_busy_is_retried_then_succeeds(tmp_path: Path) -> None:
    """Two busy replies then a result: the call returns the result after three sends."""

    def handler(request: proto.Request) -> list[bytes]:
        return error(request, "busy") if len(fake.requests) <= 2 else ok(request)

    with FakeRouter(tmp_path, handler) as fake, Client(fake.endpoint, retry=FAST) as client:
        assert client.ping()["pong"] is True
        assert 3 == len(fake.requests)


def test_sync_busy_forever_raises_busy_after_bounded_retries(tmp_path: Path) -> None:
    """A daemon that stays busy gets 1 + busy_retries sends, then BusyError."""
    with (
        FakeRouter(tmp_path, lambda request: error(request, "busy")) as fake,
        Client(fake.endpoint, retry=FAST) as client,
    ):
        with pytest.raises(BusyError):
            client.ping()
        assert 4 == len(fake.requests)


def test_sync_reconnects_to_a_new_daemon_on_the_same_endpoint(tmp_path: Path) -> None:
    """After the server goes away and another binds the endpoint, the same client gets answers."""
    with Client(f"ipc://{tmp_path / 'fake.sock'}", timeout=5) as client:
        with FakeRouter(tmp_path, ok):
            assert client.ping()["pong"]
        with FakeRouter(tmp_path, ok):
            assert client.ping()["pong"]


def test_sync_idless_error_reaches_the_lone_caller(tmp_path: Path) -> None:
    """An error reply without id is delivered to the only request in flight."""

    def handler(request: proto.Request) -> list[bytes]:
        return [proto.encode_error(None, "bad_request", "unreadable")]

    with (
        FakeRouter(tmp_path, handler) as fake,
        Client(fake.endpoint) as client,
        pytest.raises(BadRequestError, match="unreadable"),
    ):
        client.ping()


def test_sync_oversize_request_fails_without_sending(tmp_path: Path) -> None:
    """A request over the frame limit raises TooLargeError and never reaches the server."""
    with FakeRouter(tmp_path, ok) as fake, Client(fake.endpoint) as client:
        with pytest.raises(TooLargeError):
            client.count_tokens(text="x" * (proto.DEFAULT_MAX_BYTES + 1))
        assert [] == fake.requests


def test_sync_closed_client_refuses_calls(tmp_path: Path) -> None:
    """Calls after close() raise ClientClosedError."""
    client = Client(f"ipc://{tmp_path / 'x.sock'}")
    client.close()
    with pytest.raises(ClientClosedError):
        client.ping()


@pytest.mark.anyio
async def test_async_many_in_flight_get_their_own_replies(tmp_path: Path) -> None:
    """Ten concurrent calls answered in reverse order each get the reply to their own request."""
    held: list[proto.Request] = []

    def handler(request: proto.Request) -> list[bytes]:
        held.append(request)
        if len(held) < 10:
            return []
        return [
            reply
            for waiting in reversed(held)
            for reply in ok(waiting, {"tokens": len(waiting.args["text"])})
        ]

    with FakeRouter(tmp_path, handler) as fake:
        async with AsyncClient(fake.endpoint, timeout=5) as client:
            results = await asyncio.gather(
                *(client.count_tokens(text="x" * n) for n in range(1, 11))
            )
    assert [{"tokens": n} for n in range(1, 11)] == results


@pytest.mark.anyio
async def test_async_timeout_then_late_reply_is_dropped(tmp_path: Path) -> None:
    """A timed-out async call's late reply is dropped and the next call gets its own."""
    seen: list[proto.Request] = []

    def handler(request: proto.Request) -> list[bytes]:
        seen.append(request)
        if len(seen) == 1:
            return []
        return ok(seen[0], {"tokens": 1}) + ok(request, {"tokens": 2})

    with FakeRouter(tmp_path, handler) as fake:
        async with AsyncClient(fake.endpoint) as client:
            with pytest.raises(RequestTimeoutError):
                await client.count_tokens(text="a", timeout=0.2)
            assert {"tokens": 2} == await client.count_tokens(text="b", timeout=5)


@pytest.mark.anyio
async def test_async_busy_is_retried(tmp_path: Path) -> None:
    """The async client retries busy like the blocking one."""

    def handler(request: proto.Request) -> list[bytes]:
        return error(request, "busy") if len(fake.requests) == 1 else ok(request)

    with FakeRouter(tmp_path, handler) as fake:
        async with AsyncClient(fake.endpoint, retry=FAST) as client:
            assert (await client.ping())["pong"] is True
    assert 2 == len(fake.requests)


@pytest.mark.anyio
async def test_async_closing_fails_calls_in_flight(tmp_path: Path) -> None:
    """aclose() while a call waits makes it raise ClientClosedError."""
    arrived = threading.Event()

    def handler(request: proto.Request) -> list[bytes]:
        arrived.set()
        return []

    with FakeRouter(tmp_path, handler) as fake:
        client = AsyncClient(fake.endpoint)
        waiting = asyncio.ensure_future(client.ping(timeout=10))
        assert await asyncio.to_thread(arrived.wait, 5)
        await client.aclose()
        with pytest.raises(ClientClosedError):
            await waiting


@pytest.mark.anyio
async def test_async_cancelled_call_leaves_the_client_usable(tmp_path: Path) -> None:
    """A call cancelled from outside (a cancel scope) is forgotten; later calls work."""
    import anyio

    def handler(request: proto.Request) -> list[bytes]:
        return [] if request.op == "stats" else ok(request)

    with FakeRouter(tmp_path, handler) as fake:
        async with AsyncClient(fake.endpoint, timeout=10) as client:
            with anyio.move_on_after(0.2) as scope:
                await client.stats()
            assert scope.cancelled_caught
            assert {} == client._wire.pending
            assert (await client.ping())["pong"] is True


def test_async_client_moves_to_a_new_event_loop(tmp_path: Path) -> None:
    """An AsyncClient used under one asyncio.run and then another still answers."""
    with FakeRouter(tmp_path, ok) as fake:
        client = AsyncClient(fake.endpoint, timeout=5)

        async def ping() -> bool:
            return (await client.ping())["pong"]

        assert asyncio.run(ping()) is True
        assert asyncio.run(ping()) is True
        asyncio.run(client.aclose())
