"""Durable state through the real daemon: debounce, restart, corrupt files, kill -9."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from ctxwin import proto
from tests._daemon import DaemonProcess, WirePeer, wait_until

FIRST = [
    {"role": "user", "content": [{"type": "text", "text": "Refactor the parser."}]},
    {"role": "assistant", "content": [{"type": "text", "text": "Reading it."}]},
]
HEADER = "[read_file for 'src/parser.py'] Result:"
CI = bool(os.environ.get("CI") or os.environ.get("CTXWIN_CI"))


def reads(count: int) -> list[dict[str, Any]]:
    """A conversation that reads the same file ``count`` times (old format, SPEC.md §6)."""
    messages = list(FIRST)
    for index in range(count):
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": HEADER},
                    {"type": "text", "text": f"def parse(): return {index}\n"},
                ],
            }
        )
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "ok"}]})
    return messages


def ok(reply: proto.Reply) -> dict[str, Any]:
    """The result of a reply that must have succeeded."""
    assert reply.ok, (reply.code, reply.message)
    assert reply.result is not None
    return reply.result


def read_json(path: Path) -> Any:
    """A state file's content; fails the test when it does not parse."""
    return json.loads(path.read_text())


def test_changes_reach_the_disk_without_flush_within_the_debounce_cap(tmp_path: Path) -> None:
    """A change is written by the debouncer alone, no later than debounce_max after it."""
    with DaemonProcess(tmp_path, "--debounce-ms", "100", "--debounce-max-ms", "400") as daemon:
        ok(daemon.call("optimize_file_reads", {"task": "t", "messages": reads(3), "ts": 5}))
        history = daemon.task_dir("t") / "context_history.json"
        wait_until(history.exists, 5, "the debounced write happens")
        assert read_json(history) == ok(daemon.call("inspect", {"task": "t"}))["updates"]


def test_steady_traffic_is_written_by_the_max_delay(tmp_path: Path) -> None:
    """Changes arriving faster than the debounce are still written within debounce_max."""
    with DaemonProcess(tmp_path, "--debounce-ms", "300", "--debounce-max-ms", "600") as daemon:
        meta = daemon.task_dir("t") / "ctxwin.json"
        start = time.monotonic()
        end = 2
        while not meta.exists():
            end += 1
            ok(
                daemon.call(
                    "truncated_messages",
                    {"task": "t", "messages": FIRST, "deleted_range": [2, end]},
                )
            )
            assert time.monotonic() - start < 5, "steady traffic starved the writer"
        assert time.monotonic() - start < 2.5


def test_steady_traffic_after_a_capped_write_is_still_batched(tmp_path: Path) -> None:
    """After a write forced by debounce_max, the next batch waits for its own cap again."""
    with DaemonProcess(tmp_path, "--debounce-ms", "200", "--debounce-max-ms", "500") as daemon:
        start = time.monotonic()
        end = 2
        while time.monotonic() - start < 2.0:
            end += 1
            ok(
                daemon.call(
                    "truncated_messages",
                    {"task": "t", "messages": FIRST, "deleted_range": [2, end]},
                )
            )
        flushes = ok(daemon.call("stats"))["flushes"]
        # About one write per 0.5 s cap; back-to-back writes would give one per request.
        assert 2 <= flushes <= 8, f"{flushes} writes for {end - 2} changes in 2 s"


def test_state_survives_a_restart(tmp_path: Path) -> None:
    """Everything changed before SIGTERM is there after a restart, without an explicit flush."""
    daemon = DaemonProcess(tmp_path, "--debounce-ms", "60000", "--debounce-max-ms", "60000")
    daemon.start()
    ok(daemon.call("optimize_file_reads", {"task": "a", "messages": reads(4), "ts": 9}))
    ok(daemon.call("compact", {"task": "b", "messages": reads(4), "keep": "quarter", "ts": 3}))
    before = {task: ok(daemon.call("inspect", {"task": task})) for task in ("a", "b")}
    assert all(state["dirty"] for state in before.values())
    assert daemon.stop() == 0
    daemon.start()
    try:
        for task in ("a", "b"):
            after = ok(daemon.call("inspect", {"task": task}))
            assert (after["updates"], after["deleted_range"], after["dirty"]) == (
                before[task]["updates"],
                before[task]["deleted_range"],
                False,
            )
    finally:
        assert daemon.stop() == 0


def test_existing_task_directories_are_read_as_is(tmp_path: Path) -> None:
    """A context_history.json in the on-disk form, without ctxwin.json, loads as the overlay."""
    updates = [[1, [0, [[0, [[5, "text", ["kept"], []]]]]]]]
    task_dir = tmp_path / "state" / "tasks" / "old"
    task_dir.mkdir(parents=True)
    (task_dir / "context_history.json").write_text(json.dumps(updates))
    with DaemonProcess(tmp_path) as daemon:
        state = ok(daemon.call("inspect", {"task": "old"}))
        assert (state["updates"], state["deleted_range"], state["dirty"]) == (updates, None, False)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("context_history.json", b'[[1, [0, [[0, [[5, "te'),
        ("context_history.json", b'{"not": "an overlay"}'),
        ("ctxwin.json", b'{"format": 1, "deleted_range": [7, 9]}'),
        ("ctxwin.json", b"\x00\x01"),
    ],
)
def test_a_corrupt_file_is_set_aside_and_the_task_starts_empty(
    tmp_path: Path, name: str, content: bytes
) -> None:
    """A file that does not parse is renamed aside (kept), logged, and the task starts empty."""
    task_dir = tmp_path / "state" / "tasks" / "bad"
    task_dir.mkdir(parents=True)
    (task_dir / name).write_bytes(content)
    with DaemonProcess(tmp_path) as daemon:
        state = ok(daemon.call("inspect", {"task": "bad"}))
        assert (state["updates"], state["deleted_range"]) == ([], None)
        kept = [p for p in task_dir.iterdir() if p.name.startswith(name + ".corrupt-")]
        assert [p.read_bytes() for p in kept] == [content]
        assert not (task_dir / name).exists()
        events = [json.loads(line) for line in daemon.log().splitlines() if line.startswith("{")]
        assert any(e["event"] == "corrupt_file" and e["task"] == "bad" for e in events)
        ok(daemon.call("compact", {"task": "bad", "messages": reads(3), "keep": "none", "ts": 1}))
        ok(daemon.call("flush", {"task": "bad"}))
        assert (
            read_json(task_dir / "context_history.json")
            == ok(daemon.call("inspect", {"task": "bad"}))["updates"]
        )


class Writer(threading.Thread):
    """A client that keeps changing one task and records what each flush acknowledged."""

    def __init__(
        self, daemon: DaemonProcess, task: str, kind: str, start_at: int, steps: int
    ) -> None:
        super().__init__(daemon=True)
        self.steps = steps
        self.busy_enough = threading.Event()
        self.daemon_process = daemon
        self.task = task
        self.kind = kind
        self.position = start_at
        self.acknowledged: int | None = None
        self.stop_event = threading.Event()

    def call(self, op: str, args: dict[str, Any]) -> proto.Reply | None:
        """One request; None once the test stops this writer (the daemon was killed)."""
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(self.daemon_process.endpoint)
            sock.send(proto.encode_request(1, op, args))
            while not sock.poll(20):
                if self.stop_event.is_set():
                    return None
            return proto.decode_reply(sock.recv())
        finally:
            sock.close(linger=0)

    def step(self) -> bool:
        self.position += 1
        args: dict[str, Any]
        if self.kind == "range":
            args = {"task": self.task, "messages": FIRST, "deleted_range": [2, self.position]}
            return self.call("truncated_messages", args) is not None
        args = {"task": self.task, "messages": reads(self.position), "ts": self.position}
        return self.call("optimize_file_reads", args) is not None

    def run(self) -> None:
        try:
            while self.step():
                self.steps -= 1
                if self.steps <= 0:
                    self.busy_enough.set()
                if self.position % 3 == 0:
                    reply = self.call("flush", {"task": self.task})
                    if reply is None:
                        return
                    if reply.ok:
                        self.acknowledged = self.position
        finally:
            self.busy_enough.set()


def _check_files(daemon: DaemonProcess) -> None:
    """Every state file parses completely."""
    for task_dir in (daemon.state_dir / "tasks").iterdir():
        for name in ("context_history.json", "ctxwin.json"):
            path = task_dir / name
            if path.exists():
                read_json(path)


@pytest.mark.slow
def test_kill_9_loop_never_leaves_partial_files_and_keeps_flushed_state(tmp_path: Path) -> None:
    """Killed with SIGKILL while clients write: files always parse and flushed state survives."""
    cycles = 50 if CI else 10
    rng = random.Random(1234)
    daemon = DaemonProcess(tmp_path, "--debounce-ms", "20", "--debounce-max-ms", "50")
    positions = {"range": 2, "reads": 2}
    checked = 0
    for _ in range(cycles):
        daemon.start()
        writers = [
            Writer(daemon, "ranged", "range", positions["range"], rng.randint(1, 12)),
            Writer(daemon, "reader", "reads", positions["reads"], rng.randint(1, 12)),
        ]
        for writer in writers:
            writer.start()
        # Kill after a random number of requests, mid-traffic.
        assert writers[rng.randint(0, 1)].busy_enough.wait(30)
        daemon.kill()
        for writer in writers:
            writer.stop_event.set()
            writer.join(10)
        _check_files(daemon)
        ranged, reader = writers
        if ranged.acknowledged is not None:
            meta = read_json(daemon.task_dir("ranged") / "ctxwin.json")
            assert meta["deleted_range"][1] >= ranged.acknowledged
            checked += 1
        if reader.acknowledged is not None:
            updates = read_json(daemon.task_dir("reader") / "ctxwin.json")["updates"]
            # Each read but the last is replaced: reads(n) leaves n - 1 updated messages.
            assert len(updates) >= reader.acknowledged - 1
            checked += 1
        positions = {"range": ranged.position, "reads": reader.position}
    assert checked >= cycles // 2, "too few acknowledged flushes to prove anything"
    daemon.start()
    try:
        assert ok(daemon.call("inspect", {"task": "reader"}))["dirty"] is False
    finally:
        assert daemon.stop() == 0


def test_sigterm_finishes_requests_taken_and_flushes_them(tmp_path: Path) -> None:
    """On SIGTERM every request already taken is answered and its change is on disk; exit 0."""
    daemon = DaemonProcess(tmp_path, "--debounce-ms", "60000", "--debounce-max-ms", "60000")
    daemon.start()
    with WirePeer(daemon.endpoint) as peer:
        for end in range(3, 153):  # 50 per task: within the mailbox bound
            args = {"task": f"t{end % 3}", "messages": FIRST, "deleted_range": [2, end]}
            peer.send(end, "truncated_messages", args)
        assert peer.sock.poll(10_000), "no reply before the signal"
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(30) == 0
        replies = []  # all delivered: the daemon lingers until its replies are sent
        while peer.sock.poll(200):
            replies.append(peer.recv())
    assert all(reply.ok for reply in replies)
    answered = {reply.id for reply in replies}
    for task in range(3):
        ends = [end for end in answered if end is not None and end % 3 == task]
        if ends:
            meta = read_json(daemon.task_dir(f"t{task}") / "ctxwin.json")
            assert meta["deleted_range"] == [2, max(ends)]


def _calibrate(daemon: DaemonProcess, task: str, turns: int) -> None:
    """Report usage 1.5x each estimate for ``turns`` turns."""
    messages = [*FIRST, {"role": "user", "content": [{"type": "text", "text": "w " * 400}]}]
    model = {"id": "m", "context_window": 64_000}
    previous: dict[str, Any] | None = None
    for turn in range(turns + 1):
        args: dict[str, Any] = {"task": task, "messages": messages, "model": model}
        args["estimate"] = True
        if previous is not None:
            args["previous_request"] = previous
        result = ok(daemon.call("prepare_request", args))
        raw = result["estimated_tokens"] / result["calibration"]
        previous = {"ts": turn + 1, "tokens_in": round(raw * 1.5), "tokens_out": 10}


def test_calibration_outlives_close_idle_eviction_and_restart(tmp_path: Path) -> None:
    """A task's calibration is kept in its ctxwin.json: close, idle stop and restart keep it."""
    with DaemonProcess(tmp_path, "--idle-timeout", "0.3") as daemon:
        _calibrate(daemon, "closed", 3)
        before = ok(daemon.call("inspect", {"task": "closed"}))["calibration"]
        assert before["samples"] == 3
        ok(daemon.call("close", {"task": "closed"}))
        assert ok(daemon.call("inspect", {"task": "closed"}))["calibration"] == before
        stored = read_json(daemon.task_dir("closed") / "ctxwin.json")["calibration"]
        assert stored == before
        _calibrate(daemon, "idle", 2)
        wait_until(lambda: ok(daemon.call("stats"))["actors"] <= 1, 10, "the idle actors stop")
        wait_until(
            lambda: ok(daemon.call("stats"))["actors"] == 0, 10, "the inspected actor stops too"
        )
        assert ok(daemon.call("inspect", {"task": "idle"}))["calibration"]["samples"] == 2
    with DaemonProcess(tmp_path) as daemon:
        assert ok(daemon.call("inspect", {"task": "closed"}))["calibration"] == before


def test_an_absurd_stored_calibration_or_threshold_is_bounded_not_internal(
    tmp_path: Path,
) -> None:
    """A stored ratio of 1e308 is taken as 4 (its bound); threshold 1e308 is a bad_request.

    Both used to overflow: prepare_request and should_compact answered internal.
    """
    with DaemonProcess(tmp_path) as daemon:
        _calibrate(daemon, "odd", 1)
        ok(daemon.call("flush", {"task": "odd"}))
    meta_path = daemon.task_dir("odd") / "ctxwin.json"
    meta = read_json(meta_path)
    meta["calibration"]["ratio"] = 1e308
    meta_path.write_text(json.dumps(meta))
    with DaemonProcess(tmp_path) as daemon:
        model = {"id": "m", "context_window": 64_000}
        args = {"task": "odd", "messages": FIRST, "model": model, "estimate": True}
        result = ok(daemon.call("prepare_request", args))
        assert result["calibration"] == 4.0
        usage = {"ts": 1, "tokens_in": 10, "tokens_out": 1}
        refused = daemon.call(
            "should_compact", {"usage": usage, "model": model, "threshold": 1e308}
        )
        assert (refused.ok, refused.code) == (False, "bad_request")
        assert "threshold must be a fraction of the context window" in (refused.message or "")


def test_a_planted_task_directory_link_is_refused_while_others_are_served(
    tmp_path: Path,
) -> None:
    """tasks/<id> made a link to another directory: that task is refused, nothing goes through.

    Neither a read of what it points to nor a write into it; the daemon
    serves other tasks, and the same task once the link is removed.
    """
    with DaemonProcess(tmp_path, "--debounce-ms", "20") as daemon:
        ok(daemon.call("truncated_messages", {"task": "mine", "messages": FIRST}))
        ok(daemon.call("flush", {"task": "mine"}))
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / "ctxwin.json").write_text('{"not": "ours"}')
        daemon.task_dir("planted").symlink_to(elsewhere)
        refused = daemon.call("inspect", {"task": "planted"})
        assert (refused.ok, refused.code) == (False, "busy")
        assert "is a symbolic link" in (refused.message or "")
        args = {"task": "planted", "messages": FIRST, "deleted_range": [2, 3]}
        assert not daemon.call("truncated_messages", args).ok
        ok(daemon.call("truncated_messages", {"task": "other", "messages": FIRST}))
        ok(daemon.call("flush", {"task": "other"}))
        assert ["ctxwin.json"] == os.listdir(elsewhere)
        assert '{"not": "ours"}' == (elsewhere / "ctxwin.json").read_text()
        assert "task_dir_refused" in daemon.log()
        daemon.task_dir("planted").unlink()
        ok(daemon.call("truncated_messages", args))
        ok(daemon.call("flush", {"task": "planted"}))
        assert daemon.task_dir("planted").is_dir()
        assert not daemon.task_dir("planted").is_symlink()


@pytest.mark.parametrize("how", ["other-writable", "other-uid", "tasks-link"])
def test_a_state_dir_not_ours_stops_the_start(tmp_path: Path, how: str) -> None:
    """A state dir others may write to or of another uid, or a linked tasks dir: exit 1, why."""
    if how == "other-uid" and os.geteuid() != 0:
        pytest.skip("a directory of another uid needs root")
    daemon = DaemonProcess(tmp_path)
    state = daemon.state_dir
    state.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.mkdir()
    if how == "other-writable":
        state.chmod(0o777)
        reason = r"may be written by others \(mode 777\)"
    elif how == "other-uid":
        os.chown(state, 65534, 65534)
        reason = "belongs to uid 65534"
    else:
        (state / "tasks").symlink_to(victim)
        reason = "tasks dir .* is a symbolic link"
    try:
        with pytest.raises(RuntimeError, match="ctxwind exited with 1") as raised:
            daemon.start()
    finally:
        daemon.stop()
    assert re.search(reason, str(raised.value)), str(raised.value)
    assert not (state / "ctxwind.lock").exists()
    assert [] == os.listdir(victim)
