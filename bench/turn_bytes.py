"""What a turn's bytes alone cost on the wire: a sized REQ/REP echo against a tiny one.

A delta-synced turn of the corpus replay (``bench.turns --floor``) sends its
two new messages, about 40 KB, and gets back a patch of about 320 B. This
echoes exactly that shape (a 40 620 B request answered with 323 B) through a
plain blocking ``zmq.REP`` loop in its own process over ipc, interleaved in
slices with the 100 B ping ``bench.turns --floor`` compares against, so that
both see the same load: the ratio is the part of a turn's time that is the
bytes themselves, before any decoding or work.

Run::

    .venv/bin/python -m bench.turn_bytes              # one run
    .venv/bin/python -m bench.turn_bytes --repeat 3   # median of per-run figures
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

REQUEST_BYTES = 40_620
REPLY_BYTES = 323
PING_BYTES = 100


def _echo(endpoint: str) -> None:
    """Answer a ping with itself and a turn-sized request with a patch-sized reply."""
    socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.REP)
    socket.bind(endpoint)
    reply = b"r" * REPLY_BYTES
    while True:
        message = socket.recv()
        socket.send(message if len(message) <= PING_BYTES else reply)


def _run(endpoint: str, slices: int, per_slice: int) -> tuple[float, float]:
    """Median round trips (us) of the ping and of the turn-sized request, taking turns."""
    socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.REQ)
    socket.connect(endpoint)
    ping, turn = b"p" * PING_BYTES, os.urandom(REQUEST_BYTES)
    times: dict[bytes, list[float]] = {ping: [], turn: []}
    for _ in range(slices):
        for payload in (ping, turn):
            for _ in range(per_slice):
                started = time.perf_counter()
                socket.send(payload)
                socket.recv()
                times[payload].append(time.perf_counter() - started)
    socket.close(linger=0)
    return statistics.median(times[ping]) * 1e6, statistics.median(times[turn]) * 1e6


def main(argv: list[str] | None = None) -> int:
    """Print the ping's and the turn-sized round trip's medians and their ratio."""
    parser = argparse.ArgumentParser(prog="python -m bench.turn_bytes", description=__doc__)
    parser.add_argument("--echo", metavar="ENDPOINT", help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=1, help="runs, each with a fresh echo")
    parser.add_argument("--slices", type=int, default=20)
    parser.add_argument("--per-slice", type=int, default=250)
    args = parser.parse_args(argv)
    if args.echo:
        _echo(args.echo)
        return 0
    runs = []
    with tempfile.TemporaryDirectory() as directory:
        endpoint = f"ipc://{Path(directory) / 'echo.sock'}"
        for _ in range(args.repeat):
            echo = subprocess.Popen([sys.executable, "-m", "bench.turn_bytes", "--echo", endpoint])
            try:
                time.sleep(0.3)  # the echo binds; a REQ connect before that waits anyway
                runs.append(_run(endpoint, args.slices, args.per_slice))
            finally:
                echo.kill()
                echo.wait()
    ping = statistics.median(run[0] for run in runs)
    turn = statistics.median(run[1] for run in runs)
    ratios = statistics.median(run[1] / run[0] for run in runs)
    print(f"{PING_BYTES} B ping p50: {ping:.1f} us")
    print(f"{REQUEST_BYTES} B request, {REPLY_BYTES} B reply p50: {turn:.1f} us")
    print(f"ratio (median of per-run ratios): {ratios:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
