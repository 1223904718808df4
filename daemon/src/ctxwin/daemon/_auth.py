"""Who may connect over TCP: CurveZMQ with a server key pair and an allow-list of client keys.

The keys directory (``--keys-dir``, written by ``ctxwin keys``) holds
``server.key_secret`` (the daemon's key pair) and ``allowed/NAME.key``, one
public key per client, named. Every TCP endpoint of a daemon with keys uses
CURVE; ipc endpoints keep the NULL mechanism (their 0700 directory and 0600
socket decide who connects).

libzmq asks a ZAP handler about every CURVE handshake (RFC 27, ZeroMQ's
authentication protocol) on ``inproc://zeromq.zap.01`` of the socket's
context. Ours is a REP socket watched by the daemon's event loop: it allows a
client key found in ``allowed/`` (read again at every handshake, so
``ctxwin keys allow`` needs no restart) and names the client by the file's
name, which libzmq attaches to each of its messages as ``User-Id``. Without a
handler libzmq would let any CURVE client in, so the handler is bound before
the first TCP endpoint. A refusal makes libzmq send the client an ERROR
command: the client sees a failed handshake at once, and its request never
reaches the daemon.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import structlog
import zmq
from zmq.utils import z85

from ctxwin import proto

__all__ = ["ZAP_ENDPOINT", "Authenticator", "ServerKeys", "load_server_keys"]

_log = structlog.get_logger("ctxwin.daemon.auth")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
SERVER_SECRET = "server.key_secret"
ALLOWED_DIR = "allowed"
_ZAP_VERSION = b"1.0"
_REFUSAL_LOG_S = 10.0
_REFUSAL_PEERS = 1024


class KeysError(RuntimeError):
    """The keys directory cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class ServerKeys:
    """The daemon's key pair and where the allowed client keys are."""

    public: bytes
    secret: bytes
    allowed_dir: Path


def _check_private(path: Path, what: str) -> None:
    """Refuse a file or directory that is not ours, or that others may write."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        raise KeysError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise KeysError(f"cannot read {what} {path}: {exc.strerror}") from None
    if stat.S_ISLNK(info.st_mode):
        raise KeysError(f"{what} {path} is a symlink; give the real path")
    if info.st_uid != os.getuid():
        raise KeysError(f"{what} {path} belongs to another user (uid {info.st_uid})")
    if info.st_mode & 0o022:
        raise KeysError(
            f"{what} {path} is writable by others (mode {info.st_mode & 0o777:04o}): "
            "anyone who can write it can let a key in"
        )


def load_server_keys(keys_dir: Path) -> ServerKeys:
    """The server key pair and the allow-list directory under ``keys_dir``.

    Raises:
        KeysError: a file is missing, not ours, open to others, or not a key.
    """
    hint = f"(create them with `ctxwin keys server --dir {keys_dir}`)"
    _check_private(keys_dir, "keys directory")
    secret_path = keys_dir / SERVER_SECRET
    if not secret_path.exists():
        raise KeysError(f"no server key: {secret_path} does not exist {hint}")
    _check_private(secret_path, "server key")
    try:
        pair = proto.read_key_file(secret_path, secret=True)
    except proto.KeyFileError as exc:
        raise KeysError(str(exc)) from None
    assert pair.secret is not None
    allowed = keys_dir / ALLOWED_DIR
    if not allowed.is_dir():
        raise KeysError(
            f"no allow-list: {allowed} does not exist "
            f"(allow a client's public key with `ctxwin keys allow FILE --dir {keys_dir}`)"
        )
    _check_private(allowed, "allow-list directory")
    return ServerKeys(pair.public, pair.secret, allowed)


def read_allowed(directory: Path) -> tuple[dict[bytes, str], dict[str, str]]:
    """The allowed client keys: public key -> name (the file's name less ``.key``).

    Files that are not ours, are writable by others or are not key files are
    skipped; the second map gives each one's reason, by path.
    """
    allowed: dict[bytes, str] = {}
    skipped: dict[str, str] = {}
    for path in sorted(directory.glob("*.key")):
        try:
            _check_private(path, "allowed key")
            key = proto.read_key_file(path)
        except (KeysError, proto.KeyFileError) as exc:
            skipped[str(path)] = str(exc)
            continue
        allowed[key.public] = path.name[: -len(".key")]
    return allowed, skipped


class Authenticator:
    """The ZAP handler: answers libzmq's questions about CURVE handshakes on the event loop.

    Args:
        context: the ZeroMQ context of the daemon's socket.
        keys: the server keys (for the allow-list directory).
        bindings: client name -> task-id prefixes it may use (for the log only here).
    """

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        keys: ServerKeys,
        bindings: Mapping[str, tuple[str, ...]],
    ) -> None:
        self.keys = keys
        self.bindings = bindings
        self.loop = asyncio.get_running_loop()
        self.allowed: dict[bytes, str] = {}
        self._seen: tuple[object, ...] | None = None
        self.refused = 0
        # (address, key) -> (when last logged, refusals not logged since)
        self._refusals: dict[tuple[str, str | None], tuple[float, int]] = {}
        self.socket: zmq.Socket[bytes] = context.socket(zmq.REP)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(ZAP_ENDPOINT)
        fd = self.socket.getsockopt(zmq.FD)
        assert isinstance(fd, int)
        self._fd = fd
        self._reading = False
        self._reload()
        if not self.allowed:
            _log.warning(
                "no_client_allowed",
                allowed_dir=str(keys.allowed_dir),
                reason="no client key is allowed yet: every TCP client is refused",
            )

    def start(self) -> None:
        """Start answering (before the first TCP bind)."""
        self.loop.add_reader(self._fd, self._on_readable)
        self._reading = True
        self._on_readable()

    def close(self) -> None:
        if self._reading:
            self.loop.remove_reader(self._fd)
            self._reading = False
        self.socket.close(linger=0)

    def _reload(self) -> None:
        """Read the allow-list again (at every handshake: a key added or removed counts at once).

        A directory's modification time is too coarse to tell two changes
        made within one clock tick apart; reading a few small files per new
        connection costs less than trusting it.
        """
        if not self.keys.allowed_dir.is_dir():
            if self.allowed or self._seen is None:
                _log.error("allow_list_unreadable", path=str(self.keys.allowed_dir))
            self.allowed = {}
            self._seen = ()
            return
        allowed, skipped = read_allowed(self.keys.allowed_dir)
        seen = (tuple(sorted(allowed.items())), tuple(sorted(skipped.items())))
        if seen != self._seen:  # logged when it changes, not at every handshake
            self._seen = seen
            for path, reason in skipped.items():
                _log.warning("allowed_key_skipped", path=path, reason=reason)
            _log.info("allow_list_read", clients=sorted(allowed.values()))
        self.allowed = allowed

    def _log_refusal(self, address: str, key: str | None, reason: str) -> None:
        """Log a refusal: the first from a peer and key, then at most one per 10 s with a count.

        A client that retries (libzmq reconnects every 100 ms) cannot flood the log.
        """
        self.refused += 1
        now = time.monotonic()
        seen = (address, key)
        last, repeats = self._refusals.get(seen, (-_REFUSAL_LOG_S, 0))
        if now - last < _REFUSAL_LOG_S:
            self._refusals[seen] = (last, repeats + 1)
            return
        if len(self._refusals) >= _REFUSAL_PEERS:
            self._refusals.clear()
        self._refusals[seen] = (now, 0)
        _log.info("client_refused", address=address, key=key, reason=reason, repeats=repeats)

    def _on_readable(self) -> None:
        sock = self.socket
        # REP: one request, one reply. EVENTS re-arms the edge-triggered FD when nothing is left.
        while cast(int, sock.getsockopt(zmq.EVENTS)) & int(zmq.POLLIN):
            try:
                request = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                sock.send_multipart(self._answer(request), zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                _log.error("zap_reply_failed", error=str(exc))

    def _answer(self, request: list[bytes]) -> list[bytes]:
        """The ZAP reply: version, request id, status, status text, user id, metadata."""
        if len(request) < 6 or request[0] != _ZAP_VERSION:
            request_id = request[1] if len(request) > 1 else b""
            return [_ZAP_VERSION, request_id, b"500", b"malformed ZAP request", b"", b""]
        request_id, address, mechanism = request[1], request[3], request[5]
        peer = address.decode(errors="replace")
        if mechanism != b"CURVE" or len(request) < 7 or len(request[6]) != 32:
            self._log_refusal(peer, None, f"mechanism {mechanism.decode(errors='replace')}")
            return [_ZAP_VERSION, request_id, b"400", b"CURVE only", b"", b""]
        self._reload()
        key = z85.encode(request[6])
        name = self.allowed.get(key)
        if name is None:
            self._log_refusal(peer, key.decode(), "key not allowed")
            return [_ZAP_VERSION, request_id, b"400", b"key not allowed", b"", b""]
        _log.info("client_allowed", address=peer, client=name, tasks=self.bindings.get(name))
        return [_ZAP_VERSION, request_id, b"200", b"OK", name.encode(), b""]
