"""Authentication: the pinned server key, this client's key pair, and referrals.

A client's TCP connections use CURVE when a server key is pinned; an
``owned_elsewhere`` referral names an endpoint read from the state store,
followed only where the peer is known to be the fleet's.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from ctxwin import proto

from ._errors import BadRequestError, OwnedElsewhereError


@dataclass(frozen=True, slots=True)
class Curve:
    """The keys a client's TCP connections authenticate with (40-character Z85 bytes)."""

    server: bytes
    public: bytes
    secret: bytes

    def apply(self, sock: zmq.Socket[Any], endpoint: str) -> bool:
        """Set the keys on ``sock`` for a ``tcp://`` endpoint; whether it uses CURVE."""
        if not endpoint.startswith("tcp://"):
            return False  # ipc: the socket file's permissions decide who connects
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
        return True


def curve_keys(server_key: str | None, client_key: str | os.PathLike[str] | None) -> Curve | None:
    """The CURVE keys of a client, or None when no server key is pinned.

    Args:
        server_key: the daemon's public key (40 Z85 characters, or a key file),
            else ``$CTXWIN_SERVER_KEY``; None: no CURVE.
        client_key: this client's ``.key_secret`` file, else ``$CTXWIN_CLIENT_KEY``,
            else ``client.key_secret`` in the keys directory (``$CTXWIN_KEYS_DIR``,
            ``~/.config/ctxwin/keys``).

    Raises:
        BadRequestError: a key cannot be read (``local`` set).
    """
    server = server_key or os.environ.get(proto.SERVER_KEY_ENV)
    if not server:
        return None
    path = client_key or os.environ.get(proto.CLIENT_KEY_ENV)
    secret_path = Path(path) if path else proto.default_keys_dir() / "client.key_secret"
    try:
        _check_pinned(server)
        pinned = proto.read_public_key(server)
        if not secret_path.exists() and not path:
            raise proto.KeyFileError(
                f"no client key pair at {secret_path}: create one with `ctxwin keys client NAME`"
            )
        pair = proto.read_key_file(secret_path.expanduser(), secret=True)
    except proto.KeyFileError as exc:
        error = BadRequestError(f"CURVE keys: {exc}")
        error.local = True
        raise error from None
    assert pair.secret is not None
    return Curve(pinned, pair.public, pair.secret)


def _check_pinned(server: str) -> None:
    """Refuse a pinned server key file that another user can write (theirs, root aside, or
    open to others): whoever rewrites it chooses which server the client trusts.

    Raises:
        KeyFileError: naming the owner or the mode.
    """
    path = Path(server.strip()).expanduser()
    try:
        info = path.stat()
    except OSError:
        return  # a key given as text, or a file read_public_key reports on
    uid = os.getuid()
    if info.st_uid not in (uid, 0):
        raise proto.KeyFileError(
            f"server key file {path} belongs to uid {info.st_uid}, not to this user ({uid}) "
            "or root: its owner could swap the pinned key; copy it to a file of your own"
        )
    if info.st_mode & 0o022:
        raise proto.KeyFileError(
            f"server key file {path} is writable by others (mode {info.st_mode & 0o777:04o}): "
            f"anyone could swap the pinned key; chmod go-w {path}"
        )


def trusted_endpoints(given: Sequence[str] | None) -> frozenset[str]:
    """Endpoints a client follows referrals to without CURVE: ``given``, else the environment."""
    if given is None:
        raw = os.environ.get(TRUSTED_ENDPOINTS_ENV, "")
        given = [item for item in raw.replace(",", " ").split() if item]
    return frozenset(given)


TRUSTED_ENDPOINTS_ENV = "CTXWIN_TRUSTED_ENDPOINTS"
"""Endpoints (comma or space separated) a client follows ``owned_elsewhere`` to without CURVE."""


def _own_socket(endpoint: str) -> str | None:
    """Why an ipc endpoint is not known to be this user's daemon, or None when it is.

    Its socket file must be ours, in a directory of ours that nobody else can write:
    another user cannot make such a file, nor swap it afterwards.
    """
    path = proto.ipc_path(endpoint)
    if path is None:
        return "an abstract socket has no owner to check"
    try:
        info = os.lstat(path)
        parent = os.stat(os.path.dirname(os.path.realpath(path)))
    except OSError as exc:
        return f"its socket cannot be checked: {exc.strerror}"
    uid = os.getuid()
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != uid:
        return "its socket file is not this user's"
    if parent.st_uid != uid or parent.st_mode & 0o022:
        return "its directory is not this user's alone"
    return None


def check_referral(owner: str, curve: Curve | None, trusted: Collection[str]) -> None:
    """Return when the client may send a call to ``owner`` (``owned_elsewhere``); raise if not.

    The owner's endpoint comes from the state store, which the client does not
    trust: a referral is followed only where the peer is authenticated. With a
    pinned server key a ``tcp://`` owner is reached with the same key (a peer
    without its secret never completes the handshake, so never receives the
    call); an ipc owner must be this user's own socket; any other endpoint only
    when the caller listed it (``trusted_endpoints=``, ``$CTXWIN_TRUSTED_ENDPOINTS``).

    Raises:
        OwnedElsewhereError: the referral is not followed; ``owner`` names it.
    """
    if owner in trusted:
        return
    if owner.startswith("tcp://"):
        if curve is not None:
            return
        reason = "it is TCP and no server key is pinned, so nothing proves who answers there"
    elif owner.startswith("ipc://"):
        why = _own_socket(owner)
        if why is None:
            return
        reason = why
    else:
        reason = "it is not an ipc:// or tcp:// endpoint"
    raise OwnedElsewhereError(
        f"the task is owned by the daemon at {owner}, not followed: {reason} "
        f"(pin the fleet's server key, or list the endpoint in ${TRUSTED_ENDPOINTS_ENV})",
        owner=owner,
    )
