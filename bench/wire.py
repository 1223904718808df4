"""ctxwind over the wire against a raw blocking pyzmq REQ/REP echo, in the same run.

Measures, over ipc (echo and daemon measured in turn, in slices, so that both
see the same machine load):

- ping round trips from one REQ client (p50, p99), against the same request
  bytes echoed by a plain blocking ``zmq.REP`` loop in its own process, and
  by a bare ROUTER watched with ``add_reader`` (the daemon's I/O design with
  no work: its ceiling);
- throughput of 8 client processes, each a DEALER keeping 16 requests in
  flight, against the same echo (median of 3 runs each), and the CPU time
  each server's main thread and libzmq I/O thread spent per request
  (``/proc/<pid>/task/*/stat``, Linux only);
- ``prepare_request`` round trips on 10 KB, 100 KB and 1 MB conversations
  (``bench/_conversation.py``), below the window (no cut) and over it (cut).

Run::

    .venv/bin/python -m bench.wire               # table
    .venv/bin/python -m bench.wire --repeat 3    # median of 3 runs per figure
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from bench._conversation import build_conversation
from ctxwin import proto

PING = proto.encode_request(1, "ping", {})
CLIENTS = 8
WINDOW = 16
_SLICES = 10
MODEL = {"id": "claude-sonnet", "context_window": 200000}


def echo_server(endpoint: str) -> None:
    """A raw blocking REP echo: the baseline."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = context.socket(zmq.REP)
    sock.bind(endpoint)
    while True:
        sock.send(sock.recv())


def loop_echo_server(endpoint: str) -> None:
    """The daemon's I/O pattern with no work: a ROUTER watched with add_reader, echoing.

    The ceiling of that design on this machine, to tell its cost from the daemon's own.
    """
    import asyncio

    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    sock.bind(endpoint)
    recv, send, get = zmq.backend.Socket.recv, zmq.backend.Socket.send, zmq.backend.Socket.get
    noblock, more = int(zmq.NOBLOCK), int(zmq.SNDMORE) | int(zmq.NOBLOCK)

    def drain() -> None:
        while int(get(sock, int(zmq.EVENTS))) & int(zmq.POLLIN):
            frame = recv(sock, noblock, False)
            frames = [frame.bytes]
            while frame.more:
                frame = recv(sock, noblock, False)
                frames.append(frame.bytes)
            for part in frames[:-1]:
                send(sock, part, more)
            send(sock, frames[-1], noblock)

    async def serve() -> None:
        fd = sock.getsockopt(zmq.FD)
        assert isinstance(fd, int)
        asyncio.get_running_loop().add_reader(fd, drain)
        drain()
        await asyncio.Event().wait()

    asyncio.run(serve())


def start_echo(endpoint: str, mode: str = "--echo") -> subprocess.Popen[bytes]:
    """An echo server in its own process, like the daemon."""
    return subprocess.Popen([sys.executable, "-m", "bench.wire", mode, endpoint])


def start_daemon(endpoint: str, state_dir: Path, *extra: str) -> subprocess.Popen[bytes]:
    """ctxwind in its own process, logging only warnings; ``extra``: more flags."""
    argv = [sys.executable, "-m", "ctxwin.daemon", "--endpoint", endpoint]
    argv += ["--state-dir", str(state_dir), "--log-format", "json", "--log-level", "warning"]
    argv += extra
    return subprocess.Popen(argv)


def wait_ready(endpoint: str) -> None:
    """Wait until a request is answered."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        sock = context.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sock.send(PING)
        answered = sock.poll(500)
        sock.close(linger=0)
        if answered:
            return
    raise TimeoutError(f"nothing answers on {endpoint}")


def latencies(endpoint: str, body: bytes, count: int) -> list[float]:
    """Round-trip times in microseconds of ``count`` requests from one REQ socket."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = context.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    for _ in range(min(200, count)):  # warm-up
        sock.send(body)
        sock.recv()
    times = []
    clock = time.perf_counter_ns
    for _ in range(count):
        start = clock()
        sock.send(body)
        sock.recv()
        times.append((clock() - start) / 1000)
    sock.close(linger=0)
    return times


def _pipelined_client(endpoint: str, count: int, ready: Any, start: Any, done: Any) -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    frames = [b"", PING]
    for _ in range(WINDOW):  # warm-up, also makes sure the connection is up
        sock.send_multipart(frames)
    for _ in range(WINDOW):
        sock.recv_multipart()
    ready.put(os.getpid())
    start.wait()
    sent = received = 0
    while sent < min(WINDOW, count):
        sock.send_multipart(frames)
        sent += 1
    while received < count:
        sock.recv_multipart()
        received += 1
        if sent < count:
            sock.send_multipart(frames)
            sent += 1
    done.put(time.perf_counter())
    sock.close(linger=0)
    context.term()


def throughput(endpoint: str, per_client: int) -> float:
    """Requests per second answered for CLIENTS pipelining DEALER processes."""
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Queue()
    start = ctx.Event()
    done = ctx.Queue()
    workers = [
        ctx.Process(target=_pipelined_client, args=(endpoint, per_client, ready, start, done))
        for _ in range(CLIENTS)
    ]
    for worker in workers:
        worker.start()
    for _ in workers:  # every client connected and warmed up before the clock starts
        ready.get(timeout=60)
    began = time.perf_counter()
    start.set()
    finished: float = max(float(done.get(timeout=120)) for _ in workers)
    for worker in workers:
        worker.join()
    return CLIENTS * per_client / (finished - began)


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of a process's main thread and libzmq I/O threads (Linux)."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds = {"main": 0.0, "io": 0.0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # the thread ended
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        used = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
        if int(tid) == pid:
            seconds["main"] += used
        elif name.startswith("ZMQbg/IO"):
            seconds["io"] += used
    return seconds


def prepare_times(endpoint: str, size: int, over: bool, count: int) -> list[float]:
    """Round trips in milliseconds of prepare_request on a conversation of ``size`` bytes."""
    messages = build_conversation(max(10, size // 500), size, seed=0)
    previous = {"ts": 1, "tokens_in": 190000 if over else 1000}
    times = []
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = context.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    for index in range(count + 1):
        args = {
            "task": f"bench-{size}-{over}-{index}",  # fresh state: every call does the same work
            "messages": messages,
            "model": MODEL,
            "previous_request": previous,
            "ephemeral": True,
        }
        start = time.perf_counter_ns()
        sock.send(proto.encode_request(index, "prepare_request", args))
        reply = proto.decode_reply(sock.recv())
        elapsed = (time.perf_counter_ns() - start) / 1e6
        assert reply.ok, reply.message
        if index:  # the first is a warm-up
            times.append(elapsed)
    sock.close(linger=0)
    return times


def percentile(values: list[float], fraction: float) -> float:
    """The value below which ``fraction`` of ``values`` lie."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def run_once(pings: int, per_client: int, quick: bool) -> dict[str, float]:
    """One run of every figure, with fresh servers."""
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="ctxwin-bench-") as tmp:
        echo_endpoint = f"ipc://{tmp}/echo.sock"
        loop_endpoint = f"ipc://{tmp}/loop.sock"
        daemon_endpoint = f"ipc://{tmp}/run/ctxwind.sock"
        servers = [
            start_echo(echo_endpoint),
            start_echo(loop_endpoint, "--loop-echo"),
            start_daemon(daemon_endpoint, Path(tmp) / "state"),
        ]
        try:
            pairs = (
                ("echo", echo_endpoint),
                ("loop_echo", loop_endpoint),
                ("daemon", daemon_endpoint),
            )
            for _name, endpoint in pairs:
                wait_ready(endpoint)
            # Interleaved in slices, so that all servers see the same machine load.
            times: dict[str, list[float]] = {name: [] for name, _ in pairs}
            for _ in range(_SLICES):
                for name, endpoint in pairs:
                    times[name] += latencies(endpoint, PING, max(1, pings // _SLICES))
            rates: dict[str, list[float]] = {name: [] for name, _ in pairs}
            cpu: dict[str, dict[str, float]] = {name: {"main": 0.0, "io": 0.0} for name, _ in pairs}
            pids = dict(zip((name for name, _ in pairs), (s.pid for s in servers), strict=True))
            linux = os.path.isdir("/proc/self/task")
            for _ in range(3):
                for name, endpoint in pairs:
                    before = thread_cpu(pids[name]) if linux else {}
                    rates[name].append(throughput(endpoint, per_client))
                    if linux:
                        for thread, used in thread_cpu(pids[name]).items():
                            cpu[name][thread] += used - before[thread]
            requests = 3 * CLIENTS * per_client
            for name, _endpoint in pairs:
                figures[f"{name}_ping_p50_us"] = percentile(times[name], 0.50)
                figures[f"{name}_ping_p99_us"] = percentile(times[name], 0.99)
                figures[f"{name}_throughput_rps"] = statistics.median(rates[name])
                if linux:
                    figures[f"{name}_main_thread_us_per_req"] = cpu[name]["main"] / requests * 1e6
                    figures[f"{name}_io_thread_us_per_req"] = cpu[name]["io"] / requests * 1e6
            sizes = (10_000, 100_000) if quick else (10_000, 100_000, 1_000_000)
            for size in sizes:
                count = {10_000: 50, 100_000: 20, 1_000_000: 5}[size]
                for over in (False, True):
                    label = "cut" if over else "nocut"
                    figures[f"prepare_{size // 1000}kb_{label}_ms"] = statistics.median(
                        prepare_times(daemon_endpoint, size, over, count)
                    )
        finally:
            for server in servers:
                server.terminate()
                server.wait(30)
    return figures


def _ratio(figures: dict[str, float], top: str, bottom: str) -> float:
    return figures[top] / figures[bottom]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a table of medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--echo", metavar="ENDPOINT", help=argparse.SUPPRESS)
    parser.add_argument("--loop-echo", metavar="ENDPOINT", help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=1, help="runs; each figure is the median")
    parser.add_argument("--pings", type=int, default=5000)
    parser.add_argument("--per-client", type=int, default=5000)
    parser.add_argument("--quick", action="store_true", help="skip the 1 MB conversation")
    args = parser.parse_args(argv)
    if args.echo:
        echo_server(args.echo)
        return 0
    if args.loop_echo:
        loop_echo_server(args.loop_echo)
        return 0
    runs = [run_once(args.pings, args.per_client, args.quick) for _ in range(args.repeat)]
    figures = {key: statistics.median(run[key] for run in runs) for key in runs[0]}

    def show(key: str, value: float) -> None:
        print(f"{key:34} {value:12.2f}")

    print(f"medians of {args.repeat} run(s); machine: {os.cpu_count()} CPUs")
    for key, value in figures.items():
        show(key, value)
    show(
        "ping_p50_ratio (target <= 1.3)", _ratio(figures, "daemon_ping_p50_us", "echo_ping_p50_us")
    )
    show(
        "throughput_ratio (target >= 0.8)",
        _ratio(figures, "daemon_throughput_rps", "echo_throughput_rps"),
    )
    show(
        "loop_echo/echo throughput",
        _ratio(figures, "loop_echo_throughput_rps", "echo_throughput_rps"),
    )
    show(
        "daemon/loop_echo throughput",
        _ratio(figures, "daemon_throughput_rps", "loop_echo_throughput_rps"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
