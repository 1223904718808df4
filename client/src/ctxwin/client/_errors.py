"""Exceptions raised by the client: one class per wire error code, plus transport errors."""

from __future__ import annotations

from ctxwin.proto import ErrorCode


class CtxwinError(Exception):
    """Base of every error the client raises.

    Args:
        code: the wire error code (``bad_request``, ``busy``, ...) or, for
            errors found on this side, ``unavailable``, ``timeout``,
            ``closed`` or ``bad_reply``.
        message: a human-readable reason.

    Attributes:
        code: as given.
        message: as given.
        local: True when the client refused the request itself, before
            sending it (the same check the daemon would make).
    """

    code: str = "error"
    local: bool = False

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r})"


class _CodedError(CtxwinError):
    """An error whose class fixes its code; built from the message alone."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(code or type(self).code, message)


class BadRequestError(_CodedError):
    """The daemon (or the client's own check) refused the request's shape."""

    code = ErrorCode.BAD_REQUEST.value


class UnknownOpError(_CodedError):
    """The daemon does not know the op."""

    code = ErrorCode.UNKNOWN_OP.value


class InvalidTaskIdError(BadRequestError):
    """The task id does not match :data:`ctxwin.proto.TASK_ID_PATTERN`."""

    code = ErrorCode.INVALID_TASK_ID.value


class UnsupportedVersionError(_CodedError):
    """The daemon speaks another protocol version."""

    code = ErrorCode.UNSUPPORTED_VERSION.value


class TooLargeError(_CodedError):
    """The request is larger than the protocol's frame limit."""

    code = ErrorCode.TOO_LARGE.value


class BusyError(_CodedError):
    """The daemon refused the request for now; raised once the retries are spent."""

    code = ErrorCode.BUSY.value


class ResyncRequiredError(_CodedError):
    """The daemon's state for the task no longer matches what the caller sent."""

    code = ErrorCode.RESYNC_REQUIRED.value


class OwnedElsewhereError(_CodedError):
    """Another daemon owns the task (fleet mode); ``owner`` is its endpoint.

    The client follows it once by itself; this is raised when the owner
    refers the call on again, or named no endpoint.
    """

    code = ErrorCode.OWNED_ELSEWHERE.value

    def __init__(self, message: str, code: str | None = None, owner: str | None = None) -> None:
        super().__init__(message, code)
        self.owner = owner


class InternalError(_CodedError):
    """The daemon failed while handling the request."""

    code = ErrorCode.INTERNAL.value


class BadReplyError(_CodedError):
    """The daemon's reply does not match the wire contract."""

    code = "bad_reply"


class DaemonUnavailableError(_CodedError):
    """Nothing answered at the endpoint.

    Attributes:
        endpoint: the endpoint tried.
        reason: why, without the endpoint or advice on starting a daemon (the
            command line gives its own); the message when it says nothing more.
    """

    code = "unavailable"

    def __init__(
        self, message: str, code: str | None = None, *, endpoint: str = "", reason: str = ""
    ) -> None:
        super().__init__(message, code)
        self.endpoint = endpoint
        self.reason = reason or message


class AuthenticationError(DaemonUnavailableError):
    """The connection's CURVE handshake failed: nothing was sent.

    The daemon refused this client's key, the server at the endpoint does not
    hold the pinned server key, or one side uses CURVE and the other does not.
    """

    code = "unauthenticated"


class ForbiddenError(_CodedError):
    """The daemon refused a task outside the task-id prefixes this client's key is bound to."""

    code = ErrorCode.FORBIDDEN.value


class RequestTimeoutError(DaemonUnavailableError, TimeoutError):
    """No reply arrived within the call's timeout."""

    code = "timeout"


class ClientClosedError(_CodedError):
    """The client was used after ``close()``."""

    code = "closed"


ERROR_CLASSES: dict[str, type[_CodedError]] = {
    cls.code: cls
    for cls in (
        BadRequestError,
        UnknownOpError,
        InvalidTaskIdError,
        UnsupportedVersionError,
        TooLargeError,
        BusyError,
        ResyncRequiredError,
        OwnedElsewhereError,
        ForbiddenError,
        InternalError,
    )
}
"""The exception class for each wire error code."""


def error_for(code: str | None, message: str | None) -> CtxwinError:
    """The exception for an error reply: its code's class, or the base class for a new code.

    Args:
        code: ``error.code`` from the reply.
        message: ``error.message`` from the reply.

    Returns:
        An instance of the matching :class:`CtxwinError` subclass.
    """
    code = code or "internal"
    cls = ERROR_CLASSES.get(code)
    if cls is None:
        return CtxwinError(code, message or "")
    return cls(message or "")
