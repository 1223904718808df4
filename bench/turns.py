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

``--floor`` measures the per-turn cost against the wire's floor instead: the
real corpus conversation (``mra-api_conversation_history.json`` of the folder
``--corpus`` or ``CTXWIN_CORPUS`` names, read by path) replayed turn by turn
through a delta-synced ``Task`` handle at a 200k and a 64k window, interleaved
in one run with a raw blocking pyzmq REQ/REP ping over ipc (``bench.wire``'s
echo), and reported as ratios to the raw p50/p99 of the same run. ``--big``
adds a 10 MB, 20000-message synthetic conversation at a 1M-token window: the
per-turn cost's slope per 1000 messages of history and the daemon's resident
memory per byte of kept history.
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import zmq

from bench import wire
from bench._conversation import build_conversation, size_of
from bench._corpus import CLINE_TASK, add_corpus_option, corpus_file
from ctxwin import proto
from ctxwin.client import Client, Task
from tests._daemon import DaemonProcess

Message = dict[str, Any]
MODEL: proto.Model = {"id": "claude-sonnet-4-5", "context_window": 200_000}
WINDOWS: dict[str, proto.Model] = {
    "200k": {"id": "claude-sonnet-4-5", "context_window": 200_000},
    "64k": {"id": "deepseek-chat", "context_window": 64_000},
}
BIG_MODEL: proto.Model = {"id": "claude-sonnet-4-5", "context_window": 1_000_000}
# Targets of issue 17, as ratios to the raw REQ/REP round trip of the same run.
TARGET_MEDIAN_RATIO = 1.5
TARGET_P99_RATIO = 3.0
CHARS_PER_TOKEN = 4


class Daemon(DaemonProcess):
    """ctxwind on a private endpoint for the length of the benchmark; under cProfile with
    ``profile`` (the stats are written when the daemon exits, as it does on SIGTERM)."""

    def __init__(self, root: Path, profile: str | None = None) -> None:
        super().__init__(root, "--log-level", "warning")
        self.profile = Path(profile).resolve() if profile else None
        self.profiler = ["-m", "cProfile", "-o", str(self.profile)] if self.profile else []
        if self.profile is not None:
            self.profile.unlink(missing_ok=True)  # what stop() finds is then this run's

    @property
    def argv(self) -> list[str]:
        python, *rest = super().argv
        return [python, *self.profiler, *rest]

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; with ``profile``, the stats must have been written.

        Raises:
            RuntimeError: the daemon exited without writing its stats (killed after
                ``timeout``, or it failed), naming its exit code.
        """
        running = self.proc is not None
        code = super().stop(timeout)
        if running and self.profile is not None and not self.profile.exists():
            raise RuntimeError(f"ctxwind exited with {code} and wrote no profile {self.profile}")
        return code

    @property
    def pid(self) -> int:
        """The daemon's process id (it must be running)."""
        assert self.proc is not None, "daemon not running"
        return self.proc.pid


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
        if reply.id != request_id or not reply.ok or reply.result is None:
            raise RuntimeError(f"{op} failed: {reply.code}: {reply.message}")
        return reply.result


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

    def __init__(self, handle: Task, model: proto.Model = MODEL) -> None:
        self.handle = handle
        self.model = model
        self.truncations = 0

    def __call__(self, history: list[Message], previous: proto.Usage | None) -> list[Message]:
        result = self.handle.prepare_request(history, self.model, previous_request=previous)
        self.truncations += bool(result["range_updated"])
        return cast(list[Message], result["messages"])


Sender = RawFull | Library


def replay(
    messages: list[Message],
    send: Sender,
    usage: UsageModel,
    grow: bool = False,
    cpu: list[float] | None = None,
) -> tuple[list[float], list[int]]:
    """Run every turn; returns per-turn seconds and the history's bytes at each turn.

    With ``grow`` one list grows by appends, as an agent's does (no slice of
    the whole history per turn outside the timed region); the sizes are then
    message counts. ``cpu`` receives this thread's CPU seconds of each turn.
    """
    samples: list[float] = []
    sizes: list[int] = []
    previous: proto.Usage | None = None
    size = size_of(messages[:1])
    ts = 1_767_225_600_000
    history: list[Message] = []
    for end in range(1, len(messages) + 1, 2):
        if grow:
            history.extend(messages[len(history) : end])
            sizes.append(end)
        else:
            history = messages[:end]
            size += sum(len(json.dumps(m, ensure_ascii=False)) for m in messages[end - 2 : end])
            sizes.append(size)
        ts += 17_000
        cpu_started = time.thread_time()
        started = time.perf_counter()
        view = send(history, previous)
        samples.append(time.perf_counter() - started)
        if cpu is not None:
            cpu.append(time.thread_time() - cpu_started)
        previous = usage.after(view, ts)
    return samples, sizes


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def slope_per_1000(lengths: Sequence[int], times: Sequence[float], bins: int = 10) -> float:
    """Least-squares slope of per-bin medians, in the unit of ``times`` per 1000 messages.

    Turns are grouped into ``bins`` equal runs by history length and each
    group's median taken, so the few cutting turns do not tilt the line.
    """
    pairs = sorted(zip(lengths, times, strict=True))
    step = max(1, len(pairs) // bins)
    points = [
        (statistics.median(n for n, _ in chunk), statistics.median(t for _, t in chunk))
        for chunk in (pairs[i : i + step] for i in range(0, len(pairs), step))
        if len(chunk) >= step // 2
    ]
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    covariance = sum((x - mean_x) * (y - mean_y) for x, y in points)
    variance = sum((x - mean_x) ** 2 for x, _ in points)
    return covariance / variance * 1000


def process_cpu(pid: int) -> float:
    """CPU seconds so far of a process, all its threads (Linux ``/proc``)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_idle(pid: int, timeout: float = 60.0) -> None:
    """Wait until a process stops using CPU (the daemon loads its token encoding at start)."""
    deadline = time.monotonic() + timeout
    used = process_cpu(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = process_cpu(pid)
        if now - used < 0.02:
            return
        used = now


def floor_run(
    endpoint: str,
    echo: str,
    corpus: list[Message],
    replays: int,
    pings: int,
    serial: int,
    pids: tuple[int, int],
) -> dict[str, Any]:
    """One run: raw pings and corpus replays at each window, interleaved slice by slice.

    Besides wall time, the CPU time each turn costs: the calling thread's
    around each call plus the daemon's over the replays (``pids``: the
    daemon's and the echo's), against the same for the raw pings, which a
    loaded machine stretches far less than a turn's wall time.
    """
    raw: list[float] = []
    turns: dict[str, list[float]] = {name: [] for name in WINDOWS}
    cuts: dict[str, int] = dict.fromkeys(WINDOWS, 0)
    client_cpu: dict[str, list[float]] = {name: [] for name in WINDOWS}
    daemon_cpu: dict[str, float] = dict.fromkeys(WINDOWS, 0.0)
    ping_cpu = 0.0
    daemon_pid, echo_pid = pids

    def ping_slice() -> list[float]:
        nonlocal ping_cpu
        before = time.thread_time(), process_cpu(echo_pid)
        times = wire.latencies(echo, wire.PING, pings)
        ping_cpu += time.thread_time() - before[0] + process_cpu(echo_pid) - before[1]
        return times

    with Client(endpoint, timeout=60) as client:
        for replay_index in range(replays):
            for name, model in WINDOWS.items():
                raw += ping_slice()
                task = f"floor-{serial}-{name}-{replay_index}"
                send = Library(client.task(task, delta=True), model)
                before = process_cpu(daemon_pid)
                times, _ = replay(corpus, send, UsageModel(), grow=True, cpu=client_cpu[name])
                daemon_cpu[name] += process_cpu(daemon_pid) - before
                turns[name] += [t * 1e6 for t in times]
                cuts[name] += send.truncations
                client.close_task(task)
        raw += ping_slice()
    # latencies() sends 200 untimed warm-up pings per slice.
    ping_count = len(raw) + (replays * len(WINDOWS) + 1) * min(200, pings)
    figures: dict[str, Any] = {
        "raw_p50_us": percentile(raw, 0.50),
        "raw_p99_us": percentile(raw, 0.99),
        "raw_cpu_us": ping_cpu / ping_count * 1e6,
    }
    for name, times in turns.items():
        figures[name] = {
            "turns": len(times),
            "cuts": cuts[name],
            "median_us": statistics.median(times),
            "p99_us": percentile(times, 0.99),
            "max_us": max(times),
            "median_ratio": statistics.median(times) / figures["raw_p50_us"],
            "p99_ratio": percentile(times, 0.99) / figures["raw_p99_us"],
            "client_cpu_us": sum(client_cpu[name]) / len(times) * 1e6,
            "daemon_cpu_us": daemon_cpu[name] / len(times) * 1e6,
            "cpu_ratio": (sum(client_cpu[name]) + daemon_cpu[name])
            / len(times)
            * 1e6
            / figures["raw_cpu_us"],
        }
    return figures


def big_run(endpoint: str, daemon_pid: int, messages: list[Message]) -> dict[str, Any]:
    """The 10 MB conversation by delta: per-turn slope and the daemon's memory per history byte."""
    with Client(endpoint, timeout=120) as client:
        client.ping()
        rss_before = rss_bytes(daemon_pid)
        send = Library(client.task("turns-big"), BIG_MODEL)
        times, lengths = replay(messages, send, UsageModel(), grow=True)
        rss_after = rss_bytes(daemon_pid)
        stats = client.stats()
        client.close_task("turns-big")
    micros = [t * 1e6 for t in times]
    tail = [t for t, n in zip(micros, lengths, strict=True) if n >= 0.9 * lengths[-1]]
    head = [t for t, n in zip(micros, lengths, strict=True) if n <= 0.1 * lengths[-1]]
    return {
        "messages": len(messages),
        "bytes": size_of(messages),
        "turns": len(times),
        "cuts": send.truncations,
        "median_us": statistics.median(micros),
        "p99_us": percentile(micros, 0.99),
        "median_us_first_tenth": statistics.median(head),
        "median_us_last_tenth": statistics.median(tail),
        "slope_us_per_1000_messages": slope_per_1000(lengths, micros),
        "history_bytes": stats["history_bytes"],
        "rss_growth_bytes": rss_after - rss_before,
        "rss_per_history_byte": (rss_after - rss_before) / max(1, stats["history_bytes"]),
    }


def floor_main(options: argparse.Namespace) -> int:
    """``--floor``: the corpus replay against the raw round trip, ``--repeat`` runs."""
    corpus = cast(list[Message], json.loads(Path(options.corpus).read_text()))
    big = build_conversation(20_000, 10_000_000, seed=0) if options.big else None
    runs: list[dict[str, Any]] = []
    big_figures: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="ctxwin-floor-") as temp:
        echo = f"ipc://{temp}/echo.sock"
        echo_server = wire.start_echo(echo)
        daemon = Daemon(Path(temp), options.profile_daemon)
        profiler = cProfile.Profile() if options.profile_client else None
        try:
            wire.wait_ready(echo)
            daemon.start()
            wait_idle(daemon.pid)
            if profiler is not None:
                profiler.enable()
            for serial in range(options.repeat):
                pids = (daemon.pid, echo_server.pid)
                runs.append(
                    floor_run(
                        daemon.endpoint, echo, corpus, options.replays, options.pings, serial, pids
                    )
                )
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(options.profile_client)
            if big is not None:
                big_figures = big_run(daemon.endpoint, daemon.pid, big)
        finally:
            daemon.stop()
            echo_server.terminate()
            echo_server.wait(30)

    def median_of(get: Any) -> Any:
        return statistics.median(get(run) for run in runs)

    report: dict[str, Any] = {
        "corpus": Path(options.corpus).name,
        "messages": len(corpus),
        "runs": len(runs),
        "replays_per_run": options.replays,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0],
        "raw_p50_us": median_of(lambda run: run["raw_p50_us"]),
        "raw_p99_us": median_of(lambda run: run["raw_p99_us"]),
        "raw_cpu_us": median_of(lambda run: run["raw_cpu_us"]),
        "per_run": runs,
    }
    for name in WINDOWS:
        report[name] = {
            key: median_of(lambda run, key=key, name=name: run[name][key])
            for key in (
                "median_us",
                "p99_us",
                "max_us",
                "median_ratio",
                "p99_ratio",
                "cuts",
                "client_cpu_us",
                "daemon_cpu_us",
                "cpu_ratio",
            )
        }
    if big_figures is not None:
        report["big"] = big_figures
    if options.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{report['corpus']}: {report['messages']} messages, {report['runs']} runs x "
        f"{options.replays} replays per window; medians of per-run figures"
    )
    print(f"raw REQ/REP ping: p50 {report['raw_p50_us']:.1f} us, p99 {report['raw_p99_us']:.1f} us")
    print(f"{'window':<7} {'median us':>10} {'p99 us':>8} {'x raw p50':>10} {'x raw p99':>10}")
    for name in WINDOWS:
        row = report[name]
        print(
            f"{name:<7} {row['median_us']:>10.1f} {row['p99_us']:>8.1f} "
            f"{row['median_ratio']:>10.2f} {row['p99_ratio']:>10.2f}"
        )
    print(f"targets: median <= {TARGET_MEDIAN_RATIO}x raw p50, p99 <= {TARGET_P99_RATIO}x raw p99")
    print(f"CPU per raw round trip (client + echo): {report['raw_cpu_us']:.1f} us")
    for name in WINDOWS:
        row = report[name]
        print(
            f"CPU per turn at {name}: client {row['client_cpu_us']:.1f} us + daemon "
            f"{row['daemon_cpu_us']:.1f} us = {row['cpu_ratio']:.2f}x the raw round trip's"
        )
    if big_figures is not None:
        print(json.dumps(big_figures, indent=2))
    return 0


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
    parser.add_argument(
        "--floor",
        action="store_true",
        help="the corpus replay at 200k and 64k against a raw REQ/REP ping in the same run",
    )
    add_corpus_option(parser, CLINE_TASK)
    parser.add_argument("--repeat", type=int, default=5, help="--floor: runs")
    parser.add_argument("--replays", type=int, default=3, help="--floor: replays per window a run")
    parser.add_argument("--pings", type=int, default=1000, help="--floor: pings per slice")
    parser.add_argument("--big", action="store_true", help="--floor: add the 10 MB conversation")
    parser.add_argument("--profile-client", metavar="FILE", help="--floor: cProfile stats file")
    parser.add_argument(
        "--profile-daemon", metavar="FILE", help="the daemon's cProfile stats, written at its exit"
    )
    options = parser.parse_args(argv)
    if options.floor:
        options.corpus = corpus_file(options.corpus, CLINE_TASK)
        return floor_main(options)
    messages = build_conversation(options.messages, options.target_bytes)
    with tempfile.TemporaryDirectory(prefix="ctxwin-turns-") as temp:
        daemon = Daemon(Path(temp), options.profile_daemon)
        try:
            daemon.start()
            connection = Connection(daemon.endpoint)
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
