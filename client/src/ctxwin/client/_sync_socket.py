"""The blocking client's socket: one DEALER to the daemon, one request at a time.

:class:`BlockingSocket` only moves bytes and waits: it makes the socket on
first use (and again after it was dropped), sends a request and polls for its
reply and for the monitor's events, and drops the socket when the connection
goes away or a reply is late, so that nothing queued on it reaches a daemon
later. What a reply means (retries, referrals) is the client's (``_sync.py``).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from ctxwin.proto import Reply

from . import _autostart, _core, _link
from ._core import Call
from ._errors import ClientClosedError, DaemonUnavailableError, RequestTimeoutError
from ._turns import Turns

__all__ = ["BlockingSocket"]


class BlockingSocket:
    """The socket of a :class:`~ctxwin.client.Client`.

    Attributes:
        owner: the client, whose endpoint, keys and settings it connects with.
        context: the ZeroMQ context.
        link: the connection as the socket's monitor reports it.
    """

    def __init__(self, owner: _link.SocketOwner, context: zmq.Context[Any]) -> None:
        self.owner = owner
        self.context = context
        self._socket: zmq.Socket[bytes] | None = None
        self._monitor: zmq.Socket[bytes] | None = None  # set and cleared with _socket
        self.link = _link.Link()
        self._ids = itertools.count(1)
        self._turns = Turns()
        self.closed = False

    @property
    def connected(self) -> bool:
        """Whether a socket is open (what :attr:`link` says is about that socket)."""
        return self._socket is not None

    def move_to(self, endpoint: str, deadline: float) -> None:
        """Move the client to ``endpoint``: its next exchange connects there (no other call
        of this client is in flight to wait for until ``deadline``)."""
        self.drop()
        self.owner.endpoint = endpoint

    def turn(self, op: str, budget: float) -> contextlib.AbstractContextManager[None]:
        """The client's turn for a call of ``op`` (one at a time), waited for within ``budget``."""
        wait = _core.lock_wait(budget)
        return self._turns.take(wait, _core.queued_too_long, op, self.owner.endpoint, "client")

    def close(self) -> None:
        """Close for good, after the call in flight (if any)."""
        with self._turns.take(None, RuntimeError):
            self.closed = True
            self.drop()

    def drop(self) -> None:
        """Close the socket and its monitor; the next exchange makes new ones."""
        _link.close_dealer(self._socket, self._monitor)
        self._socket = self._monitor = None

    def _connect(self) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
        """The socket and its monitor, made (and connected) if there are none."""
        if self.closed:
            raise ClientClosedError("the client is closed")
        if self._socket is None or self._monitor is None:
            if self.owner.autostart:
                _autostart.ensure_daemon(self.owner.endpoint)
            sock, monitor, curve = _link.open_dealer(
                self.context, self.owner.endpoint, self.owner.curve
            )
            self._socket, self._monitor = sock, monitor
            self.link.fresh(curve)
            return sock, monitor
        return self._socket, self._monitor

    def _catch_up(self) -> None:
        """Take the monitor's events so far into the link."""
        monitor = self._monitor
        while monitor is not None and monitor.poll(0, zmq.POLLIN):
            event = parse_monitor_message(monitor.recv_multipart())
            self.link.feed(event["event"], time.monotonic())

    def exchange(self, call: Call[Any], deadline: float) -> Reply:
        """Send ``call`` and wait for its reply until ``deadline`` (a monotonic time).

        Raises:
            Dropped: the connection dropped with the request in flight.
            CtxwinError: the request cannot be sent, the handshake was refused,
                nothing answers, or no reply came in time (the socket is dropped).
        """
        self._connect()
        self._catch_up()
        if self.link.dropped:  # while no call was waiting: nothing was lost, start afresh
            self.drop()
        sock, monitor = self._connect()
        request_id = next(self._ids)
        try:
            sock.send(_core.encode(call, request_id), zmq.NOBLOCK)
        except zmq.Again:
            # No pipe to queue on: a refused handshake takes it away. Its event follows at once.
            if monitor.poll(_link.HANDSHAKE_EVENT_MS, zmq.POLLIN):
                self._catch_up()
            self.drop()
            if self.link.handshake is not None:
                raise _link.handshake_error(self.owner.endpoint, self.link) from None
            raise DaemonUnavailableError(
                f"{call.op}: cannot queue the request for {self.owner.endpoint}",
                endpoint=self.owner.endpoint,
            ) from None
        if call.sending is not None:
            call.sending()  # while the daemon works on the request
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        while True:
            remaining = deadline - time.monotonic()
            if not remaining > 0:  # NaN included
                # A late reply must never meet a later request: start over.
                self.drop()
                raise RequestTimeoutError(
                    f"{call.op}: no reply from {self.owner.endpoint} within the timeout",
                    endpoint=self.owner.endpoint,
                )
            ready = dict(poller.poll(_core.poll_ms(remaining)))
            if sock in ready:
                reply = _core.decode(sock.recv_multipart())
                if reply is not None and _core.reply_target(reply, (request_id,)) == request_id:
                    return reply
            if monitor in ready:
                self._catch_up()
            if self.link.handshake is not None:  # refused: the request never left
                self.drop()
                raise _link.handshake_error(self.owner.endpoint, self.link)
            # Whatever is queued must not reach a daemon later: start over.
            if self.link.dropped:
                self.drop()
                raise _link.Dropped
            if self.link.unreachable(time.monotonic()):
                self.drop()
                raise _link.unreachable_error(self.owner.endpoint, self.link)
