"""The ROUTER socket's hot path: binding, draining, caps, envelopes, replies.

The socket is a plain (blocking-API) pyzmq socket whose FD the event loop
watches with ``add_reader``; on wake-up it is drained with ``NOBLOCK`` until
``EAGAIN``. Measured here: ``zmq.asyncio`` costs about 2x a raw blocking
REQ/REP echo, this about 1.3x. The ZeroMQ FD is edge-triggered and any socket
call may consume its edge, so every send made outside the drain loop is
followed by a look at ``EVENTS``.

A message within the frame and byte caps that is one body frame (optionally
after an empty delimiter) goes to the ``on_message`` callback with its
envelope; any other is answered here (``too_large``, ``bad_request``).

Connections are accepted one at a time and only while descriptors are left
under the open-files limit (:class:`._accept.AcceptGate`): libzmq aborts the process
when an ipc ``accept()`` fails with EMFILE. A connection that has not finished
its handshake within 5 s is dropped (``ZMQ_HANDSHAKE_IVL``; libzmq's default
is 30 s), so silent connections cannot hold the descriptors for long.

Routing ids: a reply goes to the connection that holds the request's routing
id. A peer may choose its own (``ZMQ_ROUTING_ID``); with ``ROUTER_HANDOVER``
a second connection presenting the same id would take the first one's
replies, and libzmq 4.3.5 aborts the process when an id it generates for a
new connection is held by a peer that chose it. So handover is off, a request
from a routing id the ROUTER did not generate (five bytes, the first zero) is
refused unanswered, and libzmq's id counter (which starts from C's ``rand()``,
unseeded: the same ids in every process) is seeded from ``os.urandom`` before
the socket is made, so the ids it will generate cannot be foretold.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import time
from collections.abc import Callable
from typing import cast

import structlog
import zmq

from ctxwin import proto

from ._accept import FD_RESERVE, MIN_CLIENTS, AcceptGate, soft_open_files_limit
from ._auth import Authenticator, KeysError, ServerKeys, load_server_keys
from ._config import Config
from ._errors import StartupError
from ._logging import Throttle

__all__ = ["OnMessage", "RouterSocket"]

_log = structlog.get_logger("ctxwin.daemon.server")

# Messages handled per wake-up before yielding to actors and timers, and the time after
# which a wake-up yields whatever it handled: 64 requests of 1 MiB each decoded in one
# wake-up kept every reply made meanwhile (a ping's) in the outbox for 2.7 s.
_DRAIN_BUDGET = 256
_DRAIN_S = 0.010
_clock = time.monotonic
_EVENTS_CHECKS = 4
# Replies made while draining leave in batches of at most this many (see RouterSocket.send).
_SEND_BATCH = 32

# The hot path calls the backend socket methods with plain int flags: the
# high-level wrappers turn flags and EVENTS into enums, which costs more than
# the call itself (measured: send 0.7 us -> 0.24 us, EVENTS 2.1 us -> 1.8 us).
_recv = zmq.backend.Socket.recv
_send = zmq.backend.Socket.send
_get = cast(Callable[[zmq.Socket[bytes], int], int], zmq.backend.Socket.get)
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE_NOBLOCK = int(zmq.SNDMORE) | int(zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_CLOSE_LINGER_MS = 2000
HANDSHAKE_MS = 5000
"""A connection that has not finished its handshake after this long is dropped."""
_ZAP_DOMAIN = b"ctxwind"
_REFUSED_ID_LOG_S = 10.0

OnMessage = Callable[[list[bytes], bytes, zmq.Frame], None]
"""Takes a request: its envelope, its body and its last frame (:func:`client_of` names
the client from it)."""


def client_of(frame: zmq.Frame) -> str:
    """The name the ZAP handler gave a message's connection (``key:NAME``, ``uid:N``, ...).

    About 1.5 us (a property lookup in libzmq): asked only when a request needs it.
    """
    try:
        name = frame.get("User-Id")
    except zmq.ZMQError:
        return "?"
    return name if isinstance(name, str) and name else "?"


def _seed_routing_ids() -> None:
    """Seed C's ``rand()``, where libzmq's ROUTER starts the routing ids it generates.

    Unseeded, every process's first generated id is ``00 6b 8b 45 67``: a
    peer could take the next ones as its own ids, and libzmq asserts (aborting
    the daemon) when it then generates one of them.
    """
    try:
        libc = ctypes.CDLL(None)
        libc.srand(ctypes.c_uint(int.from_bytes(os.urandom(4), "little")))
    except (OSError, AttributeError) as exc:
        _log.warning("routing_ids_unseeded", reason=str(exc))


class RouterSocket:
    """The daemon's ROUTER socket: requests in, replies out.

    Args:
        config: the daemon's configuration (endpoints, caps, keys dir, client bindings).
        on_message: called with each request's envelope, body and client name,
            on the event loop, while the socket drains.

    Raises:
        StartupError: the server keys cannot be loaded.
    """

    def __init__(self, config: Config, on_message: OnMessage) -> None:
        self.keys: ServerKeys | None = None
        self.authenticator: Authenticator | None = None
        self.refused_ids = 0  # requests refused for a routing id the peer chose
        self._refused_id_log = Throttle(_REFUSED_ID_LOG_S)
        if config.keys_dir is not None and any(e.startswith("tcp://") for e in config.endpoints):
            try:
                self.keys = load_server_keys(config.keys_dir)
            except KeysError as exc:
                raise StartupError(str(exc)) from None
        # Client name -> task-id prefixes; the name comes with each message (User-Id).
        self.bindings = dict(config.client_tasks) if self.keys is not None else {}
        self.endpoints = config.endpoints
        self.limits = config.limits
        self.received = 0  # messages received since start
        self.loop = asyncio.get_running_loop()
        self.context = zmq.Context()
        _seed_routing_ids()
        self.socket: zmq.Socket[bytes] = self.context.socket(zmq.ROUTER)
        # Every connection is asked about (and named) by the ZAP handler, ipc ones too.
        self.socket.setsockopt(zmq.ZAP_DOMAIN, _ZAP_DOMAIN)
        self.socket.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
        self.socket.setsockopt(zmq.MAXMSGSIZE, config.max_bytes)
        self.socket.setsockopt(zmq.LINGER, 0)
        if any("[" in endpoint for endpoint in config.endpoints):
            self.socket.setsockopt(zmq.IPV6, 1)
        self.gate = AcceptGate(self.socket)
        fd = self.socket.getsockopt(zmq.FD)
        assert isinstance(fd, int)
        self._fd = fd
        self._on_message = on_message
        self._draining = False
        self._drain_scheduled = False
        self._reading = False
        self._outbox: list[tuple[list[bytes], bytes]] = []
        self._last: zmq.Frame | None = None

    def bind(self) -> int:
        """Bind every configured endpoint and gate its accepts (see :class:`AcceptGate`).

        Returns:
            The number of listeners whose accepts are gated.

        Raises:
            StartupError: an endpoint cannot be bound, or the open-files limit
                leaves room for fewer than 8 clients.
        """
        # libzmq takes a listener's mechanism from the socket's options at bind time:
        # ipc endpoints first (NULL), then CURVE for every TCP one; the ZAP handler is up
        # before the first.
        if self.authenticator is None:
            self.authenticator = Authenticator(self.context, self.keys, self.bindings)
            self.authenticator.start()
        endpoints = sorted(self.endpoints, key=lambda e: e.startswith("tcp://"))
        curve_on = False
        for endpoint in endpoints:
            curve = endpoint.startswith("tcp://") and self.keys is not None
            if curve and not curve_on:
                assert self.keys is not None
                curve_on = True
                self.socket.setsockopt(zmq.CURVE_SERVER, 1)
                self.socket.setsockopt(zmq.CURVE_SECRETKEY, self.keys.secret)
            try:
                self.socket.bind(endpoint)
            except zmq.ZMQError as exc:
                raise StartupError(f"cannot bind {endpoint}: {exc}") from None
            path = proto.ipc_path(endpoint)
            if path is not None:
                os.chmod(path, 0o600)
            mechanism = "curve" if curve else "null"
            if endpoint.startswith("tcp://") and not proto.is_loopback(endpoint):
                _log.warning(
                    "listening_publicly",
                    endpoint=endpoint,
                    mechanism=mechanism,
                    server_key=self.keys.public.decode() if self.keys else None,
                    bound_clients=sorted(self.bindings),
                )
            else:
                _log.info("listening", endpoint=endpoint, mechanism=mechanism)
        self.gate.start()
        room = self.gate.room() - FD_RESERVE
        if room < MIN_CLIENTS:
            limit = soft_open_files_limit()
            in_use = limit - room - FD_RESERVE
            raise StartupError(
                f"the open-files limit ({limit}) is too low: {in_use} descriptors are in use "
                f"and {FD_RESERVE} are kept for state files, which leaves room for "
                f"{max(room, 0)} clients; ctxwind needs a limit of at least "
                f"{in_use + FD_RESERVE + MIN_CLIENTS} (raise LimitNOFILE= in the unit, "
                "or the hard limit with ulimit -Hn)"
            )
        return len(self.gate.listeners)

    def start_reading(self) -> None:
        """Start taking requests."""
        self.loop.add_reader(self._fd, self._on_readable)
        self._reading = True
        self._on_readable()  # messages may have queued before the reader was added

    def stop_reading(self) -> None:
        """Stop taking requests (replies can still be sent)."""
        if self._reading:
            self.loop.remove_reader(self._fd)
            self._reading = False

    def close(self) -> None:
        """Close the socket, giving queued replies a moment to leave."""
        self.stop_reading()
        self.gate.close()
        self.socket.close(linger=_CLOSE_LINGER_MS)
        if self.authenticator is not None:
            self.authenticator.close()
        self.context.term()

    def send(self, envelope: list[bytes], body: bytes) -> None:
        """Send one reply; never raises (a vanished peer's reply is dropped).

        Replies made while a wake-up drains a burst wait and leave together, 32
        at a time and the rest when the drain ends (the first few messages of a
        wake-up are answered at once, see ``_on_readable``): libzmq wakes its
        I/O thread (an eventfd write and a context switch) for a message sent
        once that thread has caught up, so replies sent one by one between
        requests cost a wake-up each. Measured with 8 pipelining clients
        (bench/wire.py): throughput 70000 -> 105000 pings/s, libzmq's thread
        2.6 -> 1.9 us per ping.
        """
        if self._draining:
            self._outbox.append((envelope, body))
            if len(self._outbox) >= _SEND_BATCH:
                self._send_outbox()
            return
        self._outbox.append((envelope, body))
        self._send_outbox()
        self._check_events()

    def _send_outbox(self) -> None:
        sock = self.socket
        outbox, self._outbox = self._outbox, []
        for envelope, body in outbox:
            try:
                for part in envelope:
                    _send(sock, part, _SNDMORE_NOBLOCK)
                _send(sock, body, _NOBLOCK)
            except zmq.ZMQError as exc:
                _log.warning("reply_dropped", error=str(exc))

    def _check_events(self) -> None:
        # A send may have consumed the FD's edge for a pending incoming message.
        if self._reading and not self._drain_scheduled and _get(self.socket, _EVENTS) & _POLLIN:
            self._drain_scheduled = True
            self.loop.call_soon(self._on_readable)

    # -- receiving ------------------------------------------------------------------

    def _on_readable(self) -> None:
        self._drain_scheduled = False
        if not self._reading:
            return
        sock = self.socket
        self._draining = True
        deadline = _clock() + _DRAIN_S
        try:
            for handled in range(_DRAIN_BUDGET):
                # Reading EVENTS (1.8 us) re-arms the edge-triggered FD when nothing
                # is left, as does a recv that fails with EAGAIN (9 us, the cost of
                # the exception). A wake-up usually brings one message: check
                # EVENTS first (after sending the replies so far, so that a lone
                # request's reply leaves at once); deep into a burst, checking
                # every message costs more than one failed recv at its end.
                if handled < _EVENTS_CHECKS:
                    if self._outbox:
                        self._send_outbox()
                    if not _get(sock, _EVENTS) & _POLLIN:
                        return
                try:
                    frames = self._receive(sock)
                except zmq.Again:
                    return
                except zmq.ZMQError as exc:
                    _log.warning("receive_failed", error=str(exc))
                    return
                if frames is not None:
                    self._handle_frames(frames)
                    if _clock() > deadline:
                        break  # costly requests: answer what waits (a ping) first
            # Budget spent: let actors and timers run, then go on.
            self._drain_scheduled = True
            self.loop.call_soon(self._on_readable)
        finally:
            self._draining = False
            if self._outbox:
                self._send_outbox()
                self._check_events()

    def _receive(self, sock: zmq.Socket[bytes]) -> list[bytes] | None:
        """One message, frame by frame, within the frame and byte caps.

        Returns None when the message broke a cap (the reply is sent here). Its
        last frame is kept in :attr:`_last` (it carries the client's name).
        """
        limits = self.limits
        # The first frame is the peer's routing id, which a ROUTER always follows
        # with the peer's frames: received as bytes (0.12 us). The others with
        # copy=False for Frame.more: about half the cost of recv + getsockopt(RCVMORE).
        first = _recv(sock, _NOBLOCK, True)
        frame = _recv(sock, _NOBLOCK, False)
        frames = [first, frame.bytes]
        total = len(frames[1])  # the peer's bytes: the routing id is the ROUTER's own
        too_many = False
        while frame.more:
            frame = _recv(sock, _NOBLOCK, False)
            total += len(frame)
            if len(frames) < limits.max_frames:
                frames.append(frame.bytes)
            else:
                too_many = True  # keep receiving, keep nothing: the message must be consumed
        self.received += 1
        if too_many or total > limits.max_total_bytes:
            reason = (
                f"message has more than {limits.max_frames} frames"
                if too_many
                else f"message of {total} bytes exceeds {limits.max_total_bytes}"
            )
            _log.info("request_refused", code="too_large", reason=reason)
            envelope = _bare_envelope(frames)
            request_id = proto.peek_request_id(frame.buffer)  # the body is the last frame
            self.send(envelope, proto.encode_error(request_id, proto.ErrorCode.TOO_LARGE, reason))
            return None
        self._last = frame
        return frames

    def _handle_frames(self, frames: list[bytes]) -> None:
        last, self._last = self._last, None  # not kept: it holds a copy of the body
        peer = frames[0]
        if len(peer) != 5 or peer[0]:
            self._refuse_chosen_id(peer)
            return
        envelope, body = _split(frames)
        if body is None:
            _log.info("request_refused", code="bad_request", reason="not one body frame")
            self.send(
                envelope,
                proto.encode_error(
                    None,
                    proto.ErrorCode.BAD_REQUEST,
                    "a request is one body frame, optionally after an empty delimiter frame",
                ),
            )
            return
        assert last is not None
        self._on_message(envelope, body, last)

    def _refuse_chosen_id(self, peer: bytes) -> None:
        """Drop a request from a routing id the peer chose: no reply (it could reach another
        connection that chose the same id), a log line at most every 10 s."""
        self.refused_ids += 1
        if self._refused_id_log.due():
            _log.warning(
                "request_refused",
                code="routing_id",
                reason="the client chose its own routing id (ZMQ_ROUTING_ID); "
                "the daemon answers only the ids it gives",
                refused=self.refused_ids,
            )


def _split(frames: list[bytes]) -> tuple[list[bytes], bytes | None]:
    """A message's envelope (what the reply goes back with) and its body frame.

    ``[peer, body]`` or ``[peer, ..., b"", body]``; any other shape has no
    body (None) and is answered on ``[peer, b""]`` or ``[peer]``.
    """
    count = len(frames)
    if count == 2:
        return frames[:1], frames[1]
    if count >= 3 and frames[-2] == b"":
        return frames[:-1], frames[-1]
    return _bare_envelope(frames), None


def _bare_envelope(frames: list[bytes]) -> list[bytes]:
    """The envelope of a message refused before its body is read: the peer, and a delimiter."""
    return [frames[0], b""] if len(frames) > 2 and frames[1] == b"" else frames[:1]
