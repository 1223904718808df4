"""The ``ctxwind`` entry point: configuration, process limits, then the server."""

from __future__ import annotations

import dataclasses
import functools
import resource
import signal
import sys
from collections.abc import Sequence

import anyio
import structlog

from ctxwin import engine

from ._config import Config, ConfigError
from ._config_sources import load_config
from ._errors import StartupError
from ._lifecycle import run_daemon
from ._logging import configure_logging
from ._notify import Notifier
from ._tokens import TokenCounter
from .store import StoreOpener, open_store

__all__ = ["main"]

# Deeply nested requests (msgpack allows depth ~1024) must not exhaust the
# interpreter's recursion limit while they are copied, dumped or counted.
_RECURSION_LIMIT = 20_000


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit: every client connection is a descriptor.

    The server accepts connections only while descriptors are left (libzmq
    aborts on EMFILE from an ipc accept) and refuses to start when the limit
    leaves room for too few clients.

    Returns:
        The soft limit now in effect.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def build_notices(config: Config) -> engine.Notices:
    """The engine's notice texts with the configured ones in place."""
    return dataclasses.replace(engine.DEFAULT_NOTICES, **dict(config.notices))


def main(argv: Sequence[str] | None = None, *, stores: StoreOpener = open_store) -> int:
    """Run ctxwind until SIGTERM or SIGINT.

    Args:
        argv: command-line arguments without the program name (``sys.argv[1:]``).
        stores: opens the state store the configuration names (see :func:`run_daemon`).

    Returns:
        The exit status: 0 after a clean stop, 1 when start-up failed or some
        state could not be made durable, 2 for a configuration error.
    """
    try:
        config = load_config(argv)
    except ConfigError as exc:
        sys.stderr.write(f"ctxwind: {exc}\n")
        return 2
    configure_logging(config.log_format, config.log_level)
    log = structlog.get_logger("ctxwin.daemon")
    notifier = Notifier.from_environ()
    raise_open_files_limit()
    sys.setrecursionlimit(max(sys.getrecursionlimit(), _RECURSION_LIMIT))
    # With RLIMIT_FSIZE a write past the limit must fail with EFBIG, not kill us.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    tokens = TokenCounter(config.encoding)
    try:
        return anyio.run(
            functools.partial(run_daemon, stores=stores),
            config,
            build_notices(config),
            tokens,
            notifier,
        )
    except StartupError as exc:
        log.error("startup_failed", reason=str(exc))
        sys.stderr.write(f"ctxwind: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130
