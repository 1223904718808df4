"""What CURVE costs per request: one daemon's loopback TCP with keys against one without.

Two daemons run side by side on ``tcp://127.0.0.1``: one NULL (no keys), one
with ``--keys-dir`` (CurveZMQ, an allowed client key). One DEALER client per
daemon, connected once, sends requests one at a time; the two are measured in
turn, in slices, so that both see the same machine load. Requests: ``ping``
(about 40 bytes) and ``truncated_messages`` of a 100 KB conversation on an
ephemeral task (CURVE encrypts every byte both ways). Also the time to connect
(a fresh socket up to its first reply: the handshake, and the ZAP check on the
daemon's event loop). Each figure: the median wall time per request, and the
daemon's CPU time per request (all its threads, from ``/proc/<pid>/stat``,
Linux only), which a loaded machine disturbs less.

Run::

    .venv/bin/python -m bench.auth                 # one run
    .venv/bin/python -m bench.auth --repeat 5      # 5 runs, then the median of each figure
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import zmq

from bench._conversation import build_conversation
from ctxwin import proto
from ctxwin.client.cli import main as cli
from tests._daemon import free_port

_SLICES = 20


def make_keys(root: Path) -> tuple[Path, Path]:
    """Server keys with one allowed client; (server keys dir, client keys dir)."""
    server, client = root / "server", root / "client"
    for argv in (
        ["keys", "server", "--dir", str(server)],
        ["keys", "client", "bench", "--dir", str(client)],
        ["keys", "allow", str(client / "client.key"), "--name", "bench", "--dir", str(server)],
    ):
        code = cli(argv, out=open("/dev/null", "w"))  # noqa: SIM115
        assert code == 0, argv
    return server, client


def start(root: Path, endpoint: str, *extra: str) -> subprocess.Popen[bytes]:
    root.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ctxwin.daemon",
            "--endpoint",
            endpoint,
            "--state-dir",
            str(root / "state"),
            "--log-level",
            "warning",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class Peer:
    """A connected DEALER to one daemon, with or without CURVE."""

    def __init__(self, endpoint: str, curve: tuple[bytes, bytes, bytes] | None) -> None:
        self.endpoint = endpoint
        self.curve = curve
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.sock = self.connect()
        self.ids = 0

    def connect(self) -> zmq.Socket[bytes]:
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if self.curve is not None:
            server, public, secret = self.curve
            sock.setsockopt(zmq.CURVE_SERVERKEY, server)
            sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
            sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
        sock.connect(self.endpoint)
        return sock

    def ask(self, sock: zmq.Socket[bytes], op: str, args: dict[str, object]) -> None:
        self.ids += 1
        sock.send(proto.encode_request(self.ids, op, args))
        if not sock.poll(10_000):
            raise TimeoutError(f"no reply from {self.endpoint}")
        reply = proto.decode_reply(sock.recv())
        assert reply.ok, (reply.code, reply.message)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 20
        while True:
            sock = self.connect()
            try:
                self.ask(sock, "ping", {})
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
            finally:
                sock.close(linger=0)

    def timed(self, op: str, args: dict[str, object], count: int) -> list[float]:
        times = []
        for _ in range(count):
            began = time.perf_counter()
            self.ask(self.sock, op, args)
            times.append(time.perf_counter() - began)
        return times

    def connects(self, count: int) -> list[float]:
        times = []
        for _ in range(count):
            began = time.perf_counter()
            sock = self.connect()
            try:
                self.ask(sock, "ping", {})
            finally:
                sock.close(linger=0)
            times.append(time.perf_counter() - began)
        return times


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def interleaved(
    measure: Callable[[Peer, int], list[float]],
    peers: tuple[Peer, Peer],
    pids: tuple[int, int],
    count: int,
) -> tuple[tuple[float, float], tuple[float, float]]:
    """Median wall time per request of each peer, and its daemon's CPU time per request.

    Measured in alternating slices, each pair in the other order than the last.
    """
    each: tuple[list[float], list[float]] = ([], [])
    cpu = [0.0, 0.0]
    per_slice = max(1, count // _SLICES)
    for number in range(_SLICES):
        order = (0, 1) if number % 2 == 0 else (1, 0)
        for position in order:
            before = cpu_seconds(pids[position])
            each[position].extend(measure(peers[position], per_slice))
            cpu[position] += cpu_seconds(pids[position]) - before
    done = per_slice * _SLICES
    medians = (statistics.median(each[0]), statistics.median(each[1]))
    return medians, (cpu[0] / done, cpu[1] / done)


def _ratio(top: float, bottom: float) -> float:
    return top / bottom if bottom else float("nan")


Figures = tuple[tuple[float, float], tuple[float, float]]


def show(
    row: dict[str, Figures], title: str, ratios: dict[str, tuple[float, float]] | None = None
) -> None:
    """One table: wall and CPU microseconds per request, NULL and CURVE, and their ratios."""
    print(
        f"{title:<27}{'wall NULL':>10}{'CURVE':>9}{'ratio':>7}"
        f"{'cpu NULL':>10}{'CURVE':>9}{'ratio':>7}"
    )
    for name, ((null, curve), (null_cpu, curve_cpu)) in row.items():
        wall, cpu = ratios[name] if ratios else (_ratio(curve, null), _ratio(curve_cpu, null_cpu))
        print(
            f"{name:<27}{null * 1e6:>10.1f}{curve * 1e6:>9.1f}{wall:>7.2f}"
            f"{null_cpu * 1e6:>10.1f}{curve_cpu * 1e6:>9.1f}{cpu:>7.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=10_000, help="pings per daemon")
    parser.add_argument("--big", type=int, default=1000, help="100 KB requests per daemon")
    parser.add_argument("--connects", type=int, default=300, help="fresh connections per daemon")
    parser.add_argument("--repeat", type=int, default=1, help="runs on the same daemons")
    args = parser.parse_args(argv)
    messages = build_conversation(200, 100_000, seed=0)
    body = {"task": "bench", "messages": messages, "ephemeral": True}
    with tempfile.TemporaryDirectory(prefix="ctxwin-bench-auth-") as temp:
        root = Path(temp)
        server, client = make_keys(root)
        null_ep = f"tcp://127.0.0.1:{free_port()}"
        curve_ep = f"tcp://127.0.0.1:{free_port()}"
        daemons = [
            start(root / "null", null_ep),
            start(root / "curve", curve_ep, "--keys-dir", str(server)),
        ]
        try:
            pair = proto.read_key_file(client / "client.key_secret", secret=True)
            assert pair.secret is not None
            server_key = proto.read_key_file(server / "server.key").public
            peers = (Peer(null_ep, None), Peer(curve_ep, (server_key, pair.public, pair.secret)))
            for peer in peers:
                peer.wait_ready()
                peer.timed("truncated_messages", body, 20)  # warm both
            pids = (daemons[0].pid, daemons[1].pid)
            runs = []
            for _ in range(args.repeat):
                runs.append(
                    {
                        "ping": interleaved(
                            lambda p, n: p.timed("ping", {}, n), peers, pids, args.rounds
                        ),
                        "truncated_messages 100 KB": interleaved(
                            lambda p, n: p.timed("truncated_messages", body, n),
                            peers,
                            pids,
                            args.big,
                        ),
                        "connect + first ping": interleaved(
                            lambda p, n: p.connects(n), peers, pids, args.connects
                        ),
                    }
                )
                show(runs[-1], f"run {len(runs)}")
        finally:
            for daemon in daemons:
                daemon.terminate()
                daemon.wait(30)
    if len(runs) > 1:
        print(f"median of {len(runs)} runs (each figure and each ratio on its own)")
        median_row: dict[str, Figures] = {}
        for name in runs[0]:
            values = [run[name] for run in runs]
            median_row[name] = (
                (
                    statistics.median(v[0][0] for v in values),
                    statistics.median(v[0][1] for v in values),
                ),
                (
                    statistics.median(v[1][0] for v in values),
                    statistics.median(v[1][1] for v in values),
                ),
            )
        ratios = {
            name: (
                statistics.median(_ratio(run[name][0][1], run[name][0][0]) for run in runs),
                statistics.median(_ratio(run[name][1][1], run[name][1][0]) for run in runs),
            )
            for name in runs[0]
        }
        show(median_row, "median", ratios)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
