"""A daemon held to 64 open files while 128 clients connect: it must not abort and must answer.

Usage (from the repository root)::

    .venv/bin/python -m bench.reliability.descriptors [--quick] [--limit 64] [--clients 128]
        [--rounds N] [--json]

libzmq 4.3.5 aborts the whole process when an ipc ``accept()`` fails with
EMFILE; ctxwind raises its soft limit to the hard one at start and lets libzmq
accept only while descriptors are left. Here both limits are set to
``--limit`` by a ``preexec_fn`` so the daemon cannot escape. Each round: ``--clients`` DEALER
sockets connect and send ``ping`` at once; the replies that arrive within
5 s are counted; then every client disconnects and a fresh client must get
``ping`` answered and a task change flushed to disk. The daemon must be alive
all along.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import zmq

from bench.reliability._harness import (
    Client,
    Daemon,
    arguments,
    conversation,
    emit,
    limit_preexec,
    machine,
    open_fds,
    scratch,
)
from ctxwin import proto
from tests._daemon import free_port


@dataclass
class Round:
    """What one round showed."""

    limit_in_daemon: int
    clients: int
    answered_under_pressure: int
    peak_daemon_fds: int
    alive_under_pressure: bool
    answered_after: bool
    flushed_after: bool
    alive_after: bool
    seconds: float


def _soft_nofile(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise KeyError("Max open files")


def _settled(client: Client, deadline: float, op: str, args: dict[str, Any]) -> bool:
    """Whether ``op`` succeeds before ``deadline`` (fds are released asynchronously)."""
    while time.monotonic() < deadline:
        try:
            if client.call(op, args, timeout=1.0).ok:
                return True
        except TimeoutError:
            client.reset()
    return False


def run_round(daemon: Daemon, endpoint: str, clients: int, wait: float = 5.0) -> Round:
    """Connect ``clients`` sockets at once to ``endpoint``, then check the daemon still serves."""
    started = time.monotonic()
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sockets = []
    peak = 0
    answered = 0
    try:
        for index in range(clients):
            sock = context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            sock.send(proto.encode_request(index, "ping", {}))
            sockets.append(sock)
        poller = zmq.Poller()
        for sock in sockets:
            poller.register(sock, zmq.POLLIN)
        pending = set(sockets)
        deadline = time.monotonic() + wait
        while pending and time.monotonic() < deadline and daemon.alive():
            try:
                peak = max(peak, open_fds(daemon.pid))
            except FileNotFoundError:
                break
            for sock, _ in poller.poll(100):
                if sock in pending and proto.decode_reply(sock.recv()).ok:
                    answered += 1
                    pending.discard(sock)
                    poller.unregister(sock)
        alive_under = daemon.alive()
    finally:
        for sock in sockets:
            sock.close(linger=0)
        context.term()
    if not daemon.alive():
        return Round(0, clients, answered, peak, False, False, False, False, _since(started))
    limit = _soft_nofile(daemon.pid)
    fresh = Client(endpoint)
    task = f"fd-{int(started * 1000) % 100000}"
    try:
        answered_after = _settled(fresh, time.monotonic() + 15, "ping", {})
        changed = _settled(
            fresh,
            time.monotonic() + 15,
            "truncated_messages",
            {"task": task, "messages": conversation(), "deleted_range": [2, 5]},
        )
        flushed = changed and _settled(fresh, time.monotonic() + 15, "flush", {"task": task})
        flushed = flushed and (daemon.task_dir(task) / "ctxwin.json").exists()
    finally:
        fresh.close()
    return Round(
        limit_in_daemon=limit,
        clients=clients,
        answered_under_pressure=answered,
        peak_daemon_fds=peak,
        alive_under_pressure=alive_under,
        answered_after=answered_after,
        flushed_after=flushed,
        alive_after=daemon.alive(),
        seconds=_since(started),
    )


def _since(started: float) -> float:
    return round(time.monotonic() - started, 3)


def limited_daemon(root: Path, limit: int, transport: str = "ipc") -> tuple[Daemon, str]:
    """A daemon whose soft and hard open-files limits are both ``limit``, and where to connect.

    With ``transport="tcp"`` it also binds a loopback TCP port, which is then
    the endpoint returned (the ipc one stays bound, unused by the clients).
    """
    if transport == "ipc":
        daemon = Daemon(root, preexec_fn=limit_preexec(resource.RLIMIT_NOFILE, limit))
        return daemon, daemon.endpoint
    tcp = f"tcp://127.0.0.1:{free_port()}"
    daemon = Daemon(
        root, "--endpoint", tcp, preexec_fn=limit_preexec(resource.RLIMIT_NOFILE, limit)
    )
    return daemon, tcp


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--quick", action="store_true", help="one round")
    parser.add_argument("--limit", type=int, default=64, help="open-files limit (64)")
    parser.add_argument("--clients", type=int, default=128, help="clients per round (128)")
    parser.add_argument("--rounds", type=int, default=10, help="rounds on one daemon (10)")
    parser.add_argument(
        "--transport", choices=("ipc", "tcp"), default="ipc", help="where clients connect (ipc)"
    )
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else max(1, args.rounds)
    results: list[Round] = []
    with scratch("ctxwin-fds-") as root:
        daemon, endpoint = limited_daemon(root, args.limit, args.transport)
        daemon.start()
        try:
            for _ in range(rounds):
                results.append(run_round(daemon, endpoint, args.clients))
                if not results[-1].alive_after:
                    break
        finally:
            code = daemon.stop()
            aborted = "Too many open files" in daemon.log()
    good = all(r.alive_after and r.answered_after and r.flushed_after for r in results)
    summary = {
        "machine": machine(),
        "transport": args.transport,
        "limit": args.limit,
        "clients": args.clients,
        "rounds": len(results),
        "all_rounds_served_afterwards": good,
        "answered_under_pressure_min": min(r.answered_under_pressure for r in results),
        "answered_under_pressure_max": max(r.answered_under_pressure for r in results),
        "peak_daemon_fds": max(r.peak_daemon_fds for r in results),
        "libzmq_emfile_abort_in_log": aborted,
        "stop_code": code,
        "rounds_detail": [asdict(r) for r in results] if args.json else "(--json)",
    }
    emit("descriptors", summary, args.json)
    return 0 if good and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
