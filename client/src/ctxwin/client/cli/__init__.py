"""``ctxwin``: operate a running ``ctxwind`` from the command line.

Exit codes: 0 ok, 1 the daemon answered with an error, 2 usage error,
3 the daemon is not reachable, 141 the reader of the output went away.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from ctxwin import proto

from .. import _autostart
from .._errors import (
    AuthenticationError,
    CtxwinError,
    DaemonUnavailableError,
    RequestTimeoutError,
)
from .._sync import Client
from . import _commands, _inspect, _keys
from ._commands import (
    EXIT_BROKEN_PIPE,
    EXIT_DAEMON_ERROR,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    PROBE_TIMEOUT,
    UsageError,
    build_parser,
)
from .replay import _command as _replay

__all__ = ["main"]

COMMANDS: dict[str, Callable[[Client, argparse.Namespace, TextIO, TextIO], int]] = {
    "ping": _commands.ping,
    "stats": _commands.stats,
    "inspect": _inspect.inspect,
    "flush": _commands.flush,
    "rollback": _commands.rollback,
    "close": _commands.close,
    "replay": _replay.run,
}


def _unreachable(endpoint: str, detail: str, err: TextIO) -> int:
    err.write(
        f"ctxwin: no daemon answered at {endpoint} ({detail})\n"
        "  start one with `ctxwind` (or `python3 dev.py daemon` from a checkout),\n"
        f"  or point at it with --endpoint / ${proto.ENDPOINT_ENV}\n"
    )
    return EXIT_UNREACHABLE


def main(
    argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run ``ctxwin`` and return its exit code.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
        out: where results go (default: stdout).
        err: where errors go (default: stderr).

    Returns:
        0 ok, 1 daemon error, 2 usage error, 3 daemon not reachable, 141 reader gone.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(_keys.key_last(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.command == "keys":
        return _keys.run(args, out, err)
    endpoint = proto.resolve_endpoint(args.endpoint)
    missing = _autostart.socket_missing(endpoint)
    if missing is not None:
        return _unreachable(endpoint, missing, err)
    answered = False  # the daemon answered the first ping: a later timeout is not its absence
    try:
        with Client(
            endpoint,
            timeout=args.timeout,
            server_key=args.server_key,
            client_key=args.client_key,
        ) as client:
            client.ping(timeout=min(args.timeout, PROBE_TIMEOUT))
            answered = True
            code = COMMANDS[args.command](client, args, out, err)
            out.flush()  # here, so that a reader gone away is seen here
            return code
    except BrokenPipeError:
        # `ctxwin ... | head`: the reader has what it wanted. Stop writing quietly;
        # at exit Python would flush stdout again and print a second traceback.
        if out is sys.stdout:
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except AuthenticationError as exc:
        err.write(f"ctxwin: {exc.message}\n")
        return EXIT_UNREACHABLE
    except RequestTimeoutError as exc:
        if not answered:
            return _unreachable(endpoint, exc.message, err)
        err.write(
            f"ctxwin: the daemon at {endpoint} is up but did not answer within "
            f"{args.timeout:g} s ({exc.message}); it may still be working on it: "
            "give it longer with --timeout SECONDS\n"
        )
        return EXIT_DAEMON_ERROR
    except DaemonUnavailableError as exc:
        return _unreachable(endpoint, exc.message, err)
    except UsageError as exc:
        err.write(f"ctxwin: {exc}\n")
        return EXIT_USAGE
    except CtxwinError as exc:
        if exc.local:
            err.write(f"ctxwin: {exc.code}: {exc.message}\n")
            return EXIT_USAGE
        err.write(f"ctxwin: daemon error {exc.code}: {exc.message}\n")
        return EXIT_DAEMON_ERROR
    except KeyboardInterrupt:
        err.write("ctxwin: interrupted\n")
        return 130
