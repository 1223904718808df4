"""Where ctxwind's settings come from: the flags, the config file, the environment.

Each layer's raw values are checked (a :class:`~._config.ConfigError` names
the layer) and merged over the one before; :func:`load_config` returns the
:class:`~._config.Config`. The settings themselves, their defaults and the
file's form are in ``_config.py``.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any

from ctxwin import engine, proto

from ._config import NOTICE_ENV, Config, ConfigError, default_endpoints, default_state_dir, home
from ._redact import redact_url

__all__ = ["load_config"]

_LOG_FORMATS = ("json", "console")
_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _config_path(environ: Mapping[str, str], explicit: str | None) -> tuple[Path, bool]:
    """The config file to read, and whether it was asked for explicitly."""
    if explicit:
        return Path(explicit), True
    from_env = environ.get("CTXWIN_CONFIG")
    if from_env:
        return Path(from_env), True
    xdg = environ.get("XDG_CONFIG_HOME") or str(home(environ) / ".config")
    return Path(xdg) / "ctxwin" / "config.toml", False


def _default(name: str) -> str:
    """A setting's default as the help text shows it, from :class:`Config` itself."""
    value = next(item.default for item in fields(Config) if item.name == name)
    assert value is not MISSING
    if name == "max_bytes" and isinstance(value, int) and value % (1024 * 1024) == 0:
        return f"{value // (1024 * 1024)} MiB"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ctxwind",
        description="ctxwin daemon: keeps coding agents inside their model's context window.",
        argument_default=argparse.SUPPRESS,
    )
    add = parser.add_argument
    add(
        "--config", metavar="PATH", help="config file (default $XDG_CONFIG_HOME/ctxwin/config.toml)"
    )
    add(
        "--endpoint",
        dest="endpoints",
        action="append",
        metavar="URL",
        help="ZeroMQ endpoint to bind; repeat for several (default: the ipc socket)",
    )
    add("--state-dir", metavar="DIR", help="where task state is kept")
    add(
        "--debounce-ms",
        type=int,
        metavar="MS",
        help=f"write delay after the last change ({_default('debounce_ms')})",
    )
    add(
        "--debounce-max-ms",
        type=int,
        metavar="MS",
        help=f"latest write after the first unwritten change ({_default('debounce_max_ms')})",
    )
    add(
        "--idle-timeout",
        type=float,
        metavar="SECONDS",
        help=f"stop a task's actor after this long without requests ({_default('idle_timeout')})",
    )
    add(
        "--mailbox-size",
        type=int,
        metavar="N",
        help=f"queued requests per task before busy ({_default('mailbox_size')})",
    )
    add(
        "--max-bytes",
        type=int,
        metavar="N",
        help=f"largest request in bytes ({_default('max_bytes')})",
    )
    add(
        "--max-frames",
        type=int,
        metavar="N",
        help=f"most frames in one message ({_default('max_frames')})",
    )
    add(
        "--max-messages",
        type=int,
        metavar="N",
        help=f"most messages in one request ({_default('max_messages')})",
    )
    add(
        "--max-tasks",
        type=int,
        metavar="N",
        help=f"most tasks held at once before busy ({_default('max_tasks')})",
    )
    add(
        "--max-client-requests",
        type=int,
        metavar="N",
        help="requests of one client in flight at once before busy "
        f"({_default('max_client_requests')})",
    )
    add(
        "--history-cache-mb",
        type=int,
        metavar="MIB",
        help=(
            "histories kept for delta sync, all tasks together "
            f"({_default('history_cache_mb')}; 0: only the task in use)"
        ),
    )
    add(
        "--encoding",
        metavar="NAME|PATH",
        help=(f"tiktoken encoding for count_tokens ({_default('encoding')}) or a .tiktoken file"),
    )
    add(
        "--allow-remote",
        action="store_true",
        help="allow TCP endpoints beyond loopback (they need --keys-dir too)",
    )
    add(
        "--keys-dir",
        metavar="DIR",
        help="CURVE keys (server.key_secret, allowed/*.key, made by `ctxwin keys`): "
        "every TCP endpoint authenticates its clients",
    )
    add("--log-format", choices=_LOG_FORMATS, help="json or console (default: automatic)")
    add("--log-level", choices=_LOG_LEVELS, help=f"lowest level logged ({_default('log_level')})")
    add(
        "--state-store",
        metavar="URL",
        help="file: (the state dir; default) or redis://host:port/db, rediss://..., "
        "unix:///path/redis.sock (fleet mode; the password only in the config file or "
        "CTXWIN_STATE_STORE_PASSWORD)",
    )
    add(
        "--store-prefix",
        metavar="PREFIX",
        help=f"first part of every Redis key ({_default('store_prefix')})",
    )
    add(
        "--lease-ttl-ms",
        type=int,
        metavar="MS",
        help=f"lifetime of a task's lease in Redis ({_default('lease_ttl_ms')})",
    )
    add(
        "--store-wait-replicas",
        type=int,
        metavar="N",
        help="replicas each Redis write waits for (WAIT; 0)",
    )
    add(
        "--advertise",
        metavar="ENDPOINT",
        help="endpoint other daemons give clients for tasks this one owns (the first bound)",
    )
    return parser


def _check_int(
    name: str, value: object, source: str, minimum: int, maximum: int = 2**31 - 1
) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ConfigError(
            f"{source}: {name} must be an integer from {minimum} to {maximum}, got {value!r}"
        )
    return value


def _check_number(name: str, value: object, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"{source}: {name} must be a positive number, got {value!r}")
    return float(value)


def _check_str(name: str, value: object, source: str, choices: Sequence[str] = ()) -> str:
    if not isinstance(value, str) or (choices and value not in choices):
        expected = " one of " + ", ".join(choices) if choices else " a string"
        raise ConfigError(f"{source}: {name} must be{expected}, got {value!r}")
    return value


def _apply(values: dict[str, Any], layer: Mapping[str, Any], source: str) -> None:
    """Check one layer's raw values and merge them into ``values``."""
    for name, value in layer.items():
        if name in ("endpoints", "endpoint"):
            items = [value] if isinstance(value, str) else value
            if (
                not isinstance(items, list | tuple)
                or not items
                or not all(isinstance(item, str) and item for item in items)
            ):
                raise ConfigError(f"{source}: {name} must be a string or a list of strings")
            values["endpoints"] = tuple(items)
        elif name == "state_dir":
            values["state_dir"] = Path(_check_str(name, value, source)).expanduser()
        elif name in ("debounce_ms", "debounce_max_ms"):
            values[name] = _check_int(name, value, source, 0)
        elif name in (
            "mailbox_size",
            "max_frames",
            "max_messages",
            "max_tasks",
            "max_client_requests",
        ):
            values[name] = _check_int(name, value, source, 1)
        elif name == "history_cache_mb":
            values[name] = _check_int(name, value, source, 0)
        elif name == "max_bytes":
            values[name] = _check_int(name, value, source, 1024, 2**63 - 1)
        elif name == "idle_timeout":
            values[name] = _check_number(name, value, source)
        elif name == "encoding":
            values[name] = _check_str(name, value, source)
        elif name == "allow_remote":
            if not isinstance(value, bool):
                raise ConfigError(f"{source}: allow_remote must be true or false")
            values[name] = value
        elif name == "keys_dir":
            values[name] = Path(_check_str(name, value, source)).expanduser()
        elif name == "client_tasks":
            if not isinstance(value, Mapping):
                raise ConfigError(f"{source}: [client_tasks] must be a table")
            values[name] = _check_client_tasks(value, source)
        elif name == "log_format":
            values[name] = _check_str(name, value, source, _LOG_FORMATS)
        elif name == "log_level":
            values[name] = _check_str(name, str(value).lower(), source, _LOG_LEVELS)
        elif name == "notices":
            if not isinstance(value, Mapping):
                raise ConfigError(f"{source}: [notices] must be a table")
            notices = dict(values.get("notices", {}))
            for key, text in value.items():
                if key not in NOTICE_ENV:
                    raise ConfigError(
                        f"{source}: unknown notice {key!r}; expected one of "
                        + ", ".join(NOTICE_ENV)
                    )
                notices[key] = _check_str(f"notices.{key}", text, source)
            values["notices"] = notices
        elif name == "state_store":
            values[name] = _check_store_url(_check_str(name, value, source), source)
        elif name == "state_store_password":
            if source == "command line":
                raise ConfigError("the state store password is never a flag")
            values[name] = _check_str(name, value, source)
        elif name in ("store_prefix", "advertise"):
            text = _check_str(name, value, source)
            if not text or any(char in text for char in "{}\n "):
                raise ConfigError(f"{source}: {name} must be non-empty, without braces or spaces")
            values[name] = text
        elif name == "lease_ttl_ms":
            values[name] = _check_int(name, value, source, 100, 3_600_000)
        elif name == "store_wait_replicas":
            values[name] = _check_int(name, value, source, 0, 64)
        elif name == "read_tools":
            if not isinstance(value, list) or not all(isinstance(i, Mapping) for i in value):
                raise ConfigError(f"{source}: read_tools must be a list of tables")
            tools = list(values.get("read_tools", ()))
            for position, item in enumerate(value):
                try:
                    tools.append(engine.read_tool_from_config(item))
                except ValueError as exc:
                    raise ConfigError(f"{source}: read_tools[{position}]: {exc}") from None
            values["read_tools"] = tuple(tools)
        elif name != "config":
            raise ConfigError(f"{source}: unknown setting {name!r}")


def _check_client_tasks(value: Mapping[str, Any], source: str) -> dict[str, tuple[str, ...]]:
    """``[client_tasks]``: each client name maps to a non-empty list of task-id prefixes.

    ``"*"`` (alone or in the list) is every task (the empty prefix); ``default``
    is the entry of allowed keys the table does not name.
    """
    bindings: dict[str, tuple[str, ...]] = {}
    for name, prefixes in value.items():
        if isinstance(prefixes, str):
            prefixes = [prefixes]
        if (
            not isinstance(prefixes, list)
            or not prefixes
            or not all(isinstance(item, str) and item for item in prefixes)
        ):
            raise ConfigError(
                f'{source}: client_tasks.{name} must be "*" or a non-empty list of task-id prefixes'
            )
        bindings[name] = ("",) if "*" in prefixes else tuple(prefixes)
    return bindings


_STORE_SCHEMES = ("redis", "rediss", "unix")


def _check_store_url(url: str, source: str) -> str:
    """A state store URL: ``file:`` or a Redis URL; a flag never carries a password."""
    if url in ("file:", "file"):
        return "file:"
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in _STORE_SCHEMES or not rest:
        raise ConfigError(
            f"{source}: state_store must be file: or a redis://, rediss:// or unix:// URL, "
            f"got {redact_url(url)!r}"
        )
    if source == "command line" and redact_url(url) != url:
        raise ConfigError(
            "command line: --state-store must not carry a password (anyone can read a "
            "command line): set state_store_password in the config file or "
            "CTXWIN_STATE_STORE_PASSWORD"
        )
    return url


def _env_layer(environ: Mapping[str, str]) -> dict[str, Any]:
    """The ``CTXWIN_*`` variables as raw setting values."""
    layer: dict[str, Any] = {}
    source = "environment"
    endpoint = environ.get(proto.ENDPOINT_ENV)
    if endpoint:
        layer["endpoints"] = [item for item in endpoint.replace(",", " ").split() if item]
    if environ.get("CTXWIN_STATE_DIR"):
        layer["state_dir"] = environ["CTXWIN_STATE_DIR"]
    for name in (
        "debounce_ms",
        "debounce_max_ms",
        "mailbox_size",
        "max_bytes",
        "max_frames",
        "max_messages",
        "max_tasks",
        "max_client_requests",
        "history_cache_mb",
        "lease_ttl_ms",
        "store_wait_replicas",
    ):
        raw = environ.get("CTXWIN_" + name.upper())
        if raw:
            try:
                layer[name] = int(raw)
            except ValueError:
                raise ConfigError(f"{source}: CTXWIN_{name.upper()} must be an integer") from None
    raw = environ.get("CTXWIN_IDLE_TIMEOUT")
    if raw:
        try:
            layer["idle_timeout"] = float(raw)
        except ValueError:
            raise ConfigError(f"{source}: CTXWIN_IDLE_TIMEOUT must be a number") from None
    for name in ("encoding", "log_format", "log_level", "keys_dir"):
        raw = environ.get("CTXWIN_" + name.upper())
        if raw:
            layer[name] = raw
    for name in ("state_store", "state_store_password", "store_prefix", "advertise"):
        raw = environ.get("CTXWIN_" + name.upper())
        if raw:
            layer[name] = raw
    raw = environ.get("CTXWIN_ALLOW_REMOTE")
    if raw:
        layer["allow_remote"] = raw.strip().lower() in ("1", "true", "yes", "on")
    notices = {key: environ[var] for key, var in NOTICE_ENV.items() if var in environ}
    if notices:
        layer["notices"] = notices
    return layer


def _check_endpoint(endpoint: str, allow_remote: bool, keys_dir: Path | None) -> None:
    transport, sep, address = endpoint.partition("://")
    if not sep or not address:
        raise ConfigError(f"endpoint {endpoint!r} is not a ZeroMQ endpoint (transport://address)")
    if transport == "ipc":
        if address.startswith("@"):
            return
        if not os.path.isabs(address):
            raise ConfigError(f"ipc endpoint {endpoint!r} must use an absolute path")
        return
    if transport != "tcp":
        raise ConfigError(f"endpoint {endpoint!r}: only ipc:// and tcp:// are supported")
    if proto.is_loopback(endpoint):
        return
    if not allow_remote:
        raise ConfigError(
            f"endpoint {endpoint!r} is not on a loopback address; "
            "set allow_remote (--allow-remote) to bind it"
        )
    if keys_dir is None:
        raise ConfigError(
            f"endpoint {endpoint!r} is not on a loopback address and no keys are configured: "
            "anyone who can reach it could read and change every task. Create keys with "
            "`ctxwin keys server` and give the daemon --keys-dir (keys_dir, CTXWIN_KEYS_DIR); "
            "see README, Who may connect"
        )


def _check_file_owner(path: Path, info: os.stat_result) -> None:
    """Refuse a config file another user can write: theirs (root aside), or open to others.

    Whoever can write it chooses the daemon's keys, endpoints, store and limits.

    Raises:
        ConfigError: naming the owner or the mode, and the fix.
    """
    uid = os.getuid()
    if info.st_uid not in (uid, 0):
        raise ConfigError(
            f"config file {path} belongs to uid {info.st_uid}, not to the daemon's uid {uid} "
            f"or root: its owner could rewrite it; chown it (or copy it to a file of your own)"
        )
    if info.st_mode & 0o022:
        raise ConfigError(
            f"config file {path} is writable by others (mode {info.st_mode & 0o777:04o}): "
            f"anyone who can write it configures the daemon; chmod go-w {path}"
        )


def _is_file(path: Path) -> bool:
    """Whether the default config file exists; a directory we may not search has none."""
    try:
        return path.is_file()
    except OSError:
        return False


def load_config(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> Config:
    """Build the configuration from every layer.

    Args:
        argv: command-line arguments (without the program name).
        environ: the environment; ``os.environ`` when omitted.

    Returns:
        The merged, checked configuration.

    Raises:
        ConfigError: a value that cannot be used, naming where it came from.
        SystemExit: from argparse for ``--help`` or an unknown flag.
    """
    env = os.environ if environ is None else environ
    flags = vars(_parser().parse_args(list(argv) if argv is not None else None))
    path, explicit = _config_path(env, flags.get("config"))
    values: dict[str, Any] = {}
    config_file: Path | None = None
    if explicit or _is_file(path):
        try:
            with path.open("rb") as handle:
                _check_file_owner(path, os.fstat(handle.fileno()))
                file_layer = tomllib.load(handle)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
        _apply(values, file_layer, str(path))
        config_file = path
    _apply(values, _env_layer(env), "environment")
    _apply(values, flags, "command line")
    values.setdefault("endpoints", default_endpoints(env))
    values.setdefault("state_dir", default_state_dir(env))
    config = Config(**values, config_file=config_file)
    if config.debounce_max_ms < config.debounce_ms:
        config = replace(config, debounce_max_ms=config.debounce_ms)
    for endpoint in config.endpoints:
        _check_endpoint(endpoint, config.allow_remote, config.keys_dir)
    return config
