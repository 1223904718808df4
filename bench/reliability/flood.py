"""One client floods with oversize and many-frame messages; the others keep their latency.

Usage (from the repository root)::

    .venv/bin/python -m bench.reliability.flood [--quick] [--seconds 20] [--pingers 3]
        [--max-bytes 1048576] [--json]

Phases, on one daemon started with ``--max-bytes`` (default 1 MiB) and the
default frame cap (8):

1. *oversize, counted*: one DEALER sends ``--oversize`` frames of twice
   ``--max-bytes``; each must cost the sender its connection (counted with a
   socket monitor) and none may reach the daemon's request handling: the
   ``requests`` counter of ``stats`` moves by exactly the one ``stats`` call.
2. *unloaded*: ``--pingers`` client processes send ``ping`` every 5 ms for
   ``--seconds`` and record each round trip.
3. *loaded*: the same, while a flooder process sends, as fast as it can, in
   turn one frame of twice ``--max-bytes``, one message of 64 frames and one
   message of 8 frames of ``--max-bytes / 4`` each (over the byte cap). Every
   reply the flooder gets must be ``too_large``.

4. *control*: the same flood aimed at a second daemon while the pingers
   still ping the first: what the CPU contention alone costs on this machine.

Pass: the daemon answers every ping in every phase, nothing oversize was
handled, the flooder only ever got ``too_large``, and the loaded p99 is at most
twice the unloaded p99 (``--ratio``) or, where the machine's cores are the
limit, at most 1.25 times the control's p99 (``p99_within_ratio`` tells which).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import zmq
import zmq.utils.monitor

from bench.reliability._harness import (
    REPO,
    Client,
    Daemon,
    arguments,
    finish,
    latency_summary,
    machine,
    role_argv,
    scratch,
)
from ctxwin import proto

PING_INTERVAL_S = 0.005


def pinger(endpoint: str, seconds: float) -> dict[str, Any]:
    """Ping every 5 ms for ``seconds``; the round trips and failures."""
    client = Client(endpoint)
    latencies: list[float] = []
    failures = 0
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            started = time.perf_counter()
            try:
                reply = client.call("ping", timeout=5.0)
            except TimeoutError:
                failures += 1
                client.reset()
                continue
            if reply.ok:
                latencies.append(time.perf_counter() - started)
            else:
                failures += 1
            pause = PING_INTERVAL_S - (time.perf_counter() - started)
            if pause > 0:
                time.sleep(pause)
    finally:
        client.close()
    return {"latencies": latencies, "failures": failures}


def flooder(endpoint: str, seconds: float, max_bytes: int) -> dict[str, Any]:
    """Send oversize and many-frame messages as fast as possible; count what comes back."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 10)
    sock.setsockopt(zmq.SNDHWM, 16)
    sock.connect(endpoint)
    oversize = b"o" * (2 * max_bytes)
    many = [b"f"] * 64
    heavy = [b"h" * (max_bytes // 4)] * 8
    sent = {"oversize": 0, "many_frames": 0, "over_byte_cap": 0}
    replies: dict[str, int] = {}
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            for kind, frames in (
                ("oversize", [oversize]),
                ("many_frames", many),
                ("over_byte_cap", heavy),
            ):
                try:
                    sock.send_multipart(frames, zmq.NOBLOCK)
                    sent[kind] += 1
                except zmq.Again:
                    sock.poll(10, zmq.POLLOUT)
            while sock.poll(0):
                code = proto.decode_reply(sock.recv_multipart()[-1])
                key = "ok" if code.ok else str(code.code)
                replies[key] = replies.get(key, 0) + 1
    finally:
        sock.close(linger=0)
        context.term()
    return {"sent": sent, "replies": replies}


def _spawn(role: str, endpoint: str, seconds: float, max_bytes: int) -> subprocess.Popen[str]:
    argv = role_argv(
        "bench.reliability.flood", role, endpoint, seconds=seconds, max_bytes=max_bytes
    )
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=REPO)


def _collect(process: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    out, _ = process.communicate(timeout=timeout)
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def measure(
    endpoint: str, pingers: int, seconds: float, max_bytes: int, flood: str | None
) -> dict[str, Any]:
    """Ping ``endpoint`` from ``pingers`` processes for ``seconds``, flooding ``flood`` if set."""
    flooding = _spawn("flooder", flood, seconds + 0.5, max_bytes) if flood else None
    processes = [_spawn("pinger", endpoint, seconds, max_bytes) for _ in range(pingers)]
    latencies: list[float] = []
    failures = 0
    for process in processes:
        result = _collect(process, seconds + 60)
        latencies += result["latencies"]
        failures += result["failures"]
    summary: dict[str, Any] = {"ping": latency_summary(latencies), "ping_failures": failures}
    if flooding is not None:
        summary["flooder"] = _collect(flooding, seconds + 60)
    return summary


def oversize_never_decoded(endpoint: str, count: int, max_bytes: int) -> dict[str, Any]:
    """Send ``count`` oversize frames; each must cost a connection and none be handled."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 10)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    probe = Client(endpoint)
    try:
        before = probe.ok("stats")["requests"]
        sock.connect(endpoint)
        payload = b"x" * (2 * max_bytes)
        disconnects = 0
        replies = 0
        deadline = time.monotonic() + 30 + count * 0.1
        for _ in range(count):
            sock.send(payload)
            while time.monotonic() < deadline:
                if monitor.poll(100):
                    zmq.utils.monitor.recv_monitor_message(monitor)
                    disconnects += 1
                    break
            while sock.poll(0):
                sock.recv_multipart()
                replies += 1
        after = probe.ok("stats")["requests"]
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)
        probe.close()
        context.term()
    return {
        "sent": count,
        "disconnects": disconnects,
        "replies": replies,
        "requests_handled": after - before - 1,  # less the second stats call
    }


def run(
    seconds: float, pingers: int, max_bytes: int, oversize: int, ratio: float
) -> dict[str, Any]:
    """The three phases on a fresh daemon; the summary with ``passed``."""
    with scratch("ctxwin-flood-") as root:
        daemon = Daemon(root, "--max-bytes", str(max_bytes), "--log-level", "warning")
        daemon.start()
        try:
            counted = oversize_never_decoded(daemon.endpoint, oversize, max_bytes)
            unloaded = measure(daemon.endpoint, pingers, seconds, max_bytes, None)
            loaded = measure(daemon.endpoint, pingers, seconds, max_bytes, daemon.endpoint)
            alive = daemon.alive()
            stats = Client(daemon.endpoint).ok("stats")
            # Control: the same flood aimed at another daemon, to tell what the machine's
            # two cores cost from what the flooded daemon's own handling costs.
            (root / "other").mkdir()
            other = Daemon(root / "other", "--max-bytes", str(max_bytes), "--log-level", "warning")
            other.start()
            try:
                control = measure(daemon.endpoint, pingers, seconds, max_bytes, other.endpoint)
            finally:
                other.stop()
        finally:
            code = daemon.stop()
    flood_replies = loaded["flooder"]["replies"]
    p99_ratio = loaded["ping"]["p99_ms"] / unloaded["ping"]["p99_ms"]
    passed = (
        alive
        and code == 0
        and counted["disconnects"] == oversize
        and counted["replies"] == 0
        and counted["requests_handled"] == 0
        and unloaded["ping_failures"] == 0
        and loaded["ping_failures"] == 0
        and set(flood_replies) <= {"too_large"}
        and (p99_ratio <= ratio or loaded["ping"]["p99_ms"] <= 1.25 * control["ping"]["p99_ms"])
    )
    return {
        "machine": machine(),
        "max_bytes": max_bytes,
        "oversize_counted": counted,
        "unloaded": unloaded,
        "loaded": loaded,
        "control_flooding_another_daemon": control,
        "p99_ratio": round(p99_ratio, 2),
        "p99_within_ratio": p99_ratio <= ratio,
        "control_p99_ratio": round(control["ping"]["p99_ms"] / unloaded["ping"]["p99_ms"], 2),
        "p50_ratio": round(loaded["ping"]["p50_ms"] / unloaded["ping"]["p50_ms"], 2),
        "daemon_requests_total": stats["requests"],
        "stop_code": code,
        "passed": passed,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--quick", action="store_true", help="5 s phases, 20 counted frames")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase (20)")
    parser.add_argument("--pingers", type=int, default=3, help="pinging processes (3)")
    parser.add_argument("--max-bytes", type=int, default=1 << 20, help="daemon --max-bytes")
    parser.add_argument("--oversize", type=int, default=200, help="counted oversize frames (200)")
    parser.add_argument("--ratio", type=float, default=2.0, help="allowed loaded/unloaded p99")
    parser.add_argument("--role", choices=("pinger", "flooder"), help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "pinger":
        print(json.dumps(pinger(args.endpoint, args.seconds)))
        return 0
    if args.role == "flooder":
        print(json.dumps(flooder(args.endpoint, args.seconds, args.max_bytes)))
        return 0
    seconds = 5.0 if args.quick else args.seconds
    oversize = 20 if args.quick else args.oversize
    summary = run(seconds, args.pingers, args.max_bytes, oversize, args.ratio)
    return finish("flood", summary, args.json)


if __name__ == "__main__":
    sys.exit(main())
