"""The daemon's own errors: start-up refused, and the ones a request may meet."""

from __future__ import annotations

__all__ = ["ActorStoppedError", "BusyError", "StartupError"]


class StartupError(RuntimeError):
    """The daemon cannot start; the message says why (exit status 1)."""


class BusyError(Exception):
    """The task's mailbox is full; the client should retry later (answered ``busy``)."""


class ActorStoppedError(Exception):
    """The task's actor stopped before it could handle this request; send it again
    (answered ``busy``)."""
