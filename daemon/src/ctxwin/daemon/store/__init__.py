"""Where every task's state lives: the store seam and its two stores.

- ``_base.py``: the :class:`TaskStore` / :class:`StateStore` protocols every
  store implements, :class:`TaskExtras` and the errors;
- ``_record.py``: :class:`~._record.TaskRecord`, the stored form every store
  keeps, and its bytes (``ctxwin.json``);
- ``_files.py``: the file store (the default), task files and lock files;
- ``_fleet.py`` and ``_redis.py``: the Redis store of fleet mode, one owning
  daemon per task by a lease, every write fenced.

:func:`open_store` chooses the store the configuration names.
"""

from __future__ import annotations

from collections.abc import Callable

from ctxwin import engine

from .._config import Config
from .._errors import StartupError
from ._base import Spawn, StateStore, StoreError, StoreUnavailableError, TaskExtras, TaskStore
from ._files import FileStore
from ._fleet import RedisStateStore
from ._redis import RedisStore, redis_available

__all__ = [
    "FileStore",
    "Spawn",
    "StateStore",
    "StoreError",
    "StoreOpener",
    "StoreUnavailableError",
    "TaskExtras",
    "TaskStore",
    "open_store",
]


def open_store(
    config: Config,
    notices: engine.Notices,
    spawn: Spawn,
    *,
    redis: Callable[..., RedisStore] = RedisStore,
) -> StateStore:
    """The file store, or the Redis one for a Redis ``state_store`` URL.

    Args:
        config: the daemon's configuration.
        notices: notice texts for loaded states.
        spawn: where the Redis store runs its lease renewals.
        redis: makes the Redis connection and scripts from ``RedisStore``'s
            arguments (a subclass of it for a store that also keeps an audit).

    Raises:
        StartupError: the Redis store is asked for without the ``redis`` extra.
    """
    if config.state_store == "file:":
        return FileStore(config.state_dir, notices, config.advertised)
    if not redis_available():
        raise StartupError(
            "--state-store is a Redis URL but the redis package is missing: "
            "pip install 'ctxwin[redis]'"
        )
    ttl_s = config.lease_ttl_ms / 1000
    connection = redis(
        config.state_store,
        config.advertised,
        password=config.state_store_password,
        prefix=config.store_prefix,
        lease_ttl_ms=config.lease_ttl_ms,
        wait_replicas=config.store_wait_replicas,
        timeout_s=max(0.2, min(2.0, ttl_s / 3)),
    )
    return RedisStateStore(connection, notices, spawn)


StoreOpener = Callable[[Config, engine.Notices, Spawn], StateStore]
"""What :func:`open_store` is to the daemon (tests give one that keeps an audit)."""
