"""Another client pinging the daemon back to back while one client's costly request runs.

Shared by tests/test_fairness.py (the worst ping under a bound) and bench/fairness.py
(the figures), with the read-tool pattern that made RE2 stall (issue 33).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import zmq

from ctxwin import proto

HOSTILE_PATTERN = r"(?P<path>(?:\pL|\pN|\pP){1,200}\pS{1,200})!"
"""43 characters of counted Unicode classes: RE2 took 1-2 s to compile each (8 MiB program)."""

PING = proto.encode_request(1, "ping", {})


def hostile_tools(salt: str, count: int = proto.MAX_READ_PATTERNS) -> list[dict[str, Any]]:
    """Read tools of the hostile pattern, each with a suffix of its own (no cache helps)."""
    return [
        {"name": f"sh{number}", "arg": "command", "pattern": f"{HOSTILE_PATTERN}{salt}{number}"}
        for number in range(count)
    ]


class Pinger:
    """Another client pinging back to back in a thread; the round trips it saw (seconds).

    Args:
        endpoint: the daemon's.
        interval: the pause between a reply and the next ping.
        patience: how long a ping may wait for its reply before the pinger gives up
            (``unanswered``).
    """

    def __init__(self, endpoint: str, interval: float, patience: float) -> None:
        self.endpoint = endpoint
        self.interval = interval
        self.patience = patience
        self.times: list[float] = []
        self.unanswered = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        # A context of its own: the sender's (a 60 MiB body) would queue the pings.
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        try:
            while not self._done.is_set():
                started = time.perf_counter()
                sock.send(PING)
                if not sock.poll(int(self.patience * 1000)):
                    self.unanswered = True
                    return
                sock.recv()
                self.times.append(time.perf_counter() - started)
                self._done.wait(self.interval)
        finally:
            sock.close(linger=0)
            context.term()

    @property
    def worst(self) -> float:
        """The longest round trip seen (seconds)."""
        assert not self.unanswered, "the other client's pings went unanswered"
        assert self.times, "the other client sent no ping"
        return max(self.times)

    def start(self) -> None:
        """Start pinging; return after one warm-up ping, which is not counted."""
        self._thread.start()
        while not self.times and not self.unanswered:
            time.sleep(0.001)
        self.times.clear()

    def stop(self) -> None:
        """Stop pinging and wait for the thread."""
        self._done.set()
        self._thread.join()


@contextmanager
def pinging(endpoint: str, interval: float = 0.002, patience: float = 120.0) -> Iterator[Pinger]:
    """Ping ``endpoint`` from another client while the block runs (see :class:`Pinger`)."""
    pinger = Pinger(endpoint, interval, patience)
    pinger.start()
    try:
        yield pinger
    finally:
        pinger.stop()
