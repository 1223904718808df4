"""How long one client's costly request holds up another client's ping (issue 33).

A real daemon; one client sends a costly request while another pings it back
to back. Reported per case: the answer, the request's own time, and the other
client's worst and median ping while the request was under way (the stall
others see). Cases:

- ``patterns``: 16 tasks at once, each naming 16 read tools of the issue's
  pattern (``(?P<path>(?:\\pL|\\pN|\\pP){1,200}\\pS{1,200})!`` with a suffix of
  its own, so no cache helps): refused as too large;
- ``decode bomb``: 60 MiB of empty arrays under ``model`` of a
  ``prepare_request``: refused as too large (also the daemon's peak resident
  size, VmHWM);
- ``burst``: 64 requests at once, each of 1 MiB of empty arrays under ``model``
  (decoded in order with the others, not in slices): each refused as too large;
- ``100k``: 100,000 two-character messages (the default ``max_messages``): taken;
- ``2M``: 2,000,000 messages: refused from the list's header;
- ``idle``: no request, 2 s of pings: the machine's own noise, beside the others.

``100k`` and ``2M`` run twice, with the daemon as it is and decoding every
body in one piece (``CTXWIN_BENCH_SLICED_DECODE_BYTES`` past any body:
msgpack's single call and the arguments' check on the loop, as before).

``--fleet`` runs the ``patterns`` case on a fleet daemon (a redis-server of
its own, the default 10 s lease) holding another task, and reports whether
that task's lease lapsed: its key's shortest remaining time while the case
ran, and whether the task is still served after it.

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
    .venv/bin/python -m bench.fairness --repeat 1 --fleet
    .venv/bin/python -m bench.fairness --slots      # the task-slot flood (JSON)
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from bench.wire import PING
from ctxwin import proto
from tests._daemon import DaemonProcess, free_port
from tests._pinger import hostile_tools, pinging

ONE_PIECE = str(2**62)


def send_all(endpoint: str, bodies: list[bytes]) -> tuple[list[proto.Reply], float]:
    """Send every body from one client at once; their replies and the time to the last."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sender = context.socket(zmq.DEALER)
    sender.setsockopt(zmq.LINGER, 0)
    sender.connect(endpoint)
    started = time.perf_counter()
    for body in bodies:
        sender.send(body)
    replies = []
    for _ in bodies:
        if not sender.poll(600_000):
            raise TimeoutError("the costly request was not answered")
        replies.append(proto.decode_reply(sender.recv()))
    took = time.perf_counter() - started
    sender.close(linger=0)
    return replies, took


def patterns_case() -> list[bytes]:
    """16 inspect requests, each naming 16 tools of the hostile pattern (distinct texts)."""
    bodies = []
    for task in range(16):
        tools = hostile_tools(f"{task}-", 16)
        args = {"task": f"flood-{task}", "dialect": "anthropic", "read_tools": tools}
        bodies.append(proto.encode_request(task + 1, "inspect", args))
    return bodies


def bomb_case() -> list[bytes]:
    """A prepare_request whose ``model`` is 60 MiB of empty arrays."""
    inner = b"\xdc\xff\xff" + b"\x90" * 0xFFFF
    count = (60 << 20) // len(inner)
    bomb = b"\xdd" + count.to_bytes(4, "big") + inner * count
    head = proto.pack({"v": proto.PROTOCOL_VERSION, "id": 1, "op": "prepare_request"})
    args = proto.pack({"task": "bomb"})
    body = bytes([0x84]) + head[1:] + proto.pack("args") + bytes([args[0] + 1]) + args[1:]
    return [body + proto.pack("model") + bomb]


def burst_case() -> list[bytes]:
    """64 prepare_requests at once, each with 1 MiB of empty arrays under ``model``."""
    inner = b"\xdc\xff\xff" + b"\x90" * 0xFFFF
    count = ((1 << 20) - 4096) // len(inner)
    bomb = b"\xdd" + count.to_bytes(4, "big") + inner * count
    [body] = bomb_case()
    head = body[: body.index(proto.pack("model"))]
    return [head + proto.pack("model") + bomb] * 64


def messages_case(count: int) -> Callable[[], list[bytes]]:
    """A truncated_messages request of ``count`` two-character messages."""

    def build() -> list[bytes]:
        messages = [
            {"role": "user" if index % 2 == 0 else "assistant", "content": "ok"}
            for index in range(count)
        ]
        args = {"task": f"big-{count}", "messages": messages}
        return [proto.encode_request(1, "truncated_messages", args)]

    return build


CASES: dict[str, tuple[Callable[[], list[bytes]], bool]] = {
    "idle": (list, False),
    "patterns": (patterns_case, False),
    "decode bomb": (bomb_case, False),
    "burst": (burst_case, False),
    "100k": (messages_case(100_000), True),
    "2M": (messages_case(2_000_000), True),
}
"""Case -> (its bodies, whether it also runs with the daemon decoding in one piece)."""


def peak_rss_mib(daemon: DaemonProcess) -> float:
    """The daemon's peak resident size (VmHWM) in MiB."""
    assert daemon.proc is not None
    for line in Path(f"/proc/{daemon.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(daemon: DaemonProcess, bodies: list[bytes]) -> dict[str, Any]:
    """Send ``bodies`` while another client pings: the figures of one run."""
    with pinging(daemon.endpoint, interval=0.001, patience=600.0) as pinger:
        if bodies:
            replies, took = send_all(daemon.endpoint, bodies)
        else:
            replies, took = [], 0.0
            time.sleep(2)
    codes = sorted({"ok" if reply.ok else str(reply.code) for reply in replies}) or ["-"]
    return {
        "code": ",".join(codes),
        "request_s": took,
        "worst_ping_ms": pinger.worst * 1000,
        "median_ping_ms": statistics.median(pinger.times) * 1000,
        "pings": len(pinger.times),
        "peak_rss_mib": peak_rss_mib(daemon),
    }


def run(repeat: int, only: list[str] | None) -> dict[str, dict[str, Any]]:
    """Median figures per case and mode."""
    samples: dict[str, list[dict[str, Any]]] = {}
    names = only or list(CASES)
    for _ in range(repeat):
        for name in names:
            build, both = CASES[name]
            bodies = build()
            for one_piece in (False, True) if both else (False,):
                env = {"CTXWIN_BENCH_SLICED_DECODE_BYTES": ONE_PIECE} if one_piece else {}
                with tempfile.TemporaryDirectory(prefix="ctxwin-fair-") as root:
                    daemon = DaemonProcess(Path(root), "--log-level", "warning", env=env)
                    with daemon:
                        key = f"{name} {'one piece' if one_piece else 'now'}"
                        samples.setdefault(key, []).append(measure(daemon, bodies))
    return {
        key: {
            "code": runs[0]["code"],
            **{
                figure: statistics.median(run[figure] for run in runs)
                for figure in (
                    "request_s",
                    "worst_ping_ms",
                    "median_ping_ms",
                    "pings",
                    "peak_rss_mib",
                )
            },
            "worst_ping_ms_max": max(run["worst_ping_ms"] for run in runs),
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
        port = free_port()
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


def run_fleet() -> dict[str, Any]:
    """The patterns case on a fleet daemon holding another task: does that lease lapse?"""
    import redis

    from tests._redis import RedisServer

    with tempfile.TemporaryDirectory(prefix="ctxwin-fair-") as root:
        server = RedisServer(Path(root) / "redis")
        with server:
            (Path(root) / "d").mkdir()
            daemon = DaemonProcess(
                Path(root) / "d", "--state-store", server.url, "--log-level", "warning"
            )
            with daemon:
                held = {"task": "held", "messages": [{"role": "user", "content": "hi"}]}
                first = daemon.call("truncated_messages", held)
                assert first.ok, first
                client = redis.Redis(unix_socket_path=str(server.socket))
                shortest = [float("inf")]
                stop = threading.Event()

                def watch() -> None:
                    while not stop.is_set():
                        left = client.pttl("ctxwin:{held}:lease")
                        shortest[0] = min(shortest[0], float(left))
                        stop.wait(0.05)

                watcher = threading.Thread(target=watch)
                watcher.start()
                try:
                    figures = measure(daemon, patterns_case())
                finally:
                    stop.set()
                    watcher.join()
                after = daemon.call("truncated_messages", held)
                client.close()
                return {
                    **figures,
                    "lease_ttl_ms": 10_000,
                    "shortest_lease_left_ms": shortest[0],
                    "held_task_after": "ok" if after.ok else f"{after.code}: {after.message}",
                }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--case", action="append", choices=list(CASES), help="only these")
    parser.add_argument("--fleet", action="store_true", help="the patterns case on a fleet")
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
    result: dict[str, Any] = run(args.repeat, args.case) if not args.fleet else {}
    if args.fleet:
        result["patterns fleet"] = run_fleet()
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(
        f"{'case':<22}{'answer':>12}{'request s':>11}{'worst ping ms':>15}"
        f"{'median ms':>11}{'pings':>7}{'peak MiB':>10}"
    )
    for key, figures in result.items():
        print(
            f"{key:<22}{figures['code']:>12}{figures['request_s']:>11.2f}"
            f"{figures['worst_ping_ms']:>15.1f}{figures['median_ping_ms']:>11.1f}"
            f"{figures['pings']:>7.0f}{figures['peak_rss_mib']:>10.0f}"
        )
        if "shortest_lease_left_ms" in figures:
            print(
                f"  lease {figures['lease_ttl_ms']} ms: shortest left "
                f"{figures['shortest_lease_left_ms']:.0f} ms; held task after: "
                f"{figures['held_task_after']}"
            )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
