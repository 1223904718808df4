"""Who connects: every connection is named by the ZAP handler; TCP clients need an allowed key.

The keys directory (``--keys-dir``, written by ``ctxwin keys``) holds
``server.key_secret`` (the daemon's key pair) and ``allowed/NAME.key``, one
public key per client, named by the operator (the file's name). Every TCP
endpoint of a daemon with keys uses CURVE; ipc endpoints keep the NULL
mechanism (their 0700 directory and 0600 socket decide who connects).

libzmq asks a ZAP handler (RFC 27, ZeroMQ's authentication protocol, on
``inproc://zeromq.zap.01`` of the socket's context) about every handshake
of a socket with a ZAP domain: the daemon sets one before its first bind, so
every connection, ipc and TCP, is asked about. Ours is a REP socket watched by
the daemon's event loop. It names each connection, and libzmq attaches the
name to each of its messages as ``User-Id``: ``key:NAME`` for a CURVE client
whose key is in ``allowed/`` (the allow-list is read again when the
directory or one of its files changed, so ``ctxwin keys allow`` needs no
restart), ``uid:N`` for an ipc client (libzmq puts the peer's
``SO_PEERCRED`` uid in the ZAP request's address), ``tcp:ADDRESS`` for a TCP
client of a daemon without keys (loopback only). The name is what the
daemon's per-client shares and ``[client_tasks]`` bindings go by. Without a
handler libzmq would let any CURVE client in, so the handler is bound before
the first endpoint. A refusal makes libzmq send the client an ERROR command:
the client sees a failed handshake at once, and its request never reaches
the daemon.
"""

from __future__ import annotations

import asyncio
import os
import re
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

__all__ = [
    "CLIENT_NAME",
    "DEFAULT_BINDING",
    "ZAP_ENDPOINT",
    "Authenticator",
    "ServerKeys",
    "binding_of",
    "load_server_keys",
]

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


CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""What an allowed key may be named (its file's name less ``.key``); never ``default``."""

DEFAULT_BINDING = "default"
"""The ``[client_tasks]`` entry for allowed keys that have none of their own."""


def read_allowed(directory: Path) -> tuple[dict[bytes, str], dict[str, str]]:
    """The allowed client keys: public key -> name (the file's name less ``.key``).

    Files that are not ours, are writable by others, are not key files or
    whose names are not client names are skipped; the second map gives each
    one's reason, by path.
    """
    allowed: dict[bytes, str] = {}
    skipped: dict[str, str] = {}
    for path in sorted(directory.glob("*.key")):
        name = path.name[: -len(".key")]
        try:
            if not CLIENT_NAME.fullmatch(name) or name == DEFAULT_BINDING:
                raise KeysError(
                    f"{name!r} is not a client name (letters, digits, '.', '_', '-'; "
                    f"not {DEFAULT_BINDING!r})"
                )
            _check_private(path, "allowed key")
            key = proto.read_key_file(path)
        except (KeysError, proto.KeyFileError) as exc:
            skipped[str(path)] = str(exc)
            continue
        allowed[key.public] = name
    return allowed, skipped


def _listing(directory: Path) -> tuple[object, ...] | None:
    """What tells a change of the allow-list: the directory's and each key file's status.

    A file replaced, rewritten, re-moded or re-owned changes its inode,
    size, modification or change time; a file added or removed changes the
    listing. None when the directory cannot be listed.
    """
    try:
        info = directory.stat()
        entries = sorted(
            (entry.name, entry.stat(follow_symlinks=False))
            for entry in os.scandir(directory)
            if entry.name.endswith(".key")
        )
    except OSError:
        return None
    return (
        (info.st_ino, info.st_mtime_ns, info.st_ctime_ns, info.st_mode, info.st_uid),
        tuple(
            (name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid)
            for name, st in entries
        ),
    )


def binding_of(bindings: Mapping[str, tuple[str, ...]], name: str) -> tuple[str, ...] | None:
    """The task-id prefixes a client key may use, None for none (an empty prefix: any task).

    With no binding at all every key may use every task; once ``[client_tasks]``
    binds any key, a key it does not name gets its ``default`` entry, or nothing.
    """
    if not bindings:
        return ("",)
    prefixes = bindings.get(name)
    if prefixes is None:
        prefixes = bindings.get(DEFAULT_BINDING)
    return prefixes


def _described(prefixes: tuple[str, ...] | None) -> str | list[str]:
    if prefixes is None:
        return "none: every request refused (no [client_tasks] entry, no default)"
    if "" in prefixes:
        return "*"
    return list(prefixes)


class Authenticator:
    """The ZAP handler: names every connection, and answers libzmq's questions about CURVE
    handshakes, on the event loop.

    Args:
        context: the ZeroMQ context of the daemon's socket.
        keys: the server keys (for the allow-list directory); None: no TCP client
            presents a key (no ``--keys-dir``), every connection is NULL.
        bindings: client name -> task-id prefixes it may use (logged here).
    """

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        keys: ServerKeys | None,
        bindings: Mapping[str, tuple[str, ...]],
    ) -> None:
        self.keys = keys
        self.bindings = bindings
        self.loop = asyncio.get_running_loop()
        self.allowed: dict[bytes, str] = {}
        self._seen: tuple[object, ...] | None = None
        self._listing: tuple[object, ...] | None = None
        self.reads = 0  # times the allow-list was read (not taken from the cache)
        self.refused = 0
        # address -> (when last logged, refusals not logged since)
        self._refusals: dict[str, tuple[float, int]] = {}
        self.socket: zmq.Socket[bytes] = context.socket(zmq.REP)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(ZAP_ENDPOINT)
        fd = self.socket.getsockopt(zmq.FD)
        assert isinstance(fd, int)
        self._fd = fd
        self._reading = False
        if keys is None:
            return
        self._reload()
        if not self.allowed:
            _log.warning(
                "no_client_allowed",
                allowed_dir=str(keys.allowed_dir),
                reason="no client key is allowed yet: every TCP client is refused",
            )
        self._log_bindings()

    def _log_bindings(self) -> None:
        """Log what each allowed key may use, and bindings that name no allowed key."""
        names = set(self.allowed.values())
        for name in sorted(names):
            _log.info(
                "client_binding", client=name, tasks=_described(binding_of(self.bindings, name))
            )
        for name in sorted(set(self.bindings) - names - {DEFAULT_BINDING}):
            _log.warning(
                "binding_without_key",
                client=name,
                reason=f"[client_tasks] binds {name!r}, but no allowed key has that name "
                "(a typo leaves the key meant unbound)",
            )

    def start(self) -> None:
        """Start answering (before the first bind)."""
        self.loop.add_reader(self._fd, self._on_readable)
        self._reading = True
        self._on_readable()

    def close(self) -> None:
        if self._reading:
            self.loop.remove_reader(self._fd)
            self._reading = False
        self.socket.close(linger=0)

    def _reload(self) -> None:
        """Read the allow-list again if the directory or one of its key files changed.

        The status of the directory and of each file (inode, size, times,
        mode, owner) is compared with what it was at the last read: listing
        400 keys costs about a millisecond, reading and checking them 14.
        """
        assert self.keys is not None
        directory = self.keys.allowed_dir
        listing = _listing(directory)
        if listing is None or not directory.is_dir():
            if self.allowed or self._seen is None:
                _log.error("allow_list_unreadable", path=str(directory))
            self.allowed = {}
            self._seen = ()
            self._listing = None
            return
        if listing == self._listing:
            return
        self.reads += 1
        allowed, skipped = read_allowed(directory)
        self._listing = listing
        seen = (tuple(sorted(allowed.items())), tuple(sorted(skipped.items())))
        if seen != self._seen:  # logged when it changes, not at every read
            first = self._seen is None
            self._seen = seen
            for path, reason in skipped.items():
                _log.warning("allowed_key_skipped", path=path, reason=reason)
            _log.info("allow_list_read", clients=sorted(allowed.values()))
            self.allowed = allowed
            if not first:
                self._log_bindings()
        self.allowed = allowed

    def _log_refusal(self, address: str, key: str | None, reason: str) -> None:
        """Log a refusal: the first from an address, then at most one per 10 s with a count.

        Throttled by address whatever the key: a client that retries (libzmq
        reconnects every 100 ms) or presents a new key each time cannot flood the log.
        """
        self.refused += 1
        now = time.monotonic()
        last, repeats = self._refusals.get(address, (-_REFUSAL_LOG_S, 0))
        if now - last < _REFUSAL_LOG_S:
            self._refusals[address] = (last, repeats + 1)
            return
        if len(self._refusals) >= _REFUSAL_PEERS:
            self._refusals.clear()
        self._refusals[address] = (now, 0)
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
        if mechanism == b"NULL":
            name = _null_name(peer)
            if name is None or (self.keys is not None and name.startswith("tcp:")):
                # With keys every TCP listener is CURVE: a NULL TCP peer is not expected.
                self._log_refusal(peer, None, "mechanism NULL")
                return [_ZAP_VERSION, request_id, b"400", b"CURVE only", b"", b""]
            return [_ZAP_VERSION, request_id, b"200", b"OK", name.encode(), b""]
        if mechanism != b"CURVE" or self.keys is None or len(request) < 7 or len(request[6]) != 32:
            self._log_refusal(peer, None, f"mechanism {mechanism.decode(errors='replace')}")
            return [_ZAP_VERSION, request_id, b"400", b"CURVE only", b"", b""]
        self._reload()
        key = z85.encode(request[6])
        client = self.allowed.get(key)
        if client is None:
            self._log_refusal(peer, key.decode(), "key not allowed")
            return [_ZAP_VERSION, request_id, b"400", b"key not allowed", b"", b""]
        _log.info(
            "client_allowed",
            address=peer,
            client=client,
            tasks=_described(binding_of(self.bindings, client)),
        )
        return [_ZAP_VERSION, request_id, b"200", b"OK", f"key:{client}".encode(), b""]


def _null_name(address: str) -> str | None:
    """The name of a NULL connection from the ZAP request's address, or None.

    libzmq gives an ipc peer's address as ``HOST:UID:GID:PID`` (``SO_PEERCRED``)
    and a TCP peer's as its IP address.
    """
    parts = address.rsplit(":", 3)
    if len(parts) == 4 and all(part.isdigit() for part in parts[1:]):
        return f"uid:{parts[1]}"
    return f"tcp:{address}" if address else None
