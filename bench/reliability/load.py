"""Many clients and tasks, mixed ops: zero errors, latency per op, memory per actor, eviction.

Usage (from the repository root)::

    .venv/bin/python -m bench.reliability.load [--quick] [--clients 50] [--tasks 500]
        [--seconds 60] [--think-ms 20] [--idle-tasks 2000] [--evict-tasks 10000]
        [--evict-idle-timeout 20] [--settle 8] [--compare] [--parts ...] [--json]

Three parts, each on a fresh daemon:

1. *mixed*: ``--clients`` processes share ``--tasks`` tasks (each owns an equal
   slice) and for ``--seconds`` send, with ``--think-ms`` between requests,
   a weighted mix of prepare_request, truncated_messages, optimize_file_reads,
   apply_truncation_notice, inspect, flush, count_tokens, should_compact and
   ping. Every reply must be ``ok``; p50/p99 per op and the request rate are
   reported.
2. *idle actors*: ``--idle-tasks`` tasks are opened (one change each) and
   flushed; the daemon's RSS growth divided by the task count is the memory
   per idle actor.
3. *eviction*: with ``--idle-timeout 20`` (``--evict-idle-timeout``, longer than
   opening takes, so that all are alive at once), ``--evict-tasks`` tasks are opened as
   fast as 4 pipelining clients can; the peak RSS (VmHWM) is read, then the
   script waits until ``stats`` shows no actor left, reads the RSS, waits
   ``--settle`` seconds (the daemon gives memory back a few seconds after a
   sweep that stopped many actors) and reads it again: it must have come back
   down (at least half of the growth returned). A second wave of as many
   other tasks follows, to tell memory kept for reuse from memory leaked;
   with ``--compare`` the whole part runs again with ``MALLOC_ARENA_MAX=2``.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import zmq

from bench.reliability._harness import (
    MODEL,
    REPO,
    Client,
    Daemon,
    arguments,
    finish,
    latency_summary,
    machine,
    proc_status_kb,
    role_argv,
    scratch,
)
from ctxwin import proto

WEIGHTS = {
    "prepare_request": 20,
    "truncated_messages": 20,
    "optimize_file_reads": 8,
    "apply_truncation_notice": 8,
    "inspect": 10,
    "flush": 4,
    "count_tokens": 10,
    "should_compact": 10,
    "ping": 10,
}


def _messages(seed: int) -> list[dict[str, Any]]:
    """A conversation of about 20 messages with repeated file reads (SPEC.md §6 material)."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": f"Task {seed}: tidy the module."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Reading it."}]},
    ]
    for turn in range(9):
        body = f"def f{turn}():\n    return {seed + turn}\n" * 20
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": f"[read_file for 'src/mod{turn % 3}.py'] Result:\n"
                        f"<file><path>src/mod{turn % 3}.py</path><content>{body}</content></file>",
                    }
                ],
            }
        )
        messages.append({"role": "assistant", "content": f"turn {turn} " + "ok " * 30})
    return messages


def _args(op: str, task: str, messages: list[dict[str, Any]], ts: int) -> dict[str, Any]:
    if op == "prepare_request":
        return {"task": task, "messages": messages, "model": MODEL}
    if op in ("truncated_messages",):
        return {"task": task, "messages": messages}
    if op in ("optimize_file_reads", "apply_truncation_notice"):
        return {"task": task, "messages": messages, "ts": ts}
    if op in ("inspect", "flush"):
        return {"task": task}
    if op == "count_tokens":
        return {"messages": messages}
    if op == "should_compact":
        return {"usage": {"ts": ts, "tokens_in": 1000 + ts % 5000}, "model": MODEL}
    return {}


def client_worker(
    endpoint: str, tasks: list[str], seconds: float, think_ms: float, seed: int
) -> None:
    """Send the weighted mix until ``seconds`` pass; print latencies and errors as JSON."""
    rng = random.Random(seed)
    ops = list(WEIGHTS)
    weights = [WEIGHTS[op] for op in ops]
    conversations = {task: _messages(index + seed) for index, task in enumerate(tasks)}
    client = Client(endpoint)
    latencies: dict[str, list[float]] = {op: [] for op in ops}
    errors: dict[str, int] = {}
    ts = 1
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            op = rng.choices(ops, weights)[0]
            task = rng.choice(tasks)
            ts += 1
            args = _args(op, task, conversations[task], ts)
            started = time.perf_counter()
            try:
                reply = client.call(op, args, timeout=30)
            except TimeoutError:
                errors["timeout"] = errors.get("timeout", 0) + 1
                client.reset()
                continue
            elapsed = time.perf_counter() - started
            if reply.ok:
                latencies[op].append(elapsed)
            else:
                key = f"{op}:{reply.code}"
                errors[key] = errors.get(key, 0) + 1
            if think_ms:
                time.sleep(think_ms / 1000)
    finally:
        client.close()
    print(json.dumps({"latencies": latencies, "errors": errors}))


def mixed(root: Path, clients: int, tasks: int, seconds: float, think_ms: float) -> dict[str, Any]:
    """Part 1: the mixed load; latency per op, rate, errors, daemon RSS."""
    daemon = Daemon(root, "--log-level", "warning")
    daemon.start()
    names = [f"load-{index}" for index in range(tasks)]
    try:
        procs = []
        for index in range(clients):
            share = names[index::clients]
            argv = role_argv(
                "bench.reliability.load",
                "client",
                daemon.endpoint,
                task_list=",".join(share),
                seconds=seconds,
                think_ms=think_ms,
                seed=index,
            )
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=REPO))
        latencies: dict[str, list[float]] = {op: [] for op in WEIGHTS}
        errors: dict[str, int] = {}
        crashed = 0
        for proc in procs:
            out, _ = proc.communicate(timeout=seconds + 120)
            if proc.returncode != 0 or not out.strip():
                crashed += 1
                continue
            result = json.loads(out.strip().splitlines()[-1])
            for op, values in result["latencies"].items():
                latencies[op] += values
            for key, count in result["errors"].items():
                errors[key] = errors.get(key, 0) + count
        rss_kb = proc_status_kb(daemon.pid, "VmRSS")
        hwm_kb = proc_status_kb(daemon.pid, "VmHWM")
        stats = Client(daemon.endpoint).ok("stats")
    finally:
        code = daemon.stop()
    total = sum(len(values) for values in latencies.values())
    return {
        "clients": clients,
        "tasks": tasks,
        "seconds": seconds,
        "think_ms": think_ms,
        "requests_ok": total,
        "rate_per_s": round(total / seconds, 1),
        "errors": errors,
        "client_processes_failed": crashed,
        "per_op": {op: latency_summary(values) for op, values in latencies.items()},
        "daemon_rss_mib": round(rss_kb / 1024, 1),
        "daemon_peak_rss_mib": round(hwm_kb / 1024, 1),
        "write_failures": stats["write_failures"],
        "flushes": stats["flushes"],
        "stop_code": code,
    }


def _open_tasks(endpoint: str, names: Sequence[str], window: int = 64) -> int:
    """Change each task once, pipelining ``window`` requests; returns the failures."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    messages = _messages(0)[:6]
    failures = 0
    sent = received = 0
    try:
        while received < len(names):
            while sent < len(names) and sent - received < window:
                args = {"task": names[sent], "messages": messages, "deleted_range": [2, 3]}
                sock.send(proto.encode_request(sent, "truncated_messages", args))
                sent += 1
            if not sock.poll(30_000):
                raise TimeoutError("no reply within 30 s while opening tasks")
            if not proto.decode_reply(sock.recv()).ok:
                failures += 1
            received += 1
    finally:
        sock.close(linger=0)
    return failures


def idle_actors(root: Path, count: int) -> dict[str, Any]:
    """Part 2: RSS growth per idle (flushed) actor."""
    daemon = Daemon(root, "--log-level", "warning", "--idle-timeout", "3600")
    daemon.start()
    client = Client(daemon.endpoint)
    try:
        warm = [f"warm-{index}" for index in range(50)]
        _open_tasks(daemon.endpoint, warm)
        client.ok("flush", timeout=120)
        before = proc_status_kb(daemon.pid, "VmRSS")
        names = [f"idle-{index}" for index in range(count)]
        failures = _open_tasks(daemon.endpoint, names)
        client.ok("flush", timeout=300)
        after = proc_status_kb(daemon.pid, "VmRSS")
        actors = client.ok("stats")["actors"]
    finally:
        client.close()
        code = daemon.stop()
    return {
        "tasks": count,
        "failures": failures,
        "actors": actors,
        "rss_before_mib": round(before / 1024, 1),
        "rss_after_mib": round(after / 1024, 1),
        "kib_per_idle_actor": round((after - before) / count, 2),
        "stop_code": code,
    }


def _wave(daemon: Daemon, client: Client, names: Sequence[str], settle: float) -> dict[str, Any]:
    """Open ``names`` with pipelining clients, wait until every actor was evicted, then settle."""
    started = time.monotonic()
    failures = 0
    quarter = (len(names) + 3) // 4
    for part in range(4):
        failures += _open_tasks(daemon.endpoint, names[part * quarter : (part + 1) * quarter])
    opened_s = time.monotonic() - started
    loaded = proc_status_kb(daemon.pid, "VmRSS")
    peak_actors = client.ok("stats")["actors"]
    deadline = time.monotonic() + 300
    actors = peak_actors
    while actors and time.monotonic() < deadline:
        time.sleep(0.5)
        actors = client.ok("stats")["actors"]
    evicted_after = time.monotonic() - started
    at_eviction = proc_status_kb(daemon.pid, "VmRSS")
    time.sleep(settle)
    return {
        "failures": failures,
        "open_seconds": round(opened_s, 1),
        "actors_after_opening": peak_actors,
        "actors_left": actors,
        "all_evicted_after_s": round(evicted_after, 1),
        "rss_after_opening_mib": round(loaded / 1024, 1),
        "peak_rss_mib": round(proc_status_kb(daemon.pid, "VmHWM") / 1024, 1),
        "rss_when_all_evicted_mib": round(at_eviction / 1024, 1),
        "rss_after_eviction_mib": round(proc_status_kb(daemon.pid, "VmRSS") / 1024, 1),
    }


def eviction(
    root: Path,
    count: int,
    idle_timeout: float = 3.0,
    env: dict[str, str] | None = None,
    settle: float = 8.0,
) -> dict[str, Any]:
    """Part 3: peak RSS with ``count`` tasks, RSS after they are idle-evicted, and again.

    The second wave opens ``count`` other tasks: if the RSS stays flat, the
    memory kept after the first wave is reused (held by the allocator), not leaked.
    """
    daemon = Daemon(root, "--log-level", "warning", "--idle-timeout", str(idle_timeout), env=env)
    daemon.start()
    client = Client(daemon.endpoint)
    try:
        client.ok("count_tokens", {"text": "warm up"}, timeout=60)  # the tokenizer is loaded
        _open_tasks(daemon.endpoint, [f"warm-{index}" for index in range(20)])
        baseline = proc_status_kb(daemon.pid, "VmRSS")
        first = _wave(daemon, client, [f"evict-{index}" for index in range(count)], settle)
        second = _wave(daemon, client, [f"again-{index}" for index in range(count)], settle)
        files = sum(1 for _ in (daemon.state_dir / "tasks").glob("*/ctxwin.json"))
    finally:
        client.close()
        code = daemon.stop()
    peak = first["peak_rss_mib"] * 1024
    growth = peak - baseline
    returned = (peak - first["rss_after_eviction_mib"] * 1024) / growth if growth > 0 else 1.0
    return {
        "tasks_per_wave": count,
        "env": env or {},
        "idle_timeout_s": idle_timeout,
        "settle_s": settle,
        "rss_baseline_mib": round(baseline / 1024, 1),
        "first_wave": first,
        "second_wave": second,
        "task_files_on_disk": files,
        "growth_returned": round(returned, 2),
        "came_back_down": first["actors_left"] == 0 and returned >= 0.5,
        "second_wave_growth_mib": round(
            second["rss_after_eviction_mib"] - first["rss_after_eviction_mib"], 1
        ),
        "failures": first["failures"] + second["failures"],
        "stop_code": code,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="10 clients, 100 tasks, 10 s, 2000 evicted"
    )
    parser.add_argument("--clients", type=int, default=50, help="client processes (50)")
    parser.add_argument("--tasks", type=int, default=500, help="tasks (500)")
    parser.add_argument("--seconds", type=float, default=60.0, help="mixed-load time (60)")
    parser.add_argument("--think-ms", type=float, default=20.0, help="pause between requests (20)")
    parser.add_argument("--idle-tasks", type=int, default=2000, help="tasks for memory per actor")
    parser.add_argument("--evict-tasks", type=int, default=10000, help="tasks opened then evicted")
    parser.add_argument(
        "--evict-idle-timeout",
        type=float,
        default=20.0,
        help="daemon --idle-timeout for the eviction part; longer than opening takes (20)",
    )
    parser.add_argument(
        "--settle", type=float, default=8.0, help="seconds to wait after the last eviction (8)"
    )
    parser.add_argument(
        "--compare", action="store_true", help="run the eviction part again, MALLOC_ARENA_MAX=2"
    )
    parser.add_argument(
        "--parts",
        nargs="*",
        choices=("mixed", "idle", "evict"),
        default=["mixed", "idle", "evict"],
        help="which parts to run (all)",
    )
    parser.add_argument("--role", choices=("client",), help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--task-list", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "client":
        client_worker(
            args.endpoint, args.task_list.split(","), args.seconds, args.think_ms, args.seed
        )
        return 0
    if args.quick:
        args.clients, args.tasks, args.seconds = 10, 100, 10.0
        args.idle_tasks, args.evict_tasks, args.evict_idle_timeout = 500, 2000, 5.0
    summary: dict[str, Any] = {"machine": machine()}
    with scratch("ctxwin-load-") as root:
        if "mixed" in args.parts:
            (root / "mixed").mkdir()
            summary["mixed"] = mixed(
                root / "mixed", args.clients, args.tasks, args.seconds, args.think_ms
            )
        if "idle" in args.parts:
            (root / "idle").mkdir()
            summary["idle_actors"] = idle_actors(root / "idle", args.idle_tasks)
        if "evict" in args.parts:
            timeout = args.evict_idle_timeout
            (root / "evict").mkdir()
            summary["eviction"] = eviction(
                root / "evict", args.evict_tasks, timeout, settle=args.settle
            )
            if args.compare:
                # The same with glibc limited to two malloc arenas (worker threads each get one).
                (root / "evict-arena").mkdir()
                summary["eviction_malloc_arena_max_2"] = eviction(
                    root / "evict-arena",
                    args.evict_tasks,
                    timeout,
                    {"MALLOC_ARENA_MAX": "2"},
                    settle=args.settle,
                )
    mixed_ok = "mixed" not in summary or (
        not summary["mixed"]["errors"]
        and summary["mixed"]["client_processes_failed"] == 0
        and summary["mixed"]["stop_code"] == 0
    )
    idle_ok = "idle_actors" not in summary or summary["idle_actors"]["failures"] == 0
    evict_ok = "eviction" not in summary or (
        summary["eviction"]["failures"] == 0 and summary["eviction"]["came_back_down"]
    )
    summary["passed"] = mixed_ok and idle_ok and evict_ok
    return finish("load", summary, args.json)


if __name__ == "__main__":
    sys.exit(main())
