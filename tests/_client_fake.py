"""A scripted ROUTER for client edge cases the real daemon cannot be made to produce."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from ctxwin import proto
from tests._service import Service

Handler = Callable[[proto.Request], list[bytes]]
"""Maps a request to the reply bodies to send back (none, one or several)."""


def ok(request: proto.Request, result: dict[str, Any] | None = None) -> list[bytes]:
    """One successful reply to ``request``."""
    return [proto.encode_result(request.id, result or {"pong": True, "version": "x", "proto": 1})]


def error(request: proto.Request, code: str, message: str = "refused") -> list[bytes]:
    """One error reply to ``request``."""
    return [proto.encode_error(request.id, code, message)]


class FakeRouter(Service):
    """A ROUTER on an ipc endpoint under ``root`` answering through ``handler`` in a thread."""

    def __init__(self, root: Path, handler: Handler, name: str = "fake.sock") -> None:
        self.endpoint = f"ipc://{root / name}"
        self.handler = handler
        self.requests: list[proto.Request] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(5):
            raise TimeoutError("fake router did not bind")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        # A context of its own, terminated on exit, so the ipc file is gone
        # before a later router binds the same path.
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sock = context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(self.endpoint)
            self._ready.set()
            while not self._stop.is_set():
                if not sock.poll(20):
                    continue
                frames = sock.recv_multipart()
                identity, body = frames[0], frames[-1]
                request = proto.decode_request(body)
                self.requests.append(request)
                for reply in self.handler(request):
                    sock.send_multipart([identity, reply])
        finally:
            sock.close(linger=0)
            context.term()
