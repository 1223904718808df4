"""ctxwin client: blocking and asyncio clients of ``ctxwind``, helpers for agents, the CLI."""

from __future__ import annotations

from ctxwin.proto import is_context_window_error

from ._async import AsyncClient
from ._async_task import AsyncTask
from ._autostart import ensure_daemon
from ._core import DEFAULT_TIMEOUT, UNSET, Call, RetryPolicy
from ._errors import (
    AuthenticationError,
    BadReplyError,
    BadRequestError,
    BusyError,
    ClientClosedError,
    CtxwinError,
    DaemonUnavailableError,
    ForbiddenError,
    InternalError,
    InvalidTaskIdError,
    OwnedElsewhereError,
    RequestTimeoutError,
    ResyncRequiredError,
    TooLargeError,
    UnknownOpError,
    UnsupportedVersionError,
)
from ._sync import Client
from ._sync_task import Task
from ._usage import (
    total_tokens,
    usage_from_anthropic,
    usage_from_metrics,
    usage_from_openai,
    usage_from_provider,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "UNSET",
    "AsyncClient",
    "AsyncTask",
    "AuthenticationError",
    "BadReplyError",
    "BadRequestError",
    "BusyError",
    "Call",
    "Client",
    "ClientClosedError",
    "CtxwinError",
    "DaemonUnavailableError",
    "ForbiddenError",
    "InternalError",
    "InvalidTaskIdError",
    "OwnedElsewhereError",
    "RequestTimeoutError",
    "ResyncRequiredError",
    "RetryPolicy",
    "Task",
    "TooLargeError",
    "UnknownOpError",
    "UnsupportedVersionError",
    "ensure_daemon",
    "is_context_window_error",
    "total_tokens",
    "usage_from_anthropic",
    "usage_from_metrics",
    "usage_from_openai",
    "usage_from_provider",
]
