"""Error codes of the wire protocol (DESIGN.md "Wire protocol")."""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """The ``error.code`` values a reply may carry."""

    BAD_REQUEST = "bad_request"
    UNKNOWN_OP = "unknown_op"
    INVALID_TASK_ID = "invalid_task_id"
    UNSUPPORTED_VERSION = "unsupported_version"
    TOO_LARGE = "too_large"
    BUSY = "busy"
    RESYNC_REQUIRED = "resync_required"
    OWNED_ELSEWHERE = "owned_elsewhere"
    FORBIDDEN = "forbidden"
    INTERNAL = "internal"


class ProtocolError(Exception):
    """A request or reply that breaks the wire contract.

    Args:
        code: the error code to answer with.
        message: a human-readable reason, safe to log (no conversation text).
        request_id: the request's ``id`` when it could be read, else None.
        owner: for ``owned_elsewhere``, the endpoint of the daemon that owns the task.
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        request_id: int | None = None,
        owner: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id
        self.owner = owner

    def __repr__(self) -> str:
        return f"ProtocolError({self.code.value!r}, {self.message!r})"
