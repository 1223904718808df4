"""The client's pure logic, shared by the blocking and the asyncio twins.

Everything here is free of sockets, sleeps and event loops: checking and
wrapping each op's request (the builders themselves are in ``_ops.py``),
encoding it, matching and reading replies, mapping error codes to exceptions,
and the ``busy`` back-off policy. Beside it, equally pure: ``_link.py`` (the
connection as the socket's monitor reports it), ``_auth.py`` (CURVE keys and
referrals) and ``_delta.py`` (delta sync). ``_sync.py`` and ``_async.py`` only
move bytes and wait.
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, cast

from ctxwin import proto
from ctxwin.proto import (
    DeletedRange,
    ErrorCode,
    Limits,
    ProtocolError,
    Reply,
)

from ._errors import (
    BadReplyError,
    BadRequestError,
    BusyError,
    CtxwinError,
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


def validate(op: str, args: dict[str, Any]) -> None:
    """Check ``args`` against proto's schema for ``op``, as the daemon would.

    Raises:
        CtxwinError: the daemon's error class for what is wrong (``local`` set).
    """
    try:
        proto.validate_args(op, args)
    except ProtocolError as exc:
        error = error_for(exc.code.value, exc.message)
        error.local = True
        raise error from None


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
    validate(op, args)
    return Call(op, args, timeout=timeout)


def copy_messages(messages: Messages) -> list[Any]:
    """The messages as a list of plain dicts, as they are sent."""
    return [dict(message) for message in messages]


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
