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

``--slots`` runs the task-slot flood instead: one client (a CURVE key)
opens ephemeral tasks as fast as it can, 64 requests in flight, past
``max_tasks``; once the daemon holds ``max_tasks`` another client opens a new
task every 20 ms, each after a ping. Reported: how long the flood took to
fill the daemon, its answers, and the other client's answers, new-task
latency and worst ping (each new task of its own takes the place of an idle
task of the flooder).

Run::

    .venv/bin/python -m bench.fairness              # table, median of 3 runs
    .venv/bin/python -m bench.fairness --repeat 1 --json
    .venv/bin/python -m bench.fairness --slots      # the task-slot flood (JSON)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
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


# -- the task-slot flood: one client opens tasks as fast as it can, another opens its own --

SLOT_MESSAGES = [
    {"role": "user", "content": "task"},
    {"role": "assistant", "content": "ok"},
    {"role": "user", "content": "go on"},
]
SLOT_MODEL = {"id": "claude-sonnet-4-5", "context_window": 200_000}


def _curve_dealer(
    endpoint: str, server_public: bytes, pair: tuple[bytes, bytes]
) -> zmq.Socket[bytes]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, pair[0])
    sock.setsockopt(zmq.CURVE_SECRETKEY, pair[1])
    sock.connect(endpoint)
    return sock


def _open(task: str, request_id: int) -> bytes:
    """An ephemeral ``prepare_request`` of a new task (what opens a task slot)."""
    args = {"task": task, "messages": SLOT_MESSAGES, "model": SLOT_MODEL, "ephemeral": True}
    return proto.encode_request(request_id, "prepare_request", args)


def slots(flood_tasks: int, max_tasks: int, other_tasks: int) -> dict[str, Any]:
    """One client (alice) floods ephemeral new tasks, 64 in flight, without end; once it had
    its first ``busy`` (the daemon is full) or ``flood_tasks`` answers, another client (bob)
    pings and opens a new task every 20 ms while the flood goes on; bob's latencies and
    answers.

    Two clients need two names: the daemon listens on loopback TCP with keys (each
    connection named ``key:alice``, ``key:bob``), made with ``ctxwin keys``.
    """
    from ctxwin.client.cli import main as cli

    with tempfile.TemporaryDirectory(prefix="ctxwin-slots-") as root:
        server, clients = Path(root) / "server", Path(root) / "clients"
        quiet = open(os.devnull, "w")  # noqa: SIM115
        with quiet:
            for argv in (
                ["keys", "server", "--dir", str(server)],
                ["keys", "client", "alice", "--dir", str(clients / "alice")],
                ["keys", "client", "bob", "--dir", str(clients / "bob")],
            ):
                assert cli(argv, out=quiet, err=quiet) == 0, argv
            for name in ("alice", "bob"):
                key = clients / name / "client.key"
                argv = ["keys", "allow", str(key), "--name", name, "--dir", str(server)]
                assert cli(argv, out=quiet, err=quiet) == 0, argv
        pairs = {}
        for name in ("alice", "bob"):
            pair = proto.read_key_file(clients / name / "client.key_secret", secret=True)
            assert pair.secret is not None
            pairs[name] = (pair.public, pair.secret)
        server_public = proto.read_key_file(server / "server.key").public
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        endpoint = f"tcp://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "ctxwin.daemon", "--endpoint", endpoint]
        argv += ["--keys-dir", str(server), "--max-tasks", str(max_tasks)]
        argv += ["--state-dir", f"{root}/state", "--log-format", "json", "--log-level", "warning"]
        daemon = subprocess.Popen(argv)
        try:
            probe_sock = _curve_dealer(endpoint, server_public, pairs["bob"])
            deadline = time.monotonic() + 30
            while True:
                probe_sock.send(PING)
                if probe_sock.poll(500):
                    probe_sock.recv()
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("the daemon did not answer")
            probe_sock.close(linger=0)
            return _flood_slots(endpoint, server_public, pairs, flood_tasks, max_tasks, other_tasks)
        finally:
            daemon.terminate()
            daemon.wait(60)


def _flood_slots(
    endpoint: str,
    server_public: bytes,
    pairs: dict[str, tuple[bytes, bytes]],
    flood_tasks: int,
    max_tasks: int,
    other_tasks: int,
) -> dict[str, Any]:
    flood = _curve_dealer(endpoint, server_public, pairs["alice"])
    held = threading.Event()  # the daemon holds max_tasks: bob starts
    done = threading.Event()
    counts = {"ok": 0, "busy": 0, "other": 0}
    started = time.perf_counter()
    filled_s: list[float] = []

    def flooder() -> None:
        sent = received = 0
        while not done.is_set():  # past flood_tasks too, until bob is done
            while sent - received < 64:
                sent += 1
                flood.send(_open(f"flood-{sent}", sent))
            if not flood.poll(1000):
                continue
            reply = proto.decode_reply(flood.recv())
            received += 1
            kind = "ok" if reply.ok else "busy" if reply.code == "busy" else "other"
            counts[kind] += 1
            if (kind == "busy" or received >= flood_tasks) and not held.is_set():
                filled_s.append(time.perf_counter() - started)  # the daemon is full
                held.set()

    thread = threading.Thread(target=flooder)
    thread.start()
    if not held.wait(300):
        done.set()
        thread.join()
        raise TimeoutError("the flood did not fill max_tasks")
    other = _curve_dealer(endpoint, server_public, pairs["bob"])
    latencies: list[float] = []
    pings: list[float] = []
    answers: dict[str, int] = {}
    try:
        for index in range(other_tasks):
            begun = time.perf_counter()
            other.send(PING)
            if not other.poll(30_000):
                raise TimeoutError("bob's ping was not answered")
            other.recv()
            pings.append(time.perf_counter() - begun)
            begun = time.perf_counter()
            other.send(_open(f"bob-{index}", index + 1))
            if not other.poll(30_000):
                raise TimeoutError("bob's new task was not answered")
            reply = proto.decode_reply(other.recv())
            latencies.append(time.perf_counter() - begun)
            code = "ok" if reply.ok else str(reply.code)
            answers[code] = answers.get(code, 0) + 1
            time.sleep(0.02)
    finally:
        done.set()
        thread.join()
        other.close(linger=0)
        flood.close(linger=0)
    latencies.sort()
    return {
        "flood_sent": counts["ok"] + counts["busy"] + counts["other"],
        "flood_ok": counts["ok"],
        "flood_busy": counts["busy"],
        "filled_s": round(filled_s[0], 2),
        "other_answers": answers,
        "other_median_ms": round(statistics.median(latencies) * 1000, 1),
        "other_worst_ms": round(latencies[-1] * 1000, 1),
        "other_worst_ping_ms": round(max(pings) * 1000, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--slots",
        action="store_true",
        help="only the task-slot flood: one client opens --flood-tasks ephemeral tasks, "
        "another opens its own meanwhile",
    )
    parser.add_argument("--flood-tasks", type=int, default=12_000)
    parser.add_argument("--max-tasks", type=int, default=10_000)
    parser.add_argument("--other-tasks", type=int, default=50)
    args = parser.parse_args(argv)
    if args.slots:
        figures = slots(args.flood_tasks, args.max_tasks, args.other_tasks)
        json.dump(figures, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
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
