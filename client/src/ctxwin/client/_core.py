"""The client's pure logic, shared by the blocking and the asyncio twins.

Everything here is free of sockets, sleeps and event loops: checking and
wrapping each op's request (the builders themselves are in ``_ops.py``),
encoding it, matching and reading replies, mapping error codes to exceptions,
and the ``busy`` back-off policy. ``_sync.py`` and ``_async.py`` only move bytes
and wait.
"""

from __future__ import annotations

import enum
import errno
import math
import os
import stat
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar, cast

import zmq

from ctxwin import proto
from ctxwin.proto import (
    DeletedRange,
    ErrorCode,
    Limits,
    ProtocolError,
    Reply,
)

from ._errors import (
    AuthenticationError,
    BadReplyError,
    BadRequestError,
    BusyError,
    CtxwinError,
    DaemonUnavailableError,
    OwnedElsewhereError,
    RequestTimeoutError,
    TooLargeError,
    error_for,
)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

DEFAULT_TIMEOUT = 30.0
"""Seconds a call waits for its reply unless told otherwise (busy retries included)."""

Messages = Sequence[Mapping[str, Any]]
"""A conversation as the caller holds it: a sequence of message maps (SPEC.md §1)."""

CompactKeep = Literal["quarter", "none"]
Strategy = Literal["default", "fit", "auto"]
Pricing = str | Mapping[str, float]
"""A price sheet's name, or its ``{input, cache_write, cache_read}`` multipliers."""


def copy_pricing(pricing: Pricing | None) -> Any:
    """``pricing`` as sent: multipliers as a plain dict, anything else as it is (the
    daemon names what is wrong with it)."""
    if isinstance(pricing, Mapping):
        return dict(pricing)
    return pricing


class Unset(enum.Enum):
    """Marks an argument that was not given (distinct from an explicit None)."""

    UNSET = "UNSET"


UNSET = Unset.UNSET
"""Default of ``deleted_range``: use the task's stored range. ``None`` clears it."""

RangeArg = DeletedRange | Literal[Unset.UNSET]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How ``busy`` replies are retried: bounded attempts, exponential back-off.

    Attributes:
        busy_retries: how many times a request refused with ``busy`` is sent again.
        initial_delay: seconds before the first retry.
        max_delay: cap on any single delay.
        multiplier: growth of the delay from one retry to the next.
    """

    busy_retries: int = 5
    initial_delay: float = 0.05
    max_delay: float = 1.0
    multiplier: float = 2.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0 for the first retry)."""
        return min(self.max_delay, self.initial_delay * self.multiplier**attempt)


@dataclass(frozen=True, slots=True)
class Retry:
    """Outcome of a reply that asks for the request to be sent again after ``delay`` s."""

    delay: float


@dataclass(frozen=True, slots=True)
class Call(Generic[T_co]):
    """One op ready to send: its name, checked arguments and the fields its result carries.

    ``timeout``, when set, is how long the call may take (the client's default
    otherwise; a timeout given to the client's ``call`` wins). ``finish``, when
    set, turns the raw result into the op's usual result (delta sync rebuilds a
    view from a patch there) before it is checked. ``sending``, when set, is
    work the transport does right after the request is out, while the daemon
    works on it (delta sync hashes the messages it sends there).
    """

    op: str
    args: dict[str, Any]
    finish: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    timeout: float | None = None
    sending: Callable[[], None] | None = None

    def parse(self, result: dict[str, Any]) -> T_co:
        """The typed result, after checking that every field of the op is present.

        Raises:
            BadReplyError: a field of the wire table is missing, or a view
                patch does not fit the history it was made for.
        """
        if self.finish is not None:
            try:
                result = self.finish(result)
            except (ValueError, KeyError, TypeError) as exc:
                raise BadReplyError(f"{self.op}: unusable view patch: {exc}") from None
        missing = [name for name in proto.RESULT_FIELDS[self.op] if name not in result]
        if missing:
            raise BadReplyError(f"{self.op}: reply lacks field(s) {', '.join(missing)}")
        return cast(T_co, result)


def _error_from_protocol(exc: ProtocolError) -> CtxwinError:
    error = error_for(exc.code.value, exc.message)
    error.local = True
    return error


def build(op: str, args: dict[str, Any], timeout: float | None, **optional: Any) -> Call[Any]:
    """Check the args against proto's schema and wrap them in a Call (for the builders in ``_ops``).

    Optional args that are None are left out, except ``deleted_range``, where
    None is meaningful (it clears the stored range) and :data:`UNSET` means left out.
    """
    for name, value in optional.items():
        if name == "deleted_range":
            if value is not UNSET:
                args[name] = None if value is None else list(value)
        elif value is not None:
            args[name] = value
    try:
        proto.validate_args(op, args)
    except ProtocolError as exc:
        raise _error_from_protocol(exc) from None
    return Call(op, args, timeout=timeout)


def copy_messages(messages: Messages) -> list[Any]:
    """The messages as a list of plain dicts, as they are sent."""
    return [dict(message) for message in messages]


# Delta sync: send what a turn adds, get views back as patches.


class DeltaSync:
    """A task handle's delta sync with the daemon (DESIGN.md, delta sync).

    After the first full list, history ops send ``base``/``base_digest``/``append``
    and ask for views as patches, which are applied to the caller's own list.
    When the daemon answers ``resync_required`` the whole list goes once
    more; a daemon without delta sync (it refuses the fields) turns it off.
    """

    __slots__ = ("enabled", "patches", "sender", "view")

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.sender = proto.DeltaSender()
        self.patches = proto.PatchReceiver()
        # Patches with ``prepend`` entries; plain ones from a daemon that refuses the form.
        self.view = "patch_prepend"

    def reset(self) -> None:
        """Send the whole list next time (after editing old messages in place)."""
        self.sender.reset()

    def call(self, call: Call[T], messages: Messages, *, owned: bool = False) -> Call[T]:
        """``call`` (built with no messages) for ``messages``, by delta when enabled.

        ``messages`` must stay as it is until the reply is in (its view is
        rebuilt from it): task handles pass a copy taken when called. With
        ``owned`` (that copy, which nothing changes afterwards) the record of
        what was sent keeps it instead of copying it again.
        """
        if not self.enabled:
            return _with_history(call, {"messages": copy_messages(messages)})
        history = self.sender.args_for(messages)
        sender, patches = self.sender, self.patches

        def sending() -> None:
            sender.prepare(messages, history)

        def finish(result: dict[str, Any]) -> dict[str, Any]:
            patch = result.pop("patch", None)
            if patch is not None:
                result["messages"] = patches.apply(messages, patch)
            elif "messages" in result:
                patches.took_whole()
            sender.sent(messages, history, owned=owned)
            return result

        asked: dict[str, Any] = {**history, "view": self.view}
        if patches.token is not None:
            asked["patch_base"] = patches.token
        return _with_history(call, asked, finish, sending)

    def retry(
        self, call: Call[T], messages: Messages, error: CtxwinError, *, owned: bool = False
    ) -> Call[T] | None:
        """The request to send after ``error``, or None when the error stands."""
        if not self.enabled:
            return None
        if error.code == ErrorCode.RESYNC_REQUIRED.value:
            self.sender.reset()
            return self.call(call, messages, owned=owned)
        refused = error.code == ErrorCode.BAD_REQUEST.value and not error.local
        if refused and self.view != "patch" and "view must be one of" in error.message:
            self.view = "patch"  # a daemon without the prepend form
            return self.call(call, messages, owned=owned)
        if refused and "unknown argument" in error.message:  # a daemon without delta sync
            self.enabled = False
            self.sender.reset()
            return self.call(call, messages, owned=owned)
        return None


def _with_history(
    call: Call[T],
    history: Mapping[str, Any],
    finish: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    sending: Callable[[], None] | None = None,
) -> Call[T]:
    args = {name: value for name, value in call.args.items() if name != "messages"}
    args.update(history)
    try:
        proto.validate_args(call.op, args)
    except ProtocolError as exc:
        raise _error_from_protocol(exc) from None
    return Call(call.op, args, finish, call.timeout, sending)


# Framing, matching and outcome.

POLL_SLICE = 3600.0
"""The longest single wait on the socket; a longer (or infinite) timeout waits in slices."""


def poll_ms(remaining: float) -> int:
    """Milliseconds to wait for a reply with ``remaining`` seconds left (at least 1)."""
    return max(1, math.ceil(min(remaining, POLL_SLICE) * 1000))


def left(deadline: float) -> float:
    """Seconds until ``deadline`` (a ``time.monotonic()`` value), never negative."""
    return max(0.0, deadline - time.monotonic())


def budget(timeout: float) -> float:
    """A call's timeout as seconds to spend: never negative (NaN counts as 0)."""
    return timeout if timeout > 0 else 0.0


def call_budget(call: Call[Any], timeout: float | None, default: float) -> float:
    """Seconds ``call`` may take: ``timeout`` if given, else the call's own, else ``default``."""
    if timeout is None:
        timeout = default if call.timeout is None else call.timeout
    return budget(timeout)


def lock_wait(seconds: float) -> float | None:
    """``seconds`` as a lock wait's timeout (None: no limit), ``threading`` or ``asyncio``."""
    return None if seconds > threading.TIMEOUT_MAX else seconds


def left_for_resend(deadline: float, cause: CtxwinError, endpoint: str) -> float:
    """Seconds left for a resend after ``cause``; raises when none are left (it is never sent).

    Raises:
        RequestTimeoutError: the deadline has passed.
    """
    remaining = left(deadline)
    if remaining <= 0:
        raise RequestTimeoutError(
            f"no time left to send the whole history again after {cause.code}",
            endpoint=endpoint,
        ) from cause
    return remaining


def queued_too_long(op: str, endpoint: str, behind: str) -> RequestTimeoutError:
    """The timeout of a call that waited its whole time behind earlier calls on ``behind``."""
    return RequestTimeoutError(
        f"{op}: earlier calls on this {behind} took the whole timeout", endpoint=endpoint
    )


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


# The connection: what the socket's monitor reports, and what that means for a call.

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

SAFE_TO_REPEAT = frozenset(
    {
        # Reads: they change nothing.
        "ping",
        "stats",
        "context_window_info",
        "count_tokens",
        "next_truncation_range",
        "should_compact",
        "plan",
        "inspect",
        "truncated_messages",  # sets the range it is given, if any: the same twice
        # Their effect is the same however often it happens.
        "flush",
        "close",
    }
)
"""Ops sent again when the connection drops with them in flight.

A request in flight when the daemon went away may or may not have been applied
(and a daemon killed with SIGKILL loses what it had not written yet). These ops
give the same state and the same answer whether or not the first one was
applied. The others (``prepare_request``, ``compact``, ``rollback``, the file read
optimisations, ...) change the task, and their answer says what they changed: a
second sending would cut again or report nothing changed, so they fail instead.
"""

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
    """

    __slots__ = ("connected", "curve", "dropped", "handshake", "reached", "refused_since")

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


def unreachable_error(endpoint: str, link: Link) -> DaemonUnavailableError:
    """The error for a call when nothing can answer at ``endpoint``."""
    if link.reached:
        what = f"the daemon at {endpoint} went away and has not come back in {RECONNECT_GRACE:g} s"
    else:
        what = f"nothing answers at {endpoint} (no daemon listens there)"
    return DaemonUnavailableError(f"{what}: {_START_HINT}", endpoint=endpoint)


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


# Authentication: the pinned server key, this client's key pair, and referrals.


@dataclass(frozen=True, slots=True)
class Curve:
    """The keys a client's TCP connections authenticate with (40-character Z85 bytes)."""

    server: bytes
    public: bytes
    secret: bytes

    def apply(self, sock: zmq.Socket[Any], endpoint: str) -> bool:
        """Set the keys on ``sock`` for a ``tcp://`` endpoint; whether it uses CURVE."""
        if not endpoint.startswith("tcp://"):
            return False  # ipc: the socket file's permissions decide who connects
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
        return True


def curve_keys(server_key: str | None, client_key: str | os.PathLike[str] | None) -> Curve | None:
    """The CURVE keys of a client, or None when no server key is pinned.

    Args:
        server_key: the daemon's public key (40 Z85 characters, or a key file),
            else ``$CTXWIN_SERVER_KEY``; None: no CURVE.
        client_key: this client's ``.key_secret`` file, else ``$CTXWIN_CLIENT_KEY``,
            else ``client.key_secret`` in the keys directory (``$CTXWIN_KEYS_DIR``,
            ``~/.config/ctxwin/keys``).

    Raises:
        BadRequestError: a key cannot be read (``local`` set).
    """
    server = server_key or os.environ.get(proto.SERVER_KEY_ENV)
    if not server:
        return None
    path = client_key or os.environ.get(proto.CLIENT_KEY_ENV)
    secret_path = Path(path) if path else proto.default_keys_dir() / "client.key_secret"
    try:
        pinned = proto.read_public_key(server)
        if not secret_path.exists() and not path:
            raise proto.KeyFileError(
                f"no client key pair at {secret_path}: create one with `ctxwin keys client NAME`"
            )
        pair = proto.read_key_file(secret_path.expanduser(), secret=True)
    except proto.KeyFileError as exc:
        error = BadRequestError(f"CURVE keys: {exc}")
        error.local = True
        raise error from None
    assert pair.secret is not None
    return Curve(pinned, pair.public, pair.secret)


def trusted_endpoints(given: Sequence[str] | None) -> frozenset[str]:
    """Endpoints a client follows referrals to without CURVE: ``given``, else the environment."""
    if given is None:
        raw = os.environ.get(TRUSTED_ENDPOINTS_ENV, "")
        given = [item for item in raw.replace(",", " ").split() if item]
    return frozenset(given)


TRUSTED_ENDPOINTS_ENV = "CTXWIN_TRUSTED_ENDPOINTS"
"""Endpoints (comma or space separated) a client follows ``owned_elsewhere`` to without CURVE."""


def _own_socket(endpoint: str) -> str | None:
    """Why an ipc endpoint is not known to be this user's daemon, or None when it is.

    Its socket file must be ours, in a directory of ours that nobody else can write:
    another user cannot make such a file, nor swap it afterwards.
    """
    path = proto.ipc_path(endpoint)
    if path is None:
        return "an abstract socket has no owner to check"
    try:
        info = os.lstat(path)
        parent = os.stat(os.path.dirname(os.path.realpath(path)))
    except OSError as exc:
        return f"its socket cannot be checked: {exc.strerror}"
    uid = os.getuid()
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != uid:
        return "its socket file is not this user's"
    if parent.st_uid != uid or parent.st_mode & 0o022:
        return "its directory is not this user's alone"
    return None


def check_referral(owner: str, curve: Curve | None, trusted: Collection[str]) -> None:
    """Return when the client may send a call to ``owner`` (``owned_elsewhere``); raise if not.

    The owner's endpoint comes from the state store, which the client does not
    trust: a referral is followed only where the peer is authenticated. With a
    pinned server key a ``tcp://`` owner is reached with the same key (a peer
    without its secret never completes the handshake, so never receives the
    call); an ipc owner must be this user's own socket; any other endpoint only
    when the caller listed it (``trusted_endpoints=``, ``$CTXWIN_TRUSTED_ENDPOINTS``).

    Raises:
        OwnedElsewhereError: the referral is not followed; ``owner`` names it.
    """
    if owner in trusted:
        return
    if owner.startswith("tcp://"):
        if curve is not None:
            return
        reason = "it is TCP and no server key is pinned, so nothing proves who answers there"
    elif owner.startswith("ipc://"):
        why = _own_socket(owner)
        if why is None:
            return
        reason = why
    else:
        reason = "it is not an ipc:// or tcp:// endpoint"
    raise OwnedElsewhereError(
        f"the task is owned by the daemon at {owner}, not followed: {reason} "
        f"(pin the fleet's server key, or list the endpoint in ${TRUSTED_ENDPOINTS_ENV})",
        owner=owner,
    )


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


def encode(call: Call[Any], request_id: int, limits: Limits | None = None) -> bytes:
    """The request body for ``call``.

    Raises:
        TooLargeError: the body exceeds the protocol's frame limit; it is never sent.
        BadRequestError: something in the arguments has no msgpack form (an
            integer beyond 64 bits, a string with a lone surrogate, an object).
    """
    try:
        body = proto.encode_request(request_id, call.op, call.args)
    except (OverflowError, TypeError, ValueError) as exc:
        refused = BadRequestError(f"{call.op}: the request cannot be encoded: {exc}")
        refused.local = True
        raise refused from None
    limit = (limits or Limits()).max_frame_bytes
    if len(body) > limit:
        error = TooLargeError(f"{call.op}: request of {len(body)} bytes exceeds {limit}")
        error.local = True
        raise error
    return body


def decode(frames: Sequence[bytes]) -> Reply | None:
    """The reply carried by a received multipart message, or None when it is not one.

    The body is the last frame (an empty delimiter frame may precede it).
    """
    if not frames:
        return None
    try:
        return proto.decode_reply(frames[-1])
    except ProtocolError:
        return None


def reply_target(reply: Reply, pending: Collection[int]) -> int | None:
    """Which pending request a reply answers, or None to drop it.

    A reply with a known id answers that request. An error without an id (the
    daemon could not read the id) can only be attributed when exactly one
    request is in flight; otherwise it is dropped and the callers time out.
    """
    if reply.id is not None:
        return reply.id if reply.id in pending else None
    if not reply.ok and len(pending) == 1:
        return next(iter(pending))
    return None


@dataclass(frozen=True, slots=True)
class Follow:
    """Send the call again to the task's owner (``owned_elsewhere``), and stay with it."""

    owner: str


def outcome(
    call: Call[T],
    reply: Reply,
    attempt: int,
    policy: RetryPolicy,
    remaining: float,
    followed: bool = False,
) -> T | Retry | Follow:
    """What to do with the reply to attempt number ``attempt`` of ``call``.

    Args:
        call: the request that was sent.
        reply: its reply.
        attempt: 0 for the first send, then 1, 2, ... for busy retries.
        policy: the busy back-off policy.
        remaining: seconds left of the call's timeout.
        followed: whether this call already followed one ``owned_elsewhere``.

    Returns:
        The typed result, a :class:`Retry` telling how long to wait first, or
        a :class:`Follow` naming the endpoint to send it to (once per call).

    Raises:
        CtxwinError: the subclass for the reply's error code (``BusyError``
            once the retries or the time are spent).
    """
    if reply.ok:
        return call.parse(reply.result or {})
    if reply.code == ErrorCode.BUSY.value:
        delay = policy.delay(attempt)
        if attempt < policy.busy_retries and delay < remaining:
            return Retry(delay)
        raise BusyError(f"{call.op}: daemon still busy after {attempt + 1} attempt(s)")
    if reply.code == ErrorCode.OWNED_ELSEWHERE.value:
        # Refused before anything ran: safe to send again, to the owner it names.
        if reply.owner and not followed:
            return Follow(reply.owner)
        raise OwnedElsewhereError(reply.message or "", owner=reply.owner)
    raise error_for(reply.code, reply.message)
