"""``ctxwin keys``: make and allow the CURVE keys of a daemon and its clients.

Every file is written 0600 in a 0700 directory (``--dir``, else
``$CTXWIN_KEYS_DIR``, else ``~/.config/ctxwin/keys``)::

    server.key          the daemon's public key: copy it to every client (it pins it)
    server.key_secret   the daemon's key pair: stays with the daemon (a fleet shares it)
    client.key          a client's public key: copy it to the daemon, `ctxwin keys allow` it
    client.key_secret   a client's key pair: stays with the client
    allowed/NAME.key    the client keys the daemon lets in, named

The operator names an allowed key (``--name``, else the name of the file
given, less ``.key``), never the key file: the name a client wrote into its
own file is shown, not used, since ``[client_tasks]`` binds keys by name.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import zmq

from ctxwin import proto

__all__ = ["add_parser", "key_last", "run"]


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``keys`` and its subcommands to the CLI's parser."""
    keys = commands.add_parser(
        "keys",
        help="make and allow CURVE keys (authenticated TCP)",
        description="Make the CURVE keys of a daemon and its clients, and allow clients.",
    )
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument(
        "--dir",
        type=Path,
        metavar="DIR",
        help=f"keys directory (default: ${proto.KEYS_DIR_ENV}, else ~/.config/ctxwin/keys)",
    )
    where.add_argument("--force", action="store_true", help="replace existing files")
    actions = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    actions.add_parser(
        "server",
        parents=[where],
        help="make the daemon's key pair (server.key, server.key_secret) and allowed/",
    )
    client = actions.add_parser(
        "client", parents=[where], help="make this client's key pair (client.key, .key_secret)"
    )
    client.add_argument("name", metavar="NAME", help="the client's name on the allow-list")
    allow = actions.add_parser(
        "allow", parents=[where], help="let a client's public key in (allowed/NAME.key)"
    )
    allow.add_argument("key", metavar="PUBLIC_KEY_FILE", help="a client.key file, or the key")
    allow.add_argument(
        "--name", help="name on the allow-list (default: the key file's name, less .key)"
    )
    actions.add_parser("show", parents=[where], help="the keys here, and who is allowed")


def key_last(argv: Sequence[str]) -> list[str]:
    """Put a public key given to ``keys allow`` that begins with ``-`` after ``--``.

    A Z85 key may begin with ``-``, and argparse would read it as an option.
    """
    args = list(argv)
    start = next(
        (i + 2 for i in range(len(args) - 1) if args[i : i + 2] == ["keys", "allow"]), None
    )
    if start is None or "--" in args:
        return args
    for i in range(start, len(args)):
        if args[i].startswith("-") and len(args[i]) == 40 and _is_public_key(args[i]):
            return [*args[:i], *args[i + 1 :], "--", args[i]]
    return args


def _is_public_key(text: str) -> bool:
    try:
        proto.read_public_key(text)
    except proto.KeyFileError:
        return False
    return True


def _directory(args: argparse.Namespace) -> Path:
    given: Path | None = args.dir
    return given.expanduser() if given is not None else proto.default_keys_dir()


def _pair(directory: Path, stem: str, name: str | None, force: bool) -> tuple[Path, bytes]:
    public, secret = zmq.curve_keypair()
    public_path = directory / f"{stem}.key"
    secret_path = directory / f"{stem}.key_secret"
    if not force:
        for path in (public_path, secret_path):
            if path.exists() or path.is_symlink():
                raise proto.KeyFileError(f"{path} exists already (give --force to replace it)")
    proto.write_key_file(secret_path, public, secret, name, replace=force)
    proto.write_key_file(public_path, public, None, name, replace=force)
    return public_path, public


def _server(args: argparse.Namespace, out: TextIO) -> None:
    directory = _directory(args)
    public_path, public = _pair(directory, "server", "ctxwind", args.force)
    proto.private_dir(directory / "allowed")
    out.write(
        f"server key pair: {directory / 'server.key_secret'} (keep it with the daemon)\n"
        f"public key:      {public_path}  {public.decode()}\n"
        f"allow-list:      {directory / 'allowed'}/ (empty)\n"
        f"next: ctxwind --keys-dir {directory} ...; give {public_path} to each client "
        f"(--server-key / ${proto.SERVER_KEY_ENV})\n"
    )


def _client(args: argparse.Namespace, out: TextIO) -> None:
    directory = _directory(args)
    public_path, public = _pair(directory, "client", args.name, args.force)
    out.write(
        f"client key pair: {directory / 'client.key_secret'} (keep it here)\n"
        f"public key:      {public_path}  {public.decode()}\n"
        f"next: copy {public_path.name} to the daemon's host and allow it there: "
        f"ctxwin keys allow {public_path.name} --name {args.name}\n"
    )


CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A name on the allow-list (the daemon skips files named otherwise)."""
DEFAULT_BINDING = "default"
"""Reserved: the ``[client_tasks]`` entry for keys without one of their own."""

_GENERIC_STEMS = frozenset({"client", "server"})
"""File names every key pair gets (``ctxwin keys client``): they name no one."""


def _allowed_name(args: argparse.Namespace, source: Path | None) -> str:
    """The operator's name for the key: ``--name``, else the key file's name less ``.key``.

    Raises:
        KeyFileError: no name given and the file's name names no one (``client.key``,
            a bare key), or the name is not a client name.
    """
    name: str | None = args.name
    if name is None and source is not None:
        stem = source.name[: -len(".key")] if source.name.endswith(".key") else source.stem
        if stem in _GENERIC_STEMS:
            raise proto.KeyFileError(
                f"{source.name} is what every client's public key is called: give --name NAME "
                "(or copy it as NAME.key first)"
            )
        name = stem
    if not name:
        raise proto.KeyFileError("a bare key names no client: give --name NAME")
    if not CLIENT_NAME.fullmatch(name) or name == DEFAULT_BINDING:
        raise proto.KeyFileError(
            f"{name!r} is not a client name: 1-64 letters, digits, '.', '_' or '-', "
            f"beginning with a letter or digit, and not {DEFAULT_BINDING!r} "
            "(the [client_tasks] entry for keys without one); give --name NAME"
        )
    return name


def _allow(args: argparse.Namespace, out: TextIO) -> None:
    directory = _directory(args)
    source = Path(args.key).expanduser()
    claimed: str | None = None
    if source.exists():
        key = proto.read_key_file(source)
        public, claimed = key.public, key.name
        name = _allowed_name(args, source)
    else:
        public = proto.read_public_key(args.key)
        name = _allowed_name(args, None)
    allowed = directory / "allowed"
    for existing in sorted(allowed.glob("*.key")) if allowed.is_dir() else []:
        try:
            held = proto.read_key_file(existing).public
        except proto.KeyFileError:
            continue
        if held == public and existing.name != f"{name}.key":
            raise proto.KeyFileError(f"this key is allowed already as {existing}")
    path = allowed / f"{name}.key"
    if path.exists() and not args.force:
        raise proto.KeyFileError(f"{path} exists already (give --force to replace it)")
    proto.write_key_file(path, public, None, name, replace=args.force)
    said = f"--name {name}" if args.name else f"the file name {source.name}"
    out.write(f"allowed {name!r} (named by {said}): {path}  {public.decode()}\n")
    if claimed and claimed != name:
        out.write(
            f"  the key file calls itself {claimed!r}: not used; the daemon knows it as "
            f"{name!r} ([client_tasks] binds that name)\n"
        )
    out.write(
        "(a running daemon reads it at the client's next connection; "
        f"remove the file to refuse new connections of {name!r})\n"
    )


def _show(args: argparse.Namespace, out: TextIO) -> None:
    directory = _directory(args)
    out.write(f"keys directory: {directory}\n")
    for stem in ("server", "client"):
        path = directory / f"{stem}.key"
        if path.exists():
            key = proto.read_key_file(path)
            label = f"{stem} ({key.name})" if key.name else stem
            out.write(f"  {label}: {key.public.decode()}\n")
    allowed = directory / "allowed"
    if allowed.is_dir():
        names = sorted(allowed.glob("*.key"))
        out.write(f"  allowed clients: {len(names)}\n")
        for path in names:
            try:
                out.write(f"    {path.stem}: {proto.read_key_file(path).public.decode()}\n")
            except proto.KeyFileError as exc:
                out.write(f"    {path.stem}: unusable ({exc})\n")


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run ``ctxwin keys ACTION``; 0 when done, 2 with the reason when not."""
    actions = {"server": _server, "client": _client, "allow": _allow, "show": _show}
    try:
        actions[args.keys_command](args, out)
    except proto.KeyFileError as exc:
        err.write(f"ctxwin keys: {exc}\n")
        return 2
    return 0
