"""One client's costly request never holds up another client's ping (issue 33, "Medium").

Each test starts a real daemon, sends the costly request from one client and
pings from another all the while, and checks the longest ping. The bound is
one second, generous against the 250 ms aimed at (bench/fairness.py measures
it) so that a loaded machine does not fail it; without the guards these
stalls lasted from seconds to minutes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import zmq

from ctxwin import proto
from tests._daemon import DaemonProcess, WirePeer

HOSTILE_PATTERN = r"(?P<path>(?:\pL|\pN|\pP){1,200}\pS{1,200})!"
"""43 characters of counted Unicode classes: RE2 took 1-2 s to compile each (8 MiB program)."""

PING = proto.encode_request(1, "ping", {})


class Pinger:
    """Another client pinging back to back in a thread; the round trips it saw."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.times: list[float] = []
        self.unanswered = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        try:
            while not self._done.is_set():
                started = time.monotonic()
                sock.send(PING)
                if not sock.poll(120_000):
                    self.unanswered = True
                    return
                sock.recv()
                self.times.append(time.monotonic() - started)
                self._done.wait(0.002)
        finally:
            sock.close(linger=0)

    @property
    def worst(self) -> float:
        """The longest round trip seen (seconds)."""
        assert not self.unanswered, "the other client's pings went unanswered"
        assert self.times, "the other client sent no ping"
        return max(self.times)


@contextmanager
def pinging(endpoint: str) -> Iterator[Pinger]:
    """Ping ``endpoint`` from another client while the block runs (one warm-up ping first)."""
    pinger = Pinger(endpoint)
    pinger._thread.start()
    while not pinger.times and not pinger.unanswered:
        time.sleep(0.001)
    pinger.times.clear()
    try:
        yield pinger
    finally:
        pinger._done.set()
        pinger._thread.join()


def _flood_tools(salt: str, count: int = proto.MAX_READ_PATTERNS) -> list[dict[str, Any]]:
    """Read tools of the hostile pattern, each with a suffix of its own (no cache helps)."""
    return [
        {"name": f"sh{number}", "arg": "command", "pattern": f"{HOSTILE_PATTERN}{salt}{number}"}
        for number in range(count)
    ]


def test_costly_read_tool_patterns_do_not_stall_other_clients(tmp_path: Path) -> None:
    """16 tasks at once, each naming 16 hostile patterns: each refused as too large by name.

    Another client's pings stay quick all the while (they waited 1-2 s per
    pattern, one after another, when RE2 compiled them under 8 MiB).
    """
    with DaemonProcess(tmp_path) as daemon, WirePeer(daemon.endpoint, timeout=300) as sender:
        with pinging(daemon.endpoint) as pinger:
            for number in range(16):
                tools = _flood_tools(f"t{number}-")
                args = {"task": f"flood-{number}", "dialect": "anthropic", "read_tools": tools}
                sender.send(number + 1, "inspect", args)
            replies = [sender.recv() for _ in range(16)]
        for reply in replies:
            assert (reply.ok, reply.code) == (False, "bad_request")
            assert "read_tools[0]: a read tool's pattern is too large" in (reply.message or "")
        assert pinger.worst < 1.0, f"another client's ping waited {pinger.worst:.2f}s"


def test_more_patterns_than_allowed_are_refused_before_any_is_compiled(
    tmp_path: Path,
) -> None:
    """17 tools with a pattern: bad_request naming the cap (64 tools without one are fine)."""
    with DaemonProcess(tmp_path) as daemon, WirePeer(daemon.endpoint, timeout=60) as sender:
        tools = _flood_tools("cap", proto.MAX_READ_PATTERNS + 1)
        reply = sender.call("inspect", {"task": "cap", "dialect": "anthropic", "read_tools": tools})
        assert (reply.ok, reply.code) == (False, "bad_request")
        assert "holds 17 tools with a pattern; at most 16" in (reply.message or "")
        assert '"read_tool_patterns_compiled"' not in daemon.log()
        plain = [{"name": f"read{n}", "arg": "path"} for n in range(64)]
        args = {"task": "cap", "dialect": "anthropic", "read_tools": plain}
        assert sender.call("inspect", args).ok


def test_read_tool_patterns_are_compiled_once_per_text(tmp_path: Path) -> None:
    """The same 16 costly-but-allowed patterns sent by many tasks are compiled once each."""
    tools = [
        {"name": f"sh{n}", "arg": "command", "pattern": rf"(?P<path>\S{{1,{100 + n}}})"}
        for n in range(16)
    ]
    with DaemonProcess(tmp_path) as daemon, WirePeer(daemon.endpoint, timeout=60) as sender:
        for number in range(8):
            args = {"task": f"same-{number}", "dialect": "anthropic", "read_tools": tools}
            assert sender.call("inspect", args).ok
        compiled = [
            json.loads(line)
            for line in daemon.log().splitlines()
            if '"read_tool_patterns_compiled"' in line
        ]
        assert sum(event["compiled"] for event in compiled) == 16
        assert sum(event["cached"] for event in compiled) == 16 * 7


def test_stored_costly_patterns_do_not_stall_the_restart(tmp_path: Path) -> None:
    """Hostile patterns written into a stored task: loading it keeps others' pings quick."""
    with DaemonProcess(tmp_path) as daemon, WirePeer(daemon.endpoint) as peer:
        ok = peer.call("inspect", {"task": "kept", "dialect": "anthropic", "read_tools": []})
        assert ok.ok
        reads = [{"name": "Bash", "arg": "command", "pattern": "shell"}]
        assert peer.call("inspect", {"task": "kept", "read_tools": reads}).ok
        assert peer.call("flush", {"task": "kept"}).ok
    meta_path = daemon.task_dir("kept") / "ctxwin.json"
    meta = json.loads(meta_path.read_text())
    meta["read_tools"] = _flood_tools("s")
    meta_path.write_text(json.dumps(meta))
    with DaemonProcess(tmp_path) as daemon, WirePeer(daemon.endpoint, timeout=120) as peer:
        with pinging(daemon.endpoint) as pinger:
            seen = peer.call("inspect", {"task": "kept"})
        assert seen.ok
        assert seen.result is not None
        unused = seen.result["read_tools_unused"]
        assert [position for position, _ in unused] == list(range(proto.MAX_READ_PATTERNS))
        assert all("too large" in reason for _, reason in unused)
        assert pinger.worst < 1.0, f"another client's ping waited {pinger.worst:.2f}s"
