"""Per-turn cost of prepare_request, full lists against delta sync, end to end.

Replays a 2000-message, ~1 MB conversation turn by turn as an agent does:
each turn adds the assistant's reply and the next user message, then asks the
daemon for the next request's view with the previous request's usage (an
estimate that rises with the view until truncations happen). Three tasks on
one real daemon, in the same run, one after the other:

- ``full``: a raw DEALER sends the whole history and gets the whole view back;
- ``full-lib``: the same through ``ctxwin.client`` with ``delta=False``;
- ``delta``: ``ctxwin.client`` task handles as they come: the history goes by
  delta (``base``/``base_digest``/``append``), views come back as patches
  that reuse the previous patch's overrides, rebuilt on the caller's list.

Each sample is one turn, from the start of the client call to the rebuilt
view in hand. Usage: ``.venv/bin/python -m bench.turns [--messages N] [--json]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import zmq

from bench._conversation import build_conversation, size_of
from ctxwin import proto
from ctxwin.client import Client, Task

Message = dict[str, Any]
MODEL: proto.Model = {"id": "claude-sonnet-4-5", "context_window": 200_000}
CHARS_PER_TOKEN = 4


class Daemon:
    """A ctxwind subprocess on a private endpoint, for the length of the benchmark."""

    def __init__(self, root: Path) -> None:
        self.endpoint = f"ipc://{root / 'run' / 'ctxwind.sock'}"
        argv = [
            sys.executable,
            "-m",
            "ctxwin.daemon",
            "--endpoint",
            self.endpoint,
            "--state-dir",
            str(root / "state"),
            "--log-format",
            "json",
            "--log-level",
            "warning",
        ]
        self.log = (root / "ctxwind.log").open("wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        self.log.close()


class Connection:
    """One DEALER socket; one request at a time."""

    def __init__(self, endpoint: str) -> None:
        self.socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self.ids = itertools.count(1)

    def call(self, op: str, args: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        request_id = next(self.ids)
        self.socket.send(proto.encode_request(request_id, op, args))
        if not self.socket.poll(int(timeout * 1000)):
            raise TimeoutError(f"no reply to {op}")
        reply = proto.decode_reply(self.socket.recv())
        if not reply.ok or reply.result is None:
            raise RuntimeError(f"{op} failed: {reply.code}: {reply.message}")
        return reply.result

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.call("ping", {}, timeout=0.5)
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise


class UsageModel:
    """The usage an agent would report for a request with a view: its JSON size / 4.

    Sizes are remembered per message object, so that the time between two
    calls does not grow with the history: a gap of milliseconds lets the
    daemon's CPU go idle, and on this VM waking it again costs more than the
    turn itself (``--slow-usage`` serialises the whole view each turn instead,
    to see that effect).
    """

    def __init__(self, slow: bool = False) -> None:
        self.slow = slow
        self._sizes: dict[int, tuple[Message, int]] = {}

    def after(self, view: Sequence[Message], ts: int) -> proto.Usage:
        if self.slow:
            chars = len(json.dumps(view, ensure_ascii=False))
        else:
            # Only this view's messages stay remembered: nothing piles up.
            sizes: dict[int, tuple[Message, int]] = {}
            chars = 0
            for message in view:
                held = self._sizes.get(id(message))
                if held is None or held[0] is not message:
                    held = (message, len(json.dumps(message, ensure_ascii=False)))
                sizes[id(message)] = held
                chars += held[1]
            self._sizes = sizes
        prompt = chars // CHARS_PER_TOKEN
        return {"ts": ts, "tokens_in": prompt, "tokens_out": 400}


class RawFull:
    """Whole lists over a raw DEALER: the cost without delta sync or the client library."""

    def __init__(self, connection: Connection, task: str) -> None:
        self.connection = connection
        self.task = task
        self.truncations = 0

    def __call__(self, history: list[Message], previous: proto.Usage | None) -> list[Message]:
        args = {"task": self.task, "model": MODEL, "previous_request": previous}
        result = self.connection.call("prepare_request", {**args, "messages": history})
        self.truncations += bool(result["range_updated"])
        return cast(list[Message], result["messages"])


class Library:
    """A ``ctxwin.client`` task handle, with or without delta sync."""

    def __init__(self, handle: Task) -> None:
        self.handle = handle
        self.truncations = 0

    def __call__(self, history: list[Message], previous: proto.Usage | None) -> list[Message]:
        result = self.handle.prepare_request(history, MODEL, previous_request=previous)
        self.truncations += bool(result["range_updated"])
        return cast(list[Message], result["messages"])


Sender = RawFull | Library


def replay(
    messages: list[Message], send: Sender, usage: UsageModel
) -> tuple[list[float], list[int]]:
    """Run every turn; returns per-turn seconds and the history's bytes at each turn."""
    samples: list[float] = []
    sizes: list[int] = []
    previous: proto.Usage | None = None
    size = size_of(messages[:1])
    ts = 1_767_225_600_000
    for end in range(1, len(messages) + 1, 2):
        history = messages[:end]
        size += sum(len(json.dumps(m, ensure_ascii=False)) for m in messages[end - 2 : end])
        sizes.append(size)
        ts += 17_000
        started = time.perf_counter()
        view = send(history, previous)
        samples.append(time.perf_counter() - started)
        previous = usage.after(view, ts)
    return samples, sizes


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--target-bytes", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--slow-usage",
        action="store_true",
        help="serialise the whole view for each turn's usage (idle gaps grow with the history)",
    )
    options = parser.parse_args(argv)
    messages = build_conversation(options.messages, options.target_bytes)
    with tempfile.TemporaryDirectory(prefix="ctxwin-turns-") as temp:
        daemon = Daemon(Path(temp))
        try:
            connection = Connection(daemon.endpoint)
            connection.wait_ready()
            with Client(daemon.endpoint, timeout=60) as client:
                senders: dict[str, Sender] = {
                    "full": RawFull(connection, "turns-full"),
                    "full-lib": Library(client.task("turns-full-lib", delta=False)),
                    "delta": Library(client.task("turns-delta")),
                }
                # One mode after the other: each runs in its steady state, as an agent's would.
                runs = {
                    name: replay(messages, send, UsageModel(options.slow_usage))
                    for name, send in senders.items()
                }
        finally:
            daemon.stop()
    report: dict[str, Any] = {
        "messages": len(messages),
        "bytes": size_of(messages),
        "cpus": os.cpu_count(),
    }
    for mode, (times, sizes) in runs.items():
        tail = [s for s, b in zip(times, sizes, strict=True) if b >= 0.9 * sizes[-1]]
        report[mode] = {
            "turns": len(times),
            "truncations": senders[mode].truncations,
            "median_ms": statistics.median(times) * 1e3,
            "p99_ms": percentile(times, 0.99) * 1e3,
            "max_ms": max(times) * 1e3,
            "median_ms_at_1mb": statistics.median(tail) * 1e3,
        }
    report["speedup_at_1mb"] = (
        report["full"]["median_ms_at_1mb"] / report["delta"]["median_ms_at_1mb"]
    )
    if options.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['messages']} messages, {report['bytes'] / 1e6:.2f} MB, one turn = 2 messages")
    print(
        f"{'mode':<8} {'turns':>6} {'cuts':>5} {'median ms':>10} {'p99 ms':>8} {'max ms':>8} "
        f"{'median ms @1MB':>15}"
    )
    for mode in ("full", "full-lib", "delta"):
        row = report[mode]
        print(
            f"{mode:<8} {row['turns']:>6} {row['truncations']:>5} {row['median_ms']:>10.3f} "
            f"{row['p99_ms']:>8.3f} {row['max_ms']:>8.2f} {row['median_ms_at_1mb']:>15.3f}"
        )
    print(f"delta is {report['speedup_at_1mb']:.1f}x faster than full (raw) at ~1 MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
