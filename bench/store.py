"""Per-turn cost and flush latency with the Redis store against local files, in one run.

Two daemons, started together: one on the file store (state dir on ``/tmp``),
one with ``--state-store`` on a real redis-server over its unix socket (AOF
with ``appendfsync always``, as the tests run it, or ``--appendfsync
everysec``). Each replays the same conversation turn by turn through
``ctxwin.client`` task handles (delta sync, views as patches), alternating
between the two daemons turn by turn so that the machine's noise falls on
both alike:

- ``turn``: one ``prepare_request`` (the previous turn's usage, as
  ``bench.turns`` reports it), the client call to the view in hand; the write
  is debounced, off the turn;
- ``flush``: after each turn, one ``rollback`` that changes the range, then
  ``flush``: the time of the flush alone, which answers once the state is
  durable (an atomic write of ``ctxwin.json`` and the export, or a fenced
  compare-and-set in Redis).

Usage: ``.venv/bin/python -m bench.store [--turns 300] [--messages 600] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from bench._conversation import build_conversation
from bench.reliability._harness import machine
from bench.turns import MODEL, UsageModel
from ctxwin.client import Client
from tests._daemon import DaemonProcess
from tests._redis import RedisServer


def _summary(samples: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3),
    }


def run(turns: int, messages: int, appendfsync: str) -> dict[str, Any]:
    """Both daemons, the same turns; the figures per store and their ratios."""
    conversation = build_conversation(messages, messages * 500)
    with tempfile.TemporaryDirectory(prefix="ctxwin-store-") as scratch:
        root = Path(scratch)
        server = RedisServer(root / "redis", "--appendfsync", appendfsync)
        server.start()
        (root / "file").mkdir()
        (root / "redis-d").mkdir()
        daemons = {
            "file": DaemonProcess(root / "file", "--log-level", "warning"),
            "redis": DaemonProcess(
                root / "redis-d", "--state-store", server.url, "--log-level", "warning"
            ),
        }
        for daemon in daemons.values():
            daemon.start()
        try:
            clients = {name: Client(d.endpoint, timeout=60) for name, d in daemons.items()}
            tasks = {name: client.task(f"bench-{name}") for name, client in clients.items()}
            usage = {name: UsageModel() for name in daemons}
            previous: dict[str, Any] = dict.fromkeys(daemons)
            times: dict[str, dict[str, list[float]]] = {
                name: {"turn": [], "flush": []} for name in daemons
            }
            start = max(4, messages - turns * 2)
            for turn in range(turns):
                history = conversation[: start + 2 * turn]
                order = list(daemons) if turn % 2 == 0 else list(reversed(daemons))
                for name in order:
                    task = tasks[name]
                    began = time.perf_counter()
                    view = task.prepare_request(history, MODEL, previous_request=previous[name])
                    times[name]["turn"].append(time.perf_counter() - began)
                    shown = cast(list[dict[str, Any]], view["messages"])
                    previous[name] = usage[name].after(shown, turn + 1)
                    task.rollback(0, deleted_range=[2, 2 + turn])
                    began = time.perf_counter()
                    task.flush()
                    times[name]["flush"].append(time.perf_counter() - began)
            for client in clients.values():
                client.close()
        finally:
            for daemon in daemons.values():
                daemon.stop()
            server.stop()
    figures = {
        name: {kind: _summary(values) for kind, values in kinds.items()}
        for name, kinds in times.items()
    }
    return {
        "machine": machine(),
        "turns": turns,
        "messages": messages,
        "redis_appendfsync": appendfsync,
        "file": figures["file"],
        "redis": figures["redis"],
        "redis_over_file_p50": {
            kind: round(figures["redis"][kind]["p50_ms"] / figures["file"][kind]["p50_ms"], 2)
            for kind in ("turn", "flush")
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--messages", type=int, default=600)
    parser.add_argument("--appendfsync", choices=("always", "everysec"), default="always")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    summary = run(args.turns, args.messages, args.appendfsync)
    print(json.dumps(summary, indent=2) if args.json else summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
