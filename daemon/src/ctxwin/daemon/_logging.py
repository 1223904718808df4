"""structlog set-up: one event per line, JSON under systemd or when asked, console on a tty.

Events carry ids, op names, counts and error reasons; never conversation text.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, TextIO

import structlog
from structlog.tracebacks import ExceptionDictTransformer

from ._notify import running_under_systemd

__all__ = ["Throttle", "choose_format", "configure_logging"]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


class Throttle:
    """Whether a repeated event is logged this time: at most once every ``seconds`` (the first
    time always), so that a flood of one event costs one line per interval."""

    __slots__ = ("_last", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._last = -seconds

    def due(self) -> bool:
        """Whether to log now (then the next is due ``seconds`` later)."""
        now = time.monotonic()
        if now - self._last < self.seconds:
            return False
        self._last = now
        return True


class LineLogger:
    """Writes each rendered event as one line; a stream that fails drops the line.

    A full disk, a file-size limit or a closed pipe on the log stream must not
    turn into an exception inside a request, an actor or the shutdown path:
    the daemon goes on serving and writing state, only without logs.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def msg(self, message: str) -> None:
        """Write ``message`` and a newline, flushed; drop it if the stream fails."""
        with self._lock:
            try:
                self._stream.write(message + "\n")
                self._stream.flush()
            except (OSError, ValueError):  # ValueError: the stream was closed
                pass

    debug = info = warning = warn = error = err = critical = exception = fatal = msg


def choose_format(
    requested: str | None, stream: TextIO | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """Pick the log format.

    Args:
        requested: ``json`` or ``console`` when configured, else None.
        stream: where logs go (stderr when omitted).
        environ: the environment (``os.environ`` when omitted).

    Returns:
        ``requested`` when given; ``json`` under systemd
        (:func:`~._notify.running_under_systemd`); ``console`` on a terminal; ``json`` otherwise.
    """
    if requested:
        return requested
    if running_under_systemd(environ):
        return "json"
    out = stream if stream is not None else sys.stderr
    try:
        return "console" if out.isatty() else "json"
    except (AttributeError, ValueError):
        return "json"


def configure_logging(fmt: str | None, level: str, stream: TextIO | None = None) -> str:
    """Configure structlog for the daemon process.

    Args:
        fmt: ``json``, ``console`` or None (automatic, see :func:`choose_format`).
        level: lowest level logged (``debug`` ... ``critical``).
        stream: where to write (stderr when omitted).

    Returns:
        The format chosen.
    """
    out = stream if stream is not None else sys.stderr
    chosen = choose_format(fmt, out)
    renderer: Any
    if chosen == "json":
        renderer = structlog.processors.JSONRenderer(sort_keys=False)
    else:
        renderer = structlog.dev.ConsoleRenderer(
            colors=out.isatty(), exception_formatter=structlog.dev.plain_traceback
        )
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if chosen == "json":
        # Without locals: a frame's locals may hold conversation text.
        processors.append(
            structlog.processors.ExceptionRenderer(
                ExceptionDictTransformer(show_locals=False, use_rich=False)
            )
        )
    processors.append(renderer)
    shared = LineLogger(out)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=lambda *_: shared,  # one lock for every logger of the stream
        cache_logger_on_first_use=True,
    )
    return chosen
