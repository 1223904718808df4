"""Load across a fleet: three daemons, 300 tasks in one Redis, tasks moving between daemons.

Usage (from the repository root)::

    .venv/bin/python -m bench.reliability.fleet_load [--daemons 3] [--tasks 300]
        [--seconds 60] [--workers 6] [--json]

``--workers`` threads each own a share of the tasks and, until the time is
up, pick one of them and a daemon at random and send the task's next step
(``rollback`` with ``deleted_range [2, 2 + i]``) there, following
``owned_elsewhere`` to the owner; every fifth step of a task is a ``flush``,
and one step in ten is followed by ``close`` on the owner, which frees the
task: its next step, on whichever daemon is picked, moves it there. At the end
the daemons get SIGTERM, and every task's state in Redis must hold its last
acknowledged step (every change acknowledged, not only the flushed ones: a
clean stop writes everything). Any error reply or unanswered request counts.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from bench.reliability._harness import arguments, finish, latency_summary, machine, scratch
from ctxwin import proto
from tests._daemon import DaemonProcess, call
from tests._redis import RedisServer


@dataclass
class Worker:
    """One client thread and its tasks."""

    endpoints: list[str]
    tasks: list[str]
    seed: int
    steps: dict[str, int] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    requests: int = 0
    followed: int = 0
    moves: int = 0

    def send(self, endpoint: str, op: str, args: dict[str, Any]) -> proto.Reply | None:
        for _ in range(3):
            self.requests += 1
            started = time.perf_counter()
            try:
                reply = call(endpoint, op, args, timeout=10)
            except TimeoutError:
                self.errors.append(f"{op} {args.get('task')}: no answer from {endpoint}")
                return None
            self.latencies.append(time.perf_counter() - started)
            if reply.code == "owned_elsewhere" and reply.owner:
                self.followed += 1
                endpoint = reply.owner
                continue
            if not reply.ok:
                self.errors.append(f"{op} {args.get('task')}: {reply.code}: {reply.message}")
                return None
            self.owners[str(args.get("task"))] = endpoint
            return reply
        self.errors.append(f"{op} {args.get('task')}: referred on too often")
        return None

    def run(self, until: float) -> None:
        rng = random.Random(self.seed)
        while time.monotonic() < until:
            task = rng.choice(self.tasks)
            endpoint = rng.choice(self.endpoints)
            step = self.steps.get(task, 0) + 1
            previous_owner = self.owners.get(task)
            args = {"task": task, "ts": 0, "deleted_range": [2, 2 + step]}
            if self.send(endpoint, "rollback", args) is None:
                continue
            self.steps[task] = step
            owner = self.owners[task]
            if previous_owner is not None and owner != previous_owner:
                self.moves += 1
            if step % 5 == 0:
                self.send(owner, "flush", {"task": task})
            if rng.random() < 0.1:
                self.send(owner, "close", {"task": task})


def run(daemons: int, tasks: int, seconds: float, workers: int, seed: int) -> dict[str, Any]:
    """The load run; the summary with ``passed``."""
    started = time.monotonic()
    with scratch("ctxwin-fleet-load-") as root:
        server = RedisServer(root / "redis")
        server.start()
        fleet: list[DaemonProcess] = []
        try:
            for index in range(daemons):
                (root / f"d{index}").mkdir()
                daemon = DaemonProcess(
                    root / f"d{index}", "--state-store", server.url, "--log-level", "warning"
                )
                daemon.start()
                fleet.append(daemon)
            names = [f"load-{index}" for index in range(tasks)]
            endpoints = [daemon.endpoint for daemon in fleet]
            crew = [
                Worker(endpoints, names[index::workers], seed + index) for index in range(workers)
            ]
            until = time.monotonic() + seconds
            threads = [threading.Thread(target=worker.run, args=(until,)) for worker in crew]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            codes = [daemon.stop() for daemon in fleet]
            client = redis.Redis(unix_socket_path=str(server.socket))
            lost: list[str] = []
            for worker in crew:
                for task, step in worker.steps.items():
                    raw = cast(bytes | None, client.get(f"ctxwin:{{{task}}}:state"))
                    stored = json.loads(raw)["deleted_range"][1] - 2 if raw else 0
                    if stored != step:
                        lost.append(f"{task}: acknowledged step {step}, Redis holds {stored}")
            leases = len(cast(list[bytes], client.keys("ctxwin:*:lease")))
            client.close()
        finally:
            for daemon in fleet:
                daemon.stop()
            server.stop()
    errors = [error for worker in crew for error in worker.errors]
    latencies = [value for worker in crew for value in worker.latencies]
    return {
        "machine": machine(),
        "daemons": daemons,
        "tasks": tasks,
        "tasks_used": sum(len(worker.steps) for worker in crew),
        "seconds": round(time.monotonic() - started, 1),
        "requests": sum(worker.requests for worker in crew),
        "steps_acknowledged": sum(sum(worker.steps.values()) for worker in crew),
        "requests_followed": sum(worker.followed for worker in crew),
        "task_moves": sum(worker.moves for worker in crew),
        "request_latency": latency_summary(latencies),
        "errors": len(errors),
        "first_errors": errors[:10],
        "acknowledged_changes_lost": len(lost),
        "first_lost": lost[:10],
        "leases_left_after_stop": leases,
        "exit_codes": codes,
        "passed": not errors and not lost and leases == 0 and all(code == 0 for code in codes),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--daemons", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    summary = run(args.daemons, args.tasks, args.seconds, args.workers, args.seed)
    return finish("fleet_load", summary, args.json)


if __name__ == "__main__":
    sys.exit(main())
