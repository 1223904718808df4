"""The daemon's own start-up error (every module that can refuse to start raises it)."""

from __future__ import annotations

__all__ = ["StartupError"]


class StartupError(RuntimeError):
    """The daemon cannot start; the message says why (exit status 1)."""
