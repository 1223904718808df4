"""kill -9 the daemon again and again while clients write: nothing partial, nothing flushed lost.

Usage (from the repository root)::

    .venv/bin/python -m bench.reliability.crash [--quick] [--cycles 1000] [--writers 4] [--json]

``--writers`` client processes loop over steps ``i = 1, 2, ...``: ``rollback``
to ts 0 with ``deleted_range [2, 2 + j]`` (sets the range and removes the
notice), then ``apply_truncation_notice`` at ts ``i`` (adds the notice again),
where step ``i`` is step ``j`` (1 to ``--steps-per-task``) of the writer's
task number ``(i - 1) // --steps-per-task``: the daemon takes a range only
within the history its task was sent (``--steps-per-task + 4`` messages), so a
writer goes on with a new task, ``crash-W-N``, after that many steps. The
even-numbered writers also ``flush`` every ``--flush-every`` steps, the odd
ones never do, so that their changes reach the disk through the debouncer
alone. Each acknowledged reply is recorded with its time; a request the daemon
refuses, or a notice that changes nothing or starts the task over, is
recorded as refused and fails the run (the writers' requests no longer do
what the checks assume). The daemon runs with its default debounce (250 ms, at
most 2 s) and is killed with SIGKILL at a uniformly random moment 0.2-3 s after
it answers, then started again.

After every kill, for every task with an acknowledgement not yet judged (and
the task of the last flushed step):

- both files parse completely (no partial write ever visible);
- the range and the overlay in ``ctxwin.json`` (the authority) come from one
  state: its notice is absent or that of its range's step; the export
  ``context_history.json`` is never ahead of it (its notice, if any, is no
  later than the authority's step);
- the step on disk ``m`` (from the task's number and its deleted range) is at
  least the last step acknowledged by ``flush`` before the kill, and when
  equal, the history holds that step's notice;
- an acknowledged change is *lost* when the disk shows neither it nor a later
  step; the age of the oldest lost change (kill time minus its acknowledgement)
  must stay within the debounce cap plus 100 ms (``--cap-ms``, 2100);
- after the restart, ``inspect`` (which loads the task) never shows a step
  behind the disk, and once the task is loaded no temp file of a killed
  process and no set-aside (corrupt) file remains.

At the end the daemon gets SIGTERM and everything acknowledged must be on disk.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.reliability._harness import (
    HISTORY,
    META,
    REPO,
    Client,
    Daemon,
    arguments,
    conversation,
    finish,
    latency_summary,
    machine,
    role_argv,
    scratch,
    temp_files,
    tmpfs,
)
from ctxwin import proto


def task_of(writer_task: str, step: int, per_task: int) -> str:
    """The task a writer's ``step`` changes: its number ``(step - 1) // per_task``."""
    return f"{writer_task}-{(step - 1) // per_task}"


def first_step(task: str, per_task: int) -> int:
    """The writer's step before its task ``task``'s first (0 for the writer's first task)."""
    return int(task.rsplit("-", 1)[1]) * per_task


def writer(
    endpoint: str, writer_task: str, records: Path, seconds: float, flush_every: int, per_task: int
) -> None:
    """Change the writer's tasks step by step until ``seconds`` pass, recording every
    acknowledgement and every refusal."""
    client = Client(endpoint)
    # Long enough that the longest range, [2, 2 + per_task], leaves the last message.
    messages = conversation(turns=(per_task + 3) // 2, text=4)
    end = time.monotonic() + seconds
    step = 0
    with records.open("a", buffering=1) as out:
        while time.monotonic() < end:
            step += 1
            task = task_of(writer_task, step, per_task)
            deleted = [2, 2 + step - first_step(task, per_task)]
            try:
                reply = _call(
                    client, "rollback", {"task": task, "ts": 0, "deleted_range": deleted}, 1
                )
                out.write(f"{_kind('range', reply)} {step} {time.monotonic()!r}\n")
                reply = _call(
                    client,
                    "apply_truncation_notice",
                    {"task": task, "ts": step, "messages": messages},
                    1,
                )
                out.write(f"{_kind('notice', reply)} {step} {time.monotonic()!r}\n")
                if flush_every and step % flush_every == 0:
                    reply = _call(client, "flush", {"task": task}, 2)
                    out.write(f"{_kind('flush', reply)} {step} {time.monotonic()!r}\n")
            except TimeoutError:
                # The daemon is gone: drop what is queued and wait for the next one.
                client.reset()
                while time.monotonic() < end:
                    try:
                        if client.call("ping", timeout=0.3).ok:
                            break
                    except TimeoutError:
                        client.reset()
    client.close()


def _call(client: Client, op: str, args: dict[str, Any], timeout: float) -> proto.Reply:
    """One request, sent again while the daemon answers ``busy`` (a request it did not take:
    a task stopping as the writer's request came, a full mailbox), as ctxwin's client does,
    for up to ``timeout``; the last reply.

    Raises:
        TimeoutError: no reply within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while True:
        reply = client.call(op, args, timeout=timeout)
        if reply.code != proto.ErrorCode.BUSY or time.monotonic() > deadline:
            return reply


def _kind(kind: str, reply: proto.Reply) -> str:
    """``kind`` for a reply that did what the step asks; ``refused:WHY`` otherwise."""
    if not reply.ok:
        return f"refused:{reply.code}"
    result = reply.result or {}
    if kind == "notice" and not result.get("changed"):
        return "refused:unchanged"
    if result.get("restarted"):
        return "refused:restarted"
    return kind


@dataclass
class Ack:
    """One acknowledged reply of a writer."""

    kind: str
    step: int
    at: float


class AckLog:
    """A writer's records, read incrementally: only acknowledgements not yet judged are kept.

    The disk only moves forward, so an acknowledgement judged once (held or
    lost) never needs looking at again.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.pending: list[Ack] = []
        # The acknowledgements taken at the last kill, judged against the disk it left.
        self.judged: list[Ack] = []
        self.last_flush = 0
        self.steps = 0
        self.flushes = 0
        self.refusals: list[str] = []
        self.last_seen = 0

    def read(self) -> None:
        """Take in the complete lines written since the last call."""
        if not self.path.exists():
            return
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].decode().splitlines():
            kind, step, at = line.split()
            if kind.startswith("refused:"):
                self.refusals.append(f"{self.path.stem} step {step}: {kind[8:]}")
                continue
            self.pending.append(Ack(kind, int(step), float(at)))
            self.last_seen = max(self.last_seen, int(step))
            self.steps += kind == "notice"
            self.flushes += kind == "flush"

    def take_before(self, moment: float) -> list[Ack]:
        """Remove and return the pending acknowledgements received before ``moment``."""
        taken = [ack for ack in self.pending if ack.at < moment]
        self.pending = [ack for ack in self.pending if ack.at >= moment]
        for ack in taken:
            if ack.kind == "flush":
                self.last_flush = max(self.last_flush, ack.step)
        return taken


def notice_step(history: Any) -> int | None:
    """The ts of the notice in a history file (None without one)."""
    found: list[int] = []

    def walk(value: Any) -> None:
        if isinstance(value, list):
            if len(value) == 4 and isinstance(value[0], int) and value[1] == "text":
                found.append(value[0])
            for item in value:
                walk(item)

    walk(history)
    return max(found) if found else None


@dataclass
class DiskState:
    """What one task's files said right after a kill."""

    step: int  # the writer's step, from the task's number and deleted range
    notice: int | None
    history: Any
    meta: Any
    export_notice: int | None = None


@dataclass
class Totals:
    """Counts over the whole run."""

    cycles: int = 0
    checks: int = 0
    unparsable: list[str] = field(default_factory=list)
    mixed_states: list[str] = field(default_factory=list)
    flushed_lost: list[str] = field(default_factory=list)
    inspect_mismatch: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    lost_changes: int = 0
    kills_with_loss: int = 0
    oldest_lost_age_s: float = 0.0
    lost_ages: list[float] = field(default_factory=list)
    over_cap: list[str] = field(default_factory=list)
    acked_steps: int = 0
    flushes_acked: int = 0
    final_missing: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)


def read_disk(directory: Path, base: int = 0) -> DiskState | str:
    """The task's files (the authority's state, the export's notice), or why they cannot be used;
    ``base`` is the writer's step before the task's first."""
    export: Any = []
    meta: Any = {"deleted_range": None, "updates": []}
    try:
        if (directory / HISTORY).exists():
            export = json.loads((directory / HISTORY).read_bytes())
        if (directory / META).exists():
            meta = json.loads((directory / META).read_bytes())
    except ValueError as exc:
        return f"{directory.name}: {exc}"
    if not isinstance(meta, dict) or meta.get("format", 2) != 2 or "updates" not in meta:
        return f"{directory.name}: {META} is not a whole state: {sorted(meta)}"
    history = meta["updates"]
    deleted = meta.get("deleted_range")
    step = base + (deleted[1] - 2 if isinstance(deleted, list) else 0)
    return DiskState(step, notice_step(history), history, meta, notice_step(export))


def one_state(disk: DiskState) -> str | None:
    """Why the disk's range and overlay cannot come from one state, or None when they do."""
    if disk.notice is not None and disk.notice != disk.step:
        return f"authority: range of step {disk.step} beside the notice of step {disk.notice}"
    if disk.export_notice is not None and disk.export_notice > disk.step:
        return f"export: notice of step {disk.export_notice} ahead of the authority's {disk.step}"
    return None


def holds(disk: DiskState, ack: Ack) -> bool:
    """Whether the disk shows the acknowledged change or a later step."""
    if disk.step > ack.step:
        return True
    if disk.step < ack.step:
        return False
    return ack.kind == "range" or disk.notice == ack.step


def tasks_to_read(log: AckLog, per_task: int) -> list[str]:
    """The tasks whose disk judges ``log``'s acknowledgements taken at a kill and its last
    flushed step.

    The writer may still be writing down the reply it got last when the log is
    read; that reply is of the last step seen or the next one, so the task of
    the next step is read too.
    """
    steps = {ack.step for ack in log.judged} | {log.last_seen + 1}
    if log.last_flush:
        steps.add(log.last_flush)
    return sorted({task_of(log.path.stem, step, per_task) for step in steps})


def read_tasks(
    root: Callable[[str], Path], tasks: Sequence[str], per_task: int, where: str, totals: Totals
) -> dict[str, DiskState]:
    """Each task's disk state; an unparsable one is counted, a mixed one too."""
    disks: dict[str, DiskState] = {}
    for task in tasks:
        base = first_step(task, per_task)
        disk = read_disk(root(task), base)
        if isinstance(disk, str):
            totals.unparsable.append(f"{where}: {disk}")
            disk = DiskState(-1, None, None, None)
        elif (mixed := one_state(disk)) is not None:
            totals.mixed_states.append(f"{where}: {task}: {mixed}")
        disks[task] = disk
    return disks


def check_after_kill(
    logs: Sequence[AckLog],
    disks: dict[str, DiskState],
    per_task: int,
    dead_at: float,
    cap_s: float,
    totals: Totals,
) -> None:
    """Compare what was acknowledged before the kill with what the disk kept (the logs were
    read, and what came before ``dead_at`` taken, when the disks were; a reply written down
    since then is taken now)."""
    lost_here = 0
    for log in logs:
        log.read()
        log.judged += log.take_before(dead_at)
        last = log.last_flush
        if last:
            task = task_of(log.path.stem, last, per_task)
            disk = disks[task]
            if disk.step < last or (disk.step == last and disk.notice != last):
                totals.flushed_lost.append(
                    f"cycle {totals.cycles}: {task} flushed step {last}, disk step "
                    f"{disk.step} notice {disk.notice}"
                )
        for task in sorted({task_of(log.path.stem, ack.step, per_task) for ack in log.judged}):
            disk = disks[task]
            lost = [
                ack
                for ack in log.judged
                if ack.kind != "flush"
                and task_of(log.path.stem, ack.step, per_task) == task
                and not holds(disk, ack)
            ]
            if lost:
                lost_here += len(lost)
                age = dead_at - min(ack.at for ack in lost)
                totals.oldest_lost_age_s = max(totals.oldest_lost_age_s, age)
                totals.lost_ages.append(age)
                if age > cap_s:
                    totals.over_cap.append(
                        f"cycle {totals.cycles}: {task} lost a change {age:.3f}s old"
                    )
        totals.checks += 1
    totals.lost_changes += lost_here
    totals.kills_with_loss += bool(lost_here)


def _spawn_writer(
    endpoint: str, task: str, records: Path, seconds: float, flush_every: int, per_task: int
) -> subprocess.Popen[bytes]:
    argv = role_argv(
        "bench.reliability.crash",
        "writer",
        endpoint,
        task=task,
        records=records,
        seconds=seconds,
        flush_every=flush_every,
        steps_per_task=per_task,
    )
    return subprocess.Popen(argv, cwd=REPO)


def run(
    cycles: int,
    writers: int,
    flush_every: int,
    cap_ms: float,
    seed: int,
    up_range: tuple[float, float],
    on_tmpfs: bool = False,
    per_task: int = 500,
) -> dict[str, Any]:
    """The kill loop; the summary with ``passed``."""
    rng = random.Random(seed)
    totals = Totals()
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        root = stack.enter_context(scratch("ctxwin-crash-"))
        if on_tmpfs:
            stack.enter_context(tmpfs(root / "state", "512m"))
        daemon = Daemon(root, "--log-level", "warning")
        names = [f"crash-{index}" for index in range(writers)]
        logs = [AckLog(root / f"{name}.acks") for name in names]
        daemon.start()
        dead_at = 0.0
        # Writers run until stopped by time; give them enough for every cycle.
        budget = cycles * (up_range[1] + 3.0) + 30
        # Half the writers never flush: their changes reach the disk by the debouncer alone.
        procs = [
            _spawn_writer(
                daemon.endpoint,
                name,
                log.path,
                budget,
                flush_every if index % 2 == 0 else 0,
                per_task,
            )
            for index, (name, log) in enumerate(zip(names, logs, strict=True))
        ]
        try:
            for _ in range(cycles):
                totals.cycles += 1
                time.sleep(rng.uniform(*up_range))
                daemon.kill()
                dead_at = time.monotonic()
                tasks: list[str] = []
                for log in logs:
                    # Everything received before the process was seen dead came from that
                    # process; the writers get no reply until the restart.
                    log.read()
                    log.judged = log.take_before(dead_at)
                    tasks += tasks_to_read(log, per_task)
                tasks = sorted(set(tasks))
                disks = read_tasks(
                    daemon.task_dir, tasks, per_task, f"cycle {totals.cycles}", totals
                )
                daemon.start()
                probe = Client(daemon.endpoint)
                try:
                    for task in tasks:
                        # Loads the task; writers may have moved it on since the restart,
                        # but never behind what the disk held.
                        shown = probe.ok("inspect", {"task": task})["deleted_range"]
                        shown_step = first_step(task, per_task) + (shown[1] - 2 if shown else 0)
                        if disks[task].step >= 0 and shown_step < disks[task].step:
                            totals.inspect_mismatch.append(
                                f"cycle {totals.cycles}: {task} loaded step {shown_step} "
                                f"< disk step {disks[task].step}"
                            )
                        # A temp file of the running daemon is a write under way (the
                        # writers go on); only one of a killed process is left over.
                        own = f".{daemon.pid}."
                        leftovers = [
                            name for name in temp_files(daemon.task_dir(task)) if own not in name
                        ] + [
                            name
                            for name in temp_files(daemon.task_dir(task), suffix="")
                            if ".corrupt-" in name
                        ]
                        if leftovers:
                            totals.leftovers.append(f"cycle {totals.cycles}: {task}: {leftovers}")
                finally:
                    probe.close()
                check_after_kill(logs, disks, per_task, dead_at, cap_ms / 1000, totals)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(30)
            stop_code = daemon.stop()
        for log in logs:
            log.read()
            totals.acked_steps += log.steps
            totals.flushes_acked += log.flushes
            totals.refusals += log.refusals
            # Changes acknowledged after the last kill: SIGTERM must have written them all.
            after = [ack for ack in log.pending if ack.kind != "flush" and ack.at > dead_at]
            wanted = sorted({task_of(log.path.stem, ack.step, per_task) for ack in after})
            finals = read_tasks(daemon.task_dir, wanted, per_task, "final", totals)
            missing = [
                ack
                for ack in after
                if not holds(finals[task_of(log.path.stem, ack.step, per_task)], ack)
            ]
            if missing:
                totals.final_missing.append(
                    f"{log.path.stem}: {len(missing)} changes after SIGTERM"
                )
    passed = not (
        totals.unparsable
        or totals.mixed_states
        or totals.inspect_mismatch
        or totals.flushed_lost
        or totals.leftovers
        or totals.over_cap
        or totals.final_missing
        or totals.refusals
        or stop_code != 0
    )
    return {
        "machine": machine(),
        "cycles": totals.cycles,
        "writers": writers,
        "steps_per_task": per_task,
        "seconds": round(time.monotonic() - started, 1),
        "task_checks": totals.checks,
        "acknowledged_steps": totals.acked_steps,
        "acknowledged_flushes": totals.flushes_acked,
        "refused_writer_requests": totals.refusals[:10],
        "unparsable_files": totals.unparsable[:10],
        "range_and_overlay_from_different_states": totals.mixed_states[:10],
        "flushed_but_lost": totals.flushed_lost[:10],
        "temp_or_corrupt_files_after_load": totals.leftovers[:10],
        "loaded_state_behind_disk": totals.inspect_mismatch[:10],
        "kills_that_lost_unflushed_changes": totals.kills_with_loss,
        "lost_unflushed_changes": totals.lost_changes,
        "oldest_lost_change_age_ms": round(totals.oldest_lost_age_s * 1000, 1),
        "oldest_lost_age_per_task_and_kill": latency_summary(totals.lost_ages),
        "state_dir_on_tmpfs": on_tmpfs,
        "cap_ms": cap_ms,
        "over_cap": totals.over_cap[:10],
        "missing_after_sigterm": totals.final_missing,
        "stop_code": stop_code,
        "passed": passed,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--quick", action="store_true", help="20 cycles")
    parser.add_argument("--cycles", type=int, default=1000, help="kill -9 cycles (1000)")
    parser.add_argument("--writers", type=int, default=4, help="writer processes (4)")
    parser.add_argument("--flush-every", type=int, default=5, help="flush every N steps (5)")
    parser.add_argument(
        "--steps-per-task", type=int, default=500, help="steps of a writer's task (500)"
    )
    parser.add_argument("--cap-ms", type=float, default=2100.0, help="allowed lost-change age")
    parser.add_argument("--seed", type=int, default=1, help="seed of the kill times")
    parser.add_argument(
        "--tmpfs", action="store_true", help="state dir on a tmpfs (fsync costs nothing)"
    )
    parser.add_argument("--role", choices=("writer",), help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--task", help=argparse.SUPPRESS)
    parser.add_argument("--records", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "writer":
        writer(
            args.endpoint,
            args.task,
            args.records,
            args.seconds,
            args.flush_every,
            args.steps_per_task,
        )
        return 0
    cycles = 20 if args.quick else max(1, args.cycles)
    summary = run(
        cycles,
        args.writers,
        args.flush_every,
        args.cap_ms,
        args.seed,
        (0.2, 3.0),
        args.tmpfs,
        max(1, args.steps_per_task),
    )
    return finish("crash", summary, args.json)


if __name__ == "__main__":
    sys.exit(main())
