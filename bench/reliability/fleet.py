"""Hand-over under chaos: two daemons, one task in Redis, the owner paused and killed.

Usage (from the repository root)::

    .venv/bin/python -m bench.reliability.fleet [--pauses 6] [--kills 1] [--control] [--json]

A real redis-server (AOF, ``appendfsync always``) and two ``ctxwind`` with
``--state-store`` on it and a short lease (``--lease-ttl-ms``, 500). The
daemons run with the audited store of ``tests/_audited_store.py``: every
write Redis accepts is also appended to the task's audit list. One writer sends steps
``i = 1, 2, ...`` (``rollback`` to ts 0 with ``deleted_range [2, 2 + i]``),
each through the other daemon than the last, following ``owned_elsewhere``
and going on to the other daemon when one does not answer; every
``--flush-every`` steps it flushes and records the step once ``flush`` is
acknowledged.

``--pauses`` times the owner is stopped with SIGSTOP until the other daemon
has taken the task (past the TTL), then resumed with SIGCONT (it still holds
acknowledged, unwritten changes); ``--kills`` times the owner is killed with
-9 and started again. At the end both daemons get SIGTERM. Then:

- every write in the audit list carries a fence no lower than the one
  before, and a step no lower than the one before (it extends that state);
- the final state in Redis holds a step no lower than every flushed one.

``--control`` runs the daemons with that store's ``--no-fence-check``:
Redis accepts every write whatever its fence, and the same assertions must
fail (a resumed owner's stale write lands after the new owner's).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import redis

from bench.reliability._harness import arguments, finish, machine, scratch
from ctxwin import proto
from tests._daemon import DaemonProcess, call
from tests._redis import RedisServer

TASK = "handover"
ROOT = Path(__file__).resolve().parents[2]


class AuditedDaemon(DaemonProcess):
    """A ctxwind run with the audited store (``python -m tests._audited_store``)."""

    def __init__(self, root: Path, *extra_args: str, control: bool) -> None:
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        super().__init__(root, *extra_args, env={"PYTHONPATH": path})
        self.control = control

    @property
    def argv(self) -> list[str]:
        python, module, name, *flags = super().argv
        assert (module, name) == ("-m", "ctxwin.daemon"), (module, name)
        control = ["--no-fence-check"] if self.control else []
        return [python, "-m", "tests._audited_store", *control, *flags]


@dataclass
class Fleet:
    """A redis-server and the daemons that share it."""

    server: RedisServer
    daemons: list[DaemonProcess]
    client: redis.Redis

    def owner(self) -> DaemonProcess | None:
        """The daemon whose lease on the task is live, if any."""
        value = cast(bytes | None, self.client.get(f"ctxwin:{{{TASK}}}:lease"))
        if value is None:
            return None
        endpoint = value.split(b"\n", 1)[0].decode().rsplit(" ", 1)[0]
        return next((daemon for daemon in self.daemons if daemon.endpoint == endpoint), None)

    def audit(self) -> list[tuple[int, int]]:
        """(fence, step) of every accepted write, in order."""
        entries = []
        for raw in cast(list[bytes], self.client.lrange(f"ctxwin:{{{TASK}}}:audit", 0, -1)):
            fence, _, state = raw.partition(b"\n")
            entries.append((int(fence), step_of(json.loads(state))))
        return entries

    def final_step(self) -> int:
        """The step of the state Redis holds now."""
        raw = self.client.get(f"ctxwin:{{{TASK}}}:state")
        return step_of(json.loads(raw)) if raw is not None else 0


def step_of(state: dict[str, Any]) -> int:
    """The step a stored state is at (from its deleted range; 0 without one)."""
    deleted = state.get("deleted_range")
    return int(deleted[1]) - 2 if deleted else 0


@contextlib.contextmanager
def fleet(
    root: Path, ttl_ms: int, control: bool, daemons: int = 2, debounce_ms: int = 1000
) -> Iterator[Fleet]:
    """Start redis-server and the daemons; stop them all on the way out."""
    server = RedisServer(root / "redis")
    server.start()
    started: list[DaemonProcess] = []
    client = redis.Redis(unix_socket_path=str(server.socket))
    try:
        for index in range(daemons):
            daemon = AuditedDaemon(
                root / f"d{index}",
                "--state-store",
                server.url,
                "--lease-ttl-ms",
                str(ttl_ms),
                "--debounce-ms",
                str(debounce_ms),
                "--log-level",
                "info",
                control=control,
            )
            (root / f"d{index}").mkdir(parents=True, exist_ok=True)
            daemon.start()
            started.append(daemon)
        yield Fleet(server, started, client)
    finally:
        for each in started:
            if each.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    each.proc.send_signal(signal.SIGCONT)
            each.stop()
        client.close()
        server.stop()


@dataclass
class Writer:
    """Steps through both daemons until stopped; records acknowledged steps and flushes."""

    daemons: list[DaemonProcess]
    flush_every: int
    timeout: float = 0.3
    step: int = 0
    flushed: int = 0
    flushes: int = 0
    followed: int = 0
    unanswered: int = 0
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    turn_lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, op: str, args: dict[str, Any], first: int) -> proto.Reply | None:
        """Send to daemon ``first``; follow owned_elsewhere, try the other when one is silent."""
        endpoint = self.daemons[first % len(self.daemons)].endpoint
        for _ in range(4):
            try:
                reply = call(endpoint, op, args, timeout=self.timeout)
            except TimeoutError:
                self.unanswered += 1
                others = [d.endpoint for d in self.daemons if d.endpoint != endpoint]
                endpoint = others[0]
                continue
            if reply.code == "owned_elsewhere" and reply.owner:
                self.followed += 1
                endpoint = reply.owner
                continue
            return reply
        return None

    def one_step(self, turn: int) -> bool:
        """Send the next step (and a flush when due); whether it was acknowledged."""
        with self.turn_lock:
            step = self.step + 1
            args = {"task": TASK, "ts": 0, "deleted_range": [2, 2 + step]}
            reply = self.send("rollback", args, turn)
            if reply is None or not reply.ok:
                if reply is not None and reply.code not in ("busy", "owned_elsewhere"):
                    self.errors.append(f"step {step}: {reply.code}: {reply.message}")
                return False
            self.step = step
            if step % self.flush_every == 0:
                self.flush(turn)
            return True

    def flush(self, turn: int) -> None:
        """Flush the task; record the step once acknowledged."""
        step = self.step
        reply = self.send("flush", {"task": TASK}, turn)
        if reply is not None and reply.ok:
            self.flushed = max(self.flushed, step)
            self.flushes += 1

    def run(self) -> None:
        """The step loop (a thread)."""
        turn = 0
        while not self.stop.is_set():
            turn += 1
            self.one_step(turn)


def wait_for(predicate: Any, timeout: float) -> bool:
    """Poll until ``predicate()`` holds or ``timeout`` passes; whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def acknowledged(
    cluster: Fleet, writer: Writer, timeout: float
) -> tuple[DaemonProcess, int] | None:
    """The owner and the step it acknowledged: one more change, held unwritten (debounce).

    The owner is read from the lease and asked until one acknowledges: under load
    the lease may be between owners, or the owner's own deadline may have passed
    (it then refuses the request, and whatever it held was written or is lost to
    the fence already). Pausing a daemon that acknowledged nothing tests nothing.
    None when no owner acknowledged within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        owner = cluster.owner()
        if owner is not None and owner.proc is not None:
            at = writer.step + 1
            args = {"task": TASK, "ts": 0, "deleted_range": [2, 2 + at]}
            with contextlib.suppress(TimeoutError):
                if call(owner.endpoint, "rollback", args, timeout=5).ok:
                    writer.step = at
                    return owner, at
        time.sleep(0.02)
    return None


def run(
    pauses: int, kills: int, ttl_ms: int, flush_every: int, control: bool, seed: int
) -> dict[str, Any]:
    """The chaos run; the summary with ``passed``."""
    rng = random.Random(seed)
    started = time.monotonic()
    ttl = ttl_ms / 1000
    takeovers: list[str] = []
    with scratch("ctxwin-fleet-") as root, fleet(root, ttl_ms, control) as cluster:
        writer = Writer(cluster.daemons, flush_every)
        thread = threading.Thread(target=writer.run, daemon=True)
        thread.start()
        try:
            assert wait_for(lambda: writer.step > 5, 20), "the writer made no progress"
            events = ["pause"] * pauses + ["kill"] * kills
            for event in events:
                time.sleep(rng.uniform(0.2, 0.6))
                with writer.turn_lock:
                    # The owner acknowledges one more change, still unwritten (debounce),
                    # and stops (or dies) right after.
                    acted = acknowledged(cluster, writer, ttl * 10 + 5)
                    if acted is None:
                        takeovers.append(f"{event}: NOT done, no owner acknowledged a change")
                        continue
                    owner, at = acted
                    assert owner.proc is not None
                    if event == "pause":
                        owner.proc.send_signal(signal.SIGSTOP)
                    else:
                        owner.kill()
                took = wait_for(
                    lambda o=owner, a=at: (cluster.owner() not in (None, o)) and writer.step > a,
                    ttl * 10 + 5,
                )
                takeovers.append(f"{event}: {'taken over' if took else 'NOT taken over'}")
                # The new owner makes its later state durable before the old one wakes.
                with writer.turn_lock:
                    writer.flush(0)
                if event == "pause" and owner.proc is not None:
                    owner.proc.send_signal(signal.SIGCONT)
                else:
                    owner.start()
            time.sleep(ttl)
        finally:
            writer.stop.set()
            thread.join(10)
        last = writer.step
        flushed = writer.flushed
        fenced = sum(
            len([line for line in daemon.log().splitlines() if '"write_fenced"' in line])
            for daemon in cluster.daemons
        )
        for daemon in cluster.daemons:
            daemon.stop()
        audit = cluster.audit()
        final = cluster.final_step()
    fence_back = [
        f"write {i}: fence {audit[i][0]} after {audit[i - 1][0]}"
        for i in range(1, len(audit))
        if audit[i][0] < audit[i - 1][0]
    ]
    state_back = [
        f"write {i}: step {audit[i][1]} after {audit[i - 1][1]} (fence {audit[i][0]})"
        for i in range(1, len(audit))
        if audit[i][1] < audit[i - 1][1]
    ]
    flushed_lost = [] if final >= flushed else [f"final step {final} < flushed step {flushed}"]
    passed = bool(audit) and not (
        fence_back
        or state_back
        or flushed_lost
        or writer.errors
        or any("NOT" in t for t in takeovers)
    )
    return {
        "machine": machine(),
        "control_without_fence_check": control,
        "pauses": pauses,
        "kills": kills,
        "lease_ttl_ms": ttl_ms,
        "seconds": round(time.monotonic() - started, 1),
        "steps_acknowledged": last,
        "flushes_acknowledged": writer.flushes,
        "last_flushed_step": flushed,
        "final_step_in_redis": final,
        "accepted_writes": len(audit),
        "fences_seen": sorted({fence for fence, _ in audit}),
        "writes_refused_by_fence": fenced,
        "requests_followed": writer.followed,
        "requests_unanswered": writer.unanswered,
        "takeovers": takeovers,
        "fence_went_back": fence_back[:10],
        "state_went_back": state_back[:10],
        "flushed_but_lost": flushed_lost,
        "writer_errors": writer.errors[:10],
        "passed": passed,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--pauses", type=int, default=6, help="SIGSTOP hand-overs (6)")
    parser.add_argument("--kills", type=int, default=1, help="kill -9 hand-overs (1)")
    parser.add_argument("--ttl-ms", type=int, default=500, help="lease TTL (500)")
    parser.add_argument("--flush-every", type=int, default=5, help="flush every N steps (5)")
    parser.add_argument("--control", action="store_true", help="no fence check (must fail)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    summary = run(args.pauses, args.kills, args.ttl_ms, args.flush_every, args.control, args.seed)
    return finish("fleet", summary, args.json)


if __name__ == "__main__":
    sys.exit(main())
