"""Where the daemon listens by default (DESIGN.md "Wire protocol")."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

ENDPOINT_ENV = "CTXWIN_ENDPOINT"
SOCKET_NAME = "ctxwind.sock"


_IPC = "ipc://"


def ipc_path(endpoint: str) -> Path | None:
    """The socket file of an ``ipc://`` endpoint; None for other and abstract (``@``) ones."""
    if endpoint.startswith(_IPC) and not endpoint.startswith("ipc://@"):
        return Path(endpoint[len(_IPC) :])
    return None


def default_runtime_dir() -> Path:
    """The private directory holding the default ipc socket.

    ``$XDG_RUNTIME_DIR/ctxwin`` when that variable is set, else a per-user
    directory under the temp dir (``/tmp/ctxwin-<uid>``).
    """
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "ctxwin"
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"ctxwin-{uid}"


def default_endpoint() -> str:
    """The default endpoint: ``ipc://<runtime dir>/ctxwind.sock``."""
    return f"ipc://{default_runtime_dir() / SOCKET_NAME}"


def resolve_endpoint(explicit: str | None = None) -> str:
    """The endpoint a client should use.

    Args:
        explicit: an endpoint given by the caller; wins when set.

    Returns:
        ``explicit``, else ``$CTXWIN_ENDPOINT``, else :func:`default_endpoint`.
    """
    if explicit:
        return explicit
    return os.environ.get(ENDPOINT_ENV) or default_endpoint()
