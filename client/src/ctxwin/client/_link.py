"""A socket's connection to the daemon: what its monitor reports, and what that means for a call.

The twins open their socket with :func:`open_dealer`, feed its monitor's
events into a :class:`Link` and ask it (purely, like ``_core.py``) whether the
daemon is reachable, whether the security handshake was refused, what the
daemon supports, and whether a call in flight when the connection dropped may
be sent again.
"""

from __future__ import annotations

import errno
import itertools
import os
from typing import Any, Protocol, TypeVar

import zmq

from ctxwin import proto
from ctxwin.proto import PingResult

from ._auth import Curve
from ._core import Call
from ._errors import (
    AuthenticationError,
    BadRequestError,
    CtxwinError,
    DaemonUnavailableError,
)

SocketT = TypeVar("SocketT", bound="zmq.Socket[Any]")


class SocketOwner(Protocol):
    """What a client's socket reads of its client whenever it connects (both clients)."""

    endpoint: str
    curve: Curve | None
    autostart: bool


def open_dealer(
    context: zmq.Context[SocketT], endpoint: str, curve: Curve | None
) -> tuple[SocketT, SocketT, bool]:
    """A DEALER (linger 0) connected to ``endpoint``, its monitor of :data:`MONITOR_EVENTS`,
    and whether it authenticates with CURVE; nothing is left open when it fails.

    Raises:
        CtxwinError: :func:`connect_error`'s, when the socket cannot connect.
    """
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    uses_curve = curve is not None and curve.apply(sock, endpoint)
    monitor = _monitor(sock)
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as exc:
        close_dealer(sock, monitor)
        raise connect_error(endpoint, exc) from None
    return sock, monitor, uses_curve


_monitors = itertools.count()


def _monitor(sock: SocketT) -> SocketT:
    """``sock``'s monitor of :data:`MONITOR_EVENTS`, its queue without a limit.

    libzmq's I/O thread blocks when a monitor's queue is full, and with it every
    socket of the context. An idle blocking client reads no events, and while its
    daemon is down a refused connection is retried ten times a second: with the
    default limits the context stopped after about 200 s. Unread events now cost
    memory instead (a few dozen bytes each), until the next call reads them.
    """
    address = f"inproc://ctxwin-monitor-{os.getpid()}-{next(_monitors)}"
    sock.monitor(address, MONITOR_EVENTS)
    monitor: SocketT = sock.context.socket(zmq.PAIR)
    monitor.setsockopt(zmq.RCVHWM, 0)  # 0 on either end: the inproc queue has no limit
    monitor.connect(address)
    return monitor


def close_dealer(sock: zmq.Socket[Any] | None, monitor: zmq.Socket[Any] | None) -> None:
    """Close a socket :func:`open_dealer` made and its monitor (linger 0), those not None."""
    if sock is not None:
        sock.disable_monitor()
        sock.close(linger=0)
    if monitor is not None:
        monitor.close(linger=0)


def connect_error(endpoint: str, exc: zmq.ZMQError) -> CtxwinError:
    """The error for a socket that cannot connect to ``endpoint``.

    An address ZeroMQ cannot parse is a usage error (never sent); anything else
    (no descriptors left, say) means the daemon cannot be reached from here.
    """
    if exc.errno in (errno.EINVAL, errno.ENAMETOOLONG, zmq.EPROTONOSUPPORT, zmq.ENOCOMPATPROTO):
        error: CtxwinError = BadRequestError(
            f"cannot connect to endpoint {endpoint!r}: {exc} "
            "(expected ipc:///path/to/socket or tcp://host:port)"
        )
        error.local = True
        return error
    return DaemonUnavailableError(f"cannot connect to {endpoint}: {exc}", endpoint=endpoint)


_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
MONITOR_EVENTS = (
    zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED | _HANDSHAKE_FAILED
)
"""The socket monitor events a client watches (pyzmq ``Socket.get_monitor_socket``)."""

RECONNECT_GRACE = 5.0
"""Seconds a client that has reached its daemon before lets refused connections go on
(a restart: the systemd unit's RestartSec is 1 s) before it says nothing answers."""

SAFE_TO_REPEAT = proto.SAFE_TO_REPEAT
"""Ops sent again when the connection drops with them in flight (each op's declaration
says whether it is safe, ``ctxwin.proto.OpSpec.safe_to_repeat``)."""

_START_HINT = (
    "start it with `ctxwind` (or `systemctl --user start ctxwind`), "
    "or create the client with autostart=True"
)


class Dropped(Exception):
    """The connection dropped with a request in flight (the client resends it or fails)."""


class Link:
    """A socket's connection to the daemon as its monitor reports it.

    Attributes:
        connected: the transport is up.
        reached: some socket of this client has been connected before (kept
            across sockets: the daemon existed, it may be restarting).
        dropped: the connection went down since the socket was made.
        refused_since: when attempts to connect started failing (monotonic),
            or None while they do not.
        curve: the socket authenticates with CURVE.
        handshake: the monitor event of a failed security handshake, or None:
            for a CURVE socket any failure (a server without the pinned key
            just hangs up), for a NULL one a refusal or a mechanism mismatch
            (a NULL handshake cut short is a daemon going away, not a refusal).
        features: what the daemon on this connection supports (ping's
            ``features``), or None until a ping has said.
    """

    __slots__ = (
        "connected",
        "curve",
        "dropped",
        "features",
        "handshake",
        "reached",
        "refused_since",
    )

    def __init__(self) -> None:
        self.reached = False
        self.fresh()

    def fresh(self, curve: bool = False) -> None:
        """Start over for a new socket (``reached`` stays)."""
        self.connected = False
        self.dropped = False
        self.refused_since: float | None = None
        self.curve = curve
        self.handshake: int | None = None
        self.features: frozenset[str] | None = None

    def feed(self, event: int, now: float) -> None:
        """Take one monitor event, observed at ``now``."""
        if event & _HANDSHAKE_FAILED:
            if self.curve or event != zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                self.handshake = self.handshake or event
        elif event == zmq.EVENT_CONNECTED:
            self.connected = self.reached = True
            self.refused_since = None
        elif event == zmq.EVENT_DISCONNECTED:
            self.dropped = self.dropped or self.connected
            self.connected = False
        elif event == zmq.EVENT_CONNECT_RETRIED and self.refused_since is None:
            self.refused_since = now

    def unreachable(self, now: float) -> bool:
        """Whether nothing can answer: refused at once, or for the grace after a daemon left."""
        if self.connected or self.refused_since is None:
            return False
        return not self.reached or now - self.refused_since >= RECONNECT_GRACE


def features_of(pong: PingResult) -> frozenset[str]:
    """The features a ping's result names (none from a daemon that predates the list)."""
    return frozenset(pong.get("features", ()))


def unreachable_error(endpoint: str, link: Link) -> DaemonUnavailableError:
    """The error for a call when nothing can answer at ``endpoint``."""
    if link.reached:
        reason = f"the daemon went away and has not come back in {RECONNECT_GRACE:g} s"
        what = f"the daemon at {endpoint} went away and has not come back in {RECONNECT_GRACE:g} s"
    else:
        reason = "no daemon listens there"
        what = f"nothing answers at {endpoint} (no daemon listens there)"
    return DaemonUnavailableError(f"{what}: {_START_HINT}", endpoint=endpoint, reason=reason)


HANDSHAKE_EVENT_MS = 100
"""How long a send that found no pipe waits for the monitor to say the handshake was refused."""


def handshake_error(endpoint: str, link: Link) -> AuthenticationError:
    """The error for a connection whose security handshake failed (nothing was sent on it)."""
    if link.handshake == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        what = (
            f"the daemon at {endpoint} refused this client's key: it is not on the daemon's "
            "allow-list (add it there with `ctxwin keys allow CLIENT.key`)"
        )
    elif link.curve:
        what = (
            f"the CURVE handshake with {endpoint} failed: whatever answers there does not "
            "hold the pinned server key (a wrong server key, a daemon without keys, or "
            "another program on that address); nothing was sent"
        )
    else:
        what = (
            f"the daemon at {endpoint} requires CURVE authentication: pin its public key "
            f"(server_key=, ${proto.SERVER_KEY_ENV} or --server-key) and give this client "
            f"a key pair it allows (client_key=, ${proto.CLIENT_KEY_ENV})"
        )
    return AuthenticationError(what, endpoint=endpoint)


def after_drop(call: Call[Any], endpoint: str) -> None:
    """Return when ``call`` may be sent again after its connection dropped; raise otherwise.

    Raises:
        DaemonUnavailableError: ``call`` is not in :data:`SAFE_TO_REPEAT`.
    """
    if call.op not in SAFE_TO_REPEAT:
        raise DaemonUnavailableError(
            f"{call.op}: the connection to {endpoint} dropped with the request in flight "
            "(the daemon stopped or restarted); it may or may not have been applied, and "
            f"{call.op} is not sent twice since it changes the task: inspect the task to see",
            endpoint=endpoint,
        )
