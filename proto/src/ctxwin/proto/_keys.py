"""CURVE key files (ZeroMQ's CurveZMQ) and which endpoints are loopback.

A key file is ZeroMQ's certificate text (what ``zmq.auth`` and czmq write)::

    #   ctxwin CURVE public key: give it to whoever must trust it
    metadata
        name = "laptop"
    curve
        public-key = "<40 Z85 characters>"

The secret file (``*.key_secret``) adds ``secret-key = "..."``. Both are
written 0600 in a 0700 directory. A public key may also be given as its 40
Z85 characters themselves.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import zmq

__all__ = [
    "CLIENT_KEY_ENV",
    "KEYS_DIR_ENV",
    "SERVER_KEY_ENV",
    "KeyFile",
    "KeyFileError",
    "default_keys_dir",
    "is_loopback",
    "private_dir",
    "read_key_file",
    "read_public_key",
    "write_key_file",
]

KEYS_DIR_ENV = "CTXWIN_KEYS_DIR"
"""Where ``ctxwin keys`` writes, and where clients look for ``client.key_secret``."""
SERVER_KEY_ENV = "CTXWIN_SERVER_KEY"
"""The daemon's public key a client pins (a key file's path, or the key itself)."""
CLIENT_KEY_ENV = "CTXWIN_CLIENT_KEY"
"""The client's own secret key file."""

_Z85 = re.compile(r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")
_FIELD = re.compile(r'^\s*(public-key|secret-key|name)\s*=\s*"([^"]*)"\s*$')


class KeyFileError(ValueError):
    """A key or key file that cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class KeyFile:
    """What a key file holds.

    Attributes:
        public: the public key (40 Z85 characters, ASCII bytes).
        secret: the secret key, for a ``.key_secret`` file; else None.
        name: the ``name`` in the file's metadata, if any.
    """

    public: bytes
    secret: bytes | None = None
    name: str | None = None


def default_keys_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$CTXWIN_KEYS_DIR``, else ``$XDG_CONFIG_HOME/ctxwin/keys``, else ``~/.config/...``."""
    env = os.environ if environ is None else environ
    explicit = env.get(KEYS_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    config = env.get("XDG_CONFIG_HOME")
    if config:
        return Path(config) / "ctxwin" / "keys"
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".config" / "ctxwin" / "keys"


def _checked_key(text: str, what: str, source: str) -> bytes:
    if not _Z85.match(text):
        raise KeyFileError(f"{source}: the {what} is not 40 Z85 characters")
    return text.encode("ascii")


def read_key_file(path: Path, *, secret: bool = False) -> KeyFile:
    """Read a key file.

    Args:
        path: the file.
        secret: require the secret key, check that it matches the public one,
            and that the file is readable by its owner only.

    Raises:
        KeyFileError: the file cannot be read, lacks a key, or (``secret``) is
            readable by others.
    """
    try:
        stat = path.stat()
        text = path.read_text("utf-8")
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise KeyFileError(f"{path} is not a key file (not text)") from None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        match = _FIELD.match(line)
        if match:
            fields.setdefault(match.group(1), match.group(2))
    if "public-key" not in fields:
        raise KeyFileError(f"{path} is not a key file (no public-key)")
    public = _checked_key(fields["public-key"], "public key", str(path))
    key = KeyFile(public, None, fields.get("name") or None)
    if not secret:
        return key
    if "secret-key" not in fields:
        raise KeyFileError(f"{path} holds no secret key (the secret is in the .key_secret file)")
    if stat.st_mode & 0o077:
        raise KeyFileError(
            f"{path} is readable or writable by others (mode {stat.st_mode & 0o777:04o}): "
            f"chmod 600 {path}"
        )
    private = _checked_key(fields["secret-key"], "secret key", str(path))
    if zmq.curve_public(private) != public:
        raise KeyFileError(f"{path}: the secret key does not belong to the public key")
    return KeyFile(public, private, key.name)


def read_public_key(value: str) -> bytes:
    """A public key given as its 40 Z85 characters or as the path of a key file.

    Raises:
        KeyFileError: neither a key nor a readable key file.
    """
    text = value.strip()
    if _Z85.match(text) and not os.path.exists(text):
        return text.encode("ascii")
    return read_key_file(Path(text).expanduser()).public


def _text(public: bytes, secret: bytes | None, name: str | None) -> str:
    kind = "secret key: keep it here" if secret else "public key: give it to whoever trusts it"
    lines = [f"#   ctxwin CURVE {kind}", "metadata"]
    if name:
        lines.append(f'    name = "{name}"')
    lines += ["curve", f'    public-key = "{public.decode()}"']
    if secret:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return "\n".join(lines) + "\n"


def private_dir(directory: Path) -> None:
    """Create ``directory`` (and parents) 0700, or check that the existing one is private.

    Raises:
        KeyFileError: it exists and is not a directory of this user's closed to others.
    """
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    stat = directory.lstat()
    if not os.path.isdir(directory) or os.path.islink(directory):
        raise KeyFileError(f"{directory} is not a directory")
    if stat.st_uid != os.getuid():
        raise KeyFileError(f"{directory} belongs to another user (uid {stat.st_uid})")
    if stat.st_mode & 0o077:
        raise KeyFileError(
            f"{directory} is open to others (mode {stat.st_mode & 0o777:04o}): "
            f"chmod 700 {directory}"
        )


def write_key_file(
    path: Path,
    public: bytes,
    secret: bytes | None = None,
    name: str | None = None,
    *,
    replace: bool = False,
) -> None:
    """Write a key file 0600 in a 0700 directory, never through a symlink.

    Raises:
        KeyFileError: the file exists and ``replace`` is false, or the directory is
            not private.
    """
    if name is not None and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
        raise KeyFileError(f"key name {name!r}: use 1-64 letters, digits, '.', '_' or '-'")
    private_dir(path.parent)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_TRUNC if replace else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise KeyFileError(f"{path} exists already (give --force to replace it)") from None
    except OSError as exc:
        raise KeyFileError(f"cannot write {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(_text(public, secret, name))


def is_loopback(endpoint: str) -> bool:
    """Whether a ``tcp://`` endpoint is on a loopback address (``localhost`` included).

    Other transports and unparsable endpoints are not loopback TCP (False).
    """
    transport, sep, address = endpoint.partition("://")
    if transport != "tcp" or not sep:
        return False
    host = address.rpartition(":")[0].strip("[]")
    if ";" in host:  # tcp://source;host:port: the host is after the source
        host = host.rpartition(";")[2].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
