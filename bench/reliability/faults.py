"""Disk faults while the daemon serves: it answers throughout, keeps the last good file, recovers.

Usage (from the repository root, as root)::

    .venv/bin/python -m bench.reliability.faults [--quick] [--rounds N] [--only NAME ...] [--json]

Each fault runs the same scenario on a fresh daemon, ``--rounds`` times:

1. a good state is written and acknowledged by ``flush``;
2. the fault is switched on; the task is changed (the request must succeed:
   a request never fails because of the disk), ``flush`` must answer with an
   error naming the errno, a ``write_failed`` event with the task id must be
   logged, and a second client pinging every 20 ms must get every answer;
3. while the fault is on, each state file is byte for byte its last good
   content or the complete new content, and no temp file is left;
4. the fault is switched off; ``flush`` succeeds within a deadline, the files
   hold the new state, no temp file is left, and SIGTERM exits 0.

Faults: ENOSPC (tmpfs filled up), EFBIG (RLIMIT_FSIZE set by preexec and
raised again with prlimit), EROFS (read-only bind mount of the task dir),
EACCES as a non-root uid (setpriv) and as root without DAC capabilities
(capsh), EPERM (chattr +i on the task dir), EIO on fsync and EXDEV on rename
(strace attached to the running daemon with ``-e inject=``, detached to clear).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.reliability._harness import (
    HISTORY,
    META,
    NOBODY,
    Client,
    Daemon,
    Strace,
    arguments,
    as_uid,
    conversation,
    emit,
    fill,
    immutable,
    latency_summary,
    limit_preexec,
    machine,
    read_only_bind,
    scratch,
    snapshot,
    temp_files,
    tmpfs,
    without_caps,
)

TASK = "fault-task"
MESSAGES = conversation()
# EFBIG: a notice text larger than the file-size limit makes the history file too big,
# while the log (which the limit also covers) stays below it.
_EFBIG_LIMIT = 64 * 1024
_BIG_NOTICE = "n" * (_EFBIG_LIMIT + 32 * 1024)  # under the 128 KiB cap of one env string

Setup = Callable[[Path], contextlib.AbstractContextManager[Daemon]]
Inject = Callable[[Daemon], contextlib.AbstractContextManager[None]]


@contextlib.contextmanager
def _plain(root: Path) -> Iterator[Daemon]:
    yield Daemon(root, "--log-level", "info")


@contextlib.contextmanager
def _on_small_tmpfs(root: Path) -> Iterator[Daemon]:
    with tmpfs(root / "state", "1m"):
        yield Daemon(root)


@contextlib.contextmanager
def _file_size_limited(root: Path) -> Iterator[Daemon]:
    yield Daemon(
        root,
        "--log-level",
        "warning",
        env={"CTXWIN_TRUNCATION_NOTICE": _BIG_NOTICE},
        # Soft limit only: raising a hard limit again needs CAP_SYS_RESOURCE.
        preexec_fn=limit_preexec(resource.RLIMIT_FSIZE, _EFBIG_LIMIT, resource.RLIM_INFINITY),
    )


@contextlib.contextmanager
def _as_nobody(root: Path) -> Iterator[Daemon]:
    del root  # the daemon's uid needs a tree it can reach
    with scratch("ctxwin-eacces-", owner=NOBODY) as own:
        # HOME stays root's otherwise, whose config dir that uid may not even stat.
        home = {"HOME": str(own / "run"), "XDG_CONFIG_HOME": str(own / "run")}
        yield Daemon(own, env=home, prefix=as_uid(NOBODY, own / "stage"))


@contextlib.contextmanager
def _without_dac_caps(root: Path) -> Iterator[Daemon]:
    yield Daemon(root, prefix=without_caps())


@contextlib.contextmanager
def _filled(daemon: Daemon) -> Iterator[None]:
    filler = fill(daemon.state_dir)
    try:
        yield
    finally:
        filler.unlink()


@contextlib.contextmanager
def _size_limit_lifted_after(daemon: Daemon) -> Iterator[None]:
    # The limit is in force from the start (preexec); the new state is what exceeds it.
    try:
        yield
    finally:
        infinity = resource.RLIM_INFINITY
        resource.prlimit(daemon.pid, resource.RLIMIT_FSIZE, (infinity, infinity))


@contextlib.contextmanager
def _read_only(daemon: Daemon) -> Iterator[None]:
    with read_only_bind(daemon.task_dir(TASK)):
        yield


@contextlib.contextmanager
def _unwritable(daemon: Daemon) -> Iterator[None]:
    directory = daemon.task_dir(TASK)
    directory.chmod(0o500)
    try:
        yield
    finally:
        directory.chmod(0o700)


@contextlib.contextmanager
def _immutable(daemon: Daemon) -> Iterator[None]:
    with immutable(daemon.task_dir(TASK)):
        yield


def _strace(inject: str) -> Inject:
    @contextlib.contextmanager
    def attach(daemon: Daemon) -> Iterator[None]:
        with Strace(daemon.pid, inject, daemon.root / "strace.log"):
            yield

    return attach


@dataclass(frozen=True)
class Fault:
    """One disk fault: how the daemon is set up, how the fault is switched on and off.

    Attributes:
        name: short name (``--only``).
        errno: the errno name the daemon must report.
        inject: a context manager that holds the fault on.
        setup: a context manager that yields the (not yet started) daemon.
    """

    name: str
    errno: str
    inject: Inject
    setup: Setup = _plain


FAULTS: dict[str, Fault] = {
    fault.name: fault
    for fault in (
        Fault("enospc", "ENOSPC", _filled, _on_small_tmpfs),
        Fault("efbig", "EFBIG", _size_limit_lifted_after, _file_size_limited),
        Fault("erofs", "EROFS", _read_only),
        Fault("eacces-setpriv", "EACCES", _unwritable, _as_nobody),
        Fault("eacces-capsh", "EACCES", _unwritable, _without_dac_caps),
        Fault("eperm-chattr", "EPERM", _immutable),
        Fault("eio-fsync", "EIO", _strace("fsync:error=EIO")),
        Fault("exdev-rename", "EXDEV", _strace("rename,renameat,renameat2:error=EXDEV")),
    )
}


class Pinger:
    """A second client pinging the daemon every ``interval`` seconds in a thread."""

    def __init__(self, endpoint: str, interval: float = 0.02) -> None:
        self.endpoint = endpoint
        self.interval = interval
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        client = Client(self.endpoint)
        try:
            for _ in range(100_000):  # bounded; stopped long before
                if self._stop.is_set():
                    return
                started = time.perf_counter()
                try:
                    reply = client.call("ping", timeout=2.0)
                except TimeoutError:
                    self.failures.append("timeout")
                    client.reset()
                else:
                    if reply.ok:
                        self.latencies.append(time.perf_counter() - started)
                    else:
                        self.failures.append(str(reply.code))
                self._stop.wait(self.interval)
        finally:
            client.close()

    def __enter__(self) -> Pinger:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@dataclass
class Outcome:
    """What one fault round showed."""

    fault: str
    errno: str
    skipped: str | None = None
    change_answered: bool = False
    flush_code: str | None = None
    flush_message: str = ""
    logged: bool = False
    pings_answered: int = 0
    ping_failures: list[str] = field(default_factory=list)
    ping_latency: dict[str, float] = field(default_factory=dict)
    history_unchanged: bool = False
    files_old_or_new: bool = False
    temp_files_during: list[str] = field(default_factory=list)
    recovered: bool = False
    temp_files_after: list[str] = field(default_factory=list)
    stop_code: int | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """Whether every property held."""
        return (
            self.skipped is None
            and self.change_answered
            and self.flush_code == "internal"
            and self.errno in self.flush_message
            and self.logged
            and not self.ping_failures
            and self.pings_answered > 0
            and self.files_old_or_new
            and not self.temp_files_during
            and self.recovered
            and not self.temp_files_after
            and self.stop_code == 0
        )


def _recover(client: Client, deadline: float) -> bool:
    while time.monotonic() < deadline:
        reply = client.call("flush", {"task": TASK})
        if reply.ok and client.ok("inspect", {"task": TASK})["dirty"] is False:
            return True
        time.sleep(0.05)
    return False


def run_fault(fault: Fault, root: Path) -> Outcome:
    """Run one round of ``fault`` with a fresh daemon under ``root``."""
    outcome = Outcome(fault.name, fault.errno)
    started = time.monotonic()
    try:
        with fault.setup(root) as daemon:
            daemon.start()
            client = Client(daemon.endpoint)
            try:
                _scenario(fault, daemon, client, outcome)
            except PermissionError as exc:
                outcome.skipped = str(exc)
            finally:
                client.close()
                outcome.stop_code = daemon.stop()
    except PermissionError as exc:
        outcome.skipped = str(exc)
    outcome.seconds = round(time.monotonic() - started, 3)
    return outcome


def _scenario(fault: Fault, daemon: Daemon, client: Client, outcome: Outcome) -> None:
    directory = daemon.task_dir(TASK)
    client.ok("truncated_messages", {"task": TASK, "messages": MESSAGES, "deleted_range": [2, 3]})
    assert client.ok("flush", {"task": TASK}) == {"flushed": 1, "loaded": True}
    good = snapshot(directory)
    with Pinger(daemon.endpoint) as pinger:
        with fault.inject(daemon):
            first = client.call(
                "apply_truncation_notice", {"task": TASK, "ts": 1, "messages": MESSAGES}
            )
            second = client.call(
                "truncated_messages",
                {"task": TASK, "messages": MESSAGES, "deleted_range": [2, 4]},
            )
            outcome.change_answered = first.ok and second.ok
            flushed = client.call("flush", {"task": TASK})
            outcome.flush_code = None if flushed.ok else flushed.code
            outcome.flush_message = flushed.message or ""
            try:
                daemon.wait_for_event("write_failed", task=TASK, error=f"({fault.errno})")
                # Hold the fault until the daemon has retried on its own at least once.
                daemon.wait_for_event("write_failed", task=TASK, failures_in_row=2)
                outcome.logged = True
            except TimeoutError:
                outcome.logged = False
            during = snapshot(directory)
            outcome.temp_files_during = temp_files(directory)
        outcome.recovered = _recover(client, time.monotonic() + 15)
        final = snapshot(directory)
        outcome.temp_files_after = temp_files(directory)
    outcome.pings_answered = len(pinger.latencies)
    outcome.ping_failures = pinger.failures
    outcome.ping_latency = latency_summary(pinger.latencies)
    outcome.history_unchanged = during.get(HISTORY) == good.get(HISTORY)
    outcome.files_old_or_new = all(
        during.get(name) in (good.get(name), final.get(name)) for name in (HISTORY, META)
    )
    if outcome.recovered:
        inspected = client.ok("inspect", {"task": TASK})
        outcome.recovered = (
            json.loads(final[HISTORY]) == inspected["updates"] != []
            and json.loads(final[META])["deleted_range"] == [2, 4] == inspected["deleted_range"]
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--quick", action="store_true", help="one round of each fault")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each fault (5)")
    parser.add_argument("--only", nargs="*", choices=sorted(FAULTS), help="run only these")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else max(1, args.rounds)
    if os.geteuid() != 0:
        print("faults.py needs root (mount, chattr, setpriv, capsh, strace)", file=sys.stderr)
        return 2
    results: dict[str, Any] = {}
    failed = False
    for name in args.only or list(FAULTS):
        outcomes = []
        for _ in range(rounds):
            with scratch(f"ctxwin-{name}-") as root:
                outcomes.append(run_fault(FAULTS[name], root))
        skipped = {o.skipped for o in outcomes if o.skipped}
        passed = sum(o.passed for o in outcomes)
        failed = failed or (not skipped and passed != rounds)
        last = outcomes[-1]
        results[name] = {
            "rounds": rounds,
            "passed": passed,
            "skipped": ", ".join(sorted(skipped)) or None,
            "flush_error": last.flush_message[:160],
            "pings_answered_during_fault": sum(o.pings_answered for o in outcomes),
            "ping_failures": sum(len(o.ping_failures) for o in outcomes),
            "ping_max_ms": max((o.ping_latency.get("max_ms", 0.0) for o in outcomes), default=0),
            "history_unchanged_during_fault": all(o.history_unchanged for o in outcomes),
            "seconds_per_round": round(sum(o.seconds for o in outcomes) / rounds, 2),
            "failures": [asdict(o) for o in outcomes if not o.passed and not o.skipped],
        }
    emit("faults", {"machine": machine(), "faults": results}, args.json)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
