"""The Redis store's faults: the server killed, unreachable, out of memory.

Usage (from the repository root)::

    .venv/bin/python -m bench.reliability.fleet_faults [--outage-s 10] [--json]

One ``ctxwind`` with ``--state-store`` on a real redis-server (AOF,
``appendfsync always``), one task changed step by step (``rollback`` with
``deleted_range [2, 2 + i]``). Each fault:

- ``kill``: redis-server killed with -9, then started again on its AOF;
- ``unreachable``: redis-server stopped with SIGSTOP for ``--outage-s``
  seconds, then resumed; the lease TTL is three times that (10 s at least), so
  that the outage, with the flush that waits out its timeouts inside it,
  stays shorter than the lease;
- ``oom``: ``maxmemory`` set just above what is used, ``noeviction``, and
  filled up; then room made again.

While the fault lasts, every change is answered (and its latency kept), a
``ping`` is answered, and ``flush`` answers an error that says why. After it,
``flush`` succeeds and Redis holds the last step.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import redis

from bench.reliability._harness import arguments, finish, latency_summary, machine, scratch
from tests._daemon import DaemonProcess, call
from tests._redis import RedisServer

TASK = "faulty"


class Run:
    """A redis-server, one daemon on it, and the task's steps."""

    def __init__(self, root: Path, ttl_ms: int) -> None:
        self.server = RedisServer(root / "redis")
        self.server.start()
        (root / "d").mkdir()
        self.daemon = DaemonProcess(
            root / "d", "--state-store", self.server.url, "--lease-ttl-ms", str(ttl_ms)
        )
        self.daemon.start()
        self.step = 0
        self.latencies: list[float] = []
        self.errors: list[str] = []

    def change(self) -> None:
        """One step; its latency is kept, a refusal noted."""
        self.step += 1
        args = {"task": TASK, "ts": 0, "deleted_range": [2, 2 + self.step]}
        started = time.monotonic()
        reply = call(self.daemon.endpoint, "rollback", args, timeout=10)
        self.latencies.append(time.monotonic() - started)
        if not reply.ok:
            self.errors.append(f"step {self.step}: {reply.code}: {reply.message}")

    def flush(self) -> tuple[bool, str]:
        """Flush the task: (acknowledged, the error message otherwise); busy is retried."""
        for attempt in range(20):
            reply = call(self.daemon.endpoint, "flush", {"task": TASK}, timeout=15)
            if reply.code != "busy":
                break
            time.sleep(0.05 * 2 ** min(attempt, 4))
        return reply.ok, reply.message or ""

    def stored_step(self) -> int:
        """The step Redis holds."""
        client = redis.Redis(unix_socket_path=str(self.server.socket))
        try:
            raw = cast(bytes | None, client.get(f"ctxwin:{{{TASK}}}:state"))
        finally:
            client.close()
        if raw is None:
            return 0
        deleted = json.loads(raw)["deleted_range"]
        return int(deleted[1]) - 2 if deleted else 0

    def close(self) -> int:
        code = self.daemon.stop()
        self.server.stop()
        return code


@contextlib.contextmanager
def running(root: Path, ttl_ms: int) -> Iterator[Run]:
    """A run, stopped on the way out."""
    run = Run(root, ttl_ms)
    try:
        yield run
    finally:
        with contextlib.suppress(Exception):
            run.server.resume()
        run.close()


def during(
    run: Run, start: Callable[[], None], end: Callable[[], None], seconds: float
) -> dict[str, Any]:
    """Changes and a flush while the fault lasts, then a flush after it."""
    for _ in range(5):
        run.change()
    before_ok, _ = run.flush()
    start()
    run.latencies.clear()
    deadline = time.monotonic() + seconds
    changes = 0
    pings = 0
    while True:
        run.change()
        changes += 1
        pings += call(run.daemon.endpoint, "ping", timeout=5).ok
        if time.monotonic() >= deadline:
            break
    flush_ok, why = run.flush()
    alive = call(run.daemon.endpoint, "ping", timeout=5).ok
    end()
    after_ok, after_why = run.flush()
    stored = run.stored_step()
    return {
        "flushed_before": before_ok,
        "changes_during": changes,
        "changes_refused_during": len(run.errors),
        "change_latency_during": latency_summary(run.latencies),
        "pings_answered_during": pings,
        "flush_during_ok": flush_ok,
        "flush_during_says": why[:200],
        "daemon_answering": alive,
        "flush_after_ok": after_ok,
        "flush_after_says": after_why[:200],
        "last_step": run.step,
        "stored_step_after": stored,
        "errors": run.errors[:5],
        "passed": (
            before_ok
            and not run.errors
            and not flush_ok
            and bool(why)
            and alive
            and after_ok
            and stored == run.step
        ),
    }


def kill_fault(root: Path) -> dict[str, Any]:
    """redis-server killed with -9, restarted on its AOF."""
    with running(root, 10_000) as run:
        result = during(run, run.server.kill, run.server.start, 1.0)
        return result


def unreachable_fault(root: Path, seconds: float) -> dict[str, Any]:
    """redis-server stopped (SIGSTOP) for ``seconds``, then resumed."""
    with running(root, max(10_000, int(seconds * 3000))) as run:
        return during(run, run.server.pause, run.server.resume, seconds)


def oom_fault(root: Path) -> dict[str, Any]:
    """maxmemory just above what is used, noeviction, filled; then room made again."""
    with running(root, 10_000) as run:
        client = redis.Redis(unix_socket_path=str(run.server.socket))

        def used() -> int:
            return int(client.info("memory")["used_memory"])

        def fill() -> None:
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", str(used() + 256 * 1024))
            with contextlib.suppress(redis.exceptions.ResponseError):
                for index in range(10_000):
                    client.set(f"ballast:{index}", b"x" * 16384)
            # Full: below what is used now, so that every write is refused.
            client.config_set("maxmemory", str(used() - 64 * 1024))

        def make_room() -> None:
            client.config_set("maxmemory", "0")

        try:
            return during(run, fill, make_room, 1.0)
        finally:
            client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--outage-s", type=float, default=10.0, help="unreachable for (10)")
    args = parser.parse_args(argv)
    with scratch("ctxwin-fleet-faults-") as root:
        summary: dict[str, Any] = {"machine": machine()}
        summary["kill"] = kill_fault(root / "kill")
        summary["unreachable"] = unreachable_fault(root / "unreachable", args.outage_s)
        summary["oom"] = oom_fault(root / "oom")
    summary["passed"] = all(summary[name]["passed"] for name in ("kill", "unreachable", "oom"))
    return finish("fleet_faults", summary, args.json)


if __name__ == "__main__":
    sys.exit(main())
