"""How long one client's huge request holds up another client's ping.

A real daemon; one client sends a large ``truncated_messages`` while another
pings it back to back. Reported: the longest ping round trip while the large
request was under way (the stall others see) and the large request's own
time. Each case runs with the daemon decoding large bodies in slices (as it
does) and in one piece (``CTXWIN_BENCH_SLICED_DECODE_BYTES`` past any body:
msgpack's single call, as before), the two in turn, median of ``--repeat`` runs.

Cases: ``100k`` (100,000 small messages, the default ``max_messages``: taken)
and ``2M`` (2,000,000 small messages: refused as too_large; in slices from
the list's header, in one piece after the whole body is decoded).

Run::

    .venv/bin/python -m bench.fairness              # table, median of 3 runs
    .venv/bin/python -m bench.fairness --repeat 1 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import zmq

from bench.wire import PING, wait_ready
from ctxwin import proto

ONE_PIECE = str(2**62)


def start(endpoint: str, state_dir: Path, sliced: bool) -> subprocess.Popen[bytes]:
    """ctxwind in its own process; ``sliced`` False decodes every body in one piece."""
    env = dict(os.environ)
    if not sliced:
        env["CTXWIN_BENCH_SLICED_DECODE_BYTES"] = ONE_PIECE
    argv = [sys.executable, "-m", "ctxwin.daemon", "--endpoint", endpoint]
    argv += ["--state-dir", str(state_dir), "--log-format", "json", "--log-level", "warning"]
    return subprocess.Popen(argv, env=env)


def body_of(count: int) -> bytes:
    """A truncated_messages request of ``count`` two-character messages."""
    messages = [
        {"role": "user" if index % 2 == 0 else "assistant", "content": "ok"}
        for index in range(count)
    ]
    return proto.encode_request(1, "truncated_messages", {"task": "big", "messages": messages})


def stall(endpoint: str, body: bytes) -> dict[str, Any]:
    """Send ``body`` from one client while another pings; the longest ping meanwhile."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    done = threading.Event()
    pings: list[float] = []

    def pinger() -> None:
        sock = context.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        while not done.is_set():
            started = time.perf_counter()
            sock.send(PING)
            sock.recv()
            pings.append(time.perf_counter() - started)
            time.sleep(0.001)
        sock.close(linger=0)

    thread = threading.Thread(target=pinger)
    thread.start()
    time.sleep(0.2)
    pings.clear()
    sender = context.socket(zmq.DEALER)
    sender.setsockopt(zmq.LINGER, 0)
    sender.connect(endpoint)
    started = time.perf_counter()
    sender.send(body)
    if not sender.poll(600_000):
        raise TimeoutError("the large request was not answered")
    reply = proto.decode_reply(sender.recv())
    took = time.perf_counter() - started
    done.set()
    thread.join()
    sender.close(linger=0)
    return {
        "code": "ok" if reply.ok else reply.code,
        "request_s": took,
        "max_ping_ms": max(pings) * 1000 if pings else float("nan"),
        "pings": len(pings),
    }


def run(repeat: int) -> dict[str, dict[str, Any]]:
    """Median figures per (case, mode)."""
    cases = {"100k": body_of(100_000), "2M": body_of(2_000_000)}
    samples: dict[str, list[dict[str, Any]]] = {}
    for _ in range(repeat):
        for sliced in (False, True):
            with tempfile.TemporaryDirectory(prefix="ctxwin-fair-") as root:
                endpoint = f"ipc://{root}/d.sock"
                daemon = start(endpoint, Path(root) / "state", sliced)
                try:
                    wait_ready(endpoint)
                    for name, body in cases.items():
                        key = f"{name} {'sliced' if sliced else 'one piece'}"
                        samples.setdefault(key, []).append(stall(endpoint, body))
                finally:
                    daemon.terminate()
                    daemon.wait(60)
    return {
        key: {
            "code": runs[0]["code"],
            "request_s": statistics.median(r["request_s"] for r in runs),
            "max_ping_ms": statistics.median(r["max_ping_ms"] for r in runs),
            "pings": statistics.median(r["pings"] for r in runs),
        }
        for key, runs in samples.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.repeat)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{'case':<20}{'answer':>12}{'request s':>12}{'longest ping ms':>17}{'pings':>8}")
    for key, figures in result.items():
        print(
            f"{key:<20}{figures['code']:>12}{figures['request_s']:>12.2f}"
            f"{figures['max_ping_ms']:>17.1f}{figures['pings']:>8.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
