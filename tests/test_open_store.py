"""open_store: the store the configuration names, and what ping says of it."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from ctxwin import engine, proto
from ctxwin.daemon import Config, StartupError
from ctxwin.daemon import store as stores
from ctxwin.daemon.store import FileStore, open_store
from ctxwin.daemon.store._fleet import RedisStateStore

pytestmark = pytest.mark.anyio


def never(function: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """A spawn that must not be called: opening a store starts nothing."""
    raise AssertionError("open_store started a task")


def config(tmp_path: Path, state_store: str) -> Config:
    return Config(endpoints=("ipc:///x.sock",), state_dir=tmp_path, state_store=state_store)


async def test_file_is_the_file_store_with_no_features(tmp_path: Path) -> None:
    """``file:`` opens the file store in the state dir; it adds no feature to ping."""
    store = open_store(config(tmp_path, "file:"), engine.DEFAULT_NOTICES, never)
    assert isinstance(store, FileStore)
    assert (store.features, store.describe()) == (
        (),
        {"kind": "file", "path": str(tmp_path / "tasks")},
    )


async def test_a_redis_url_is_the_fleet_store(tmp_path: Path) -> None:
    """A Redis URL opens the Redis store (nothing is asked of Redis yet); it adds ``fleet``."""
    store = open_store(config(tmp_path, "redis://127.0.0.1:1/0"), engine.DEFAULT_NOTICES, never)
    try:
        assert isinstance(store, RedisStateStore)
        assert store.features == ("fleet",)
        assert "fleet" not in proto.FEATURES  # only a daemon with this store names it
        assert store.describe()["url"] == "redis://127.0.0.1:1/0"
    finally:
        await store.close()


async def test_a_redis_url_without_the_extra_stops_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the redis package, a Redis URL is a start-up error naming the extra."""
    monkeypatch.setattr(stores, "redis_available", lambda: False)
    with pytest.raises(StartupError, match=r"pip install 'ctxwin\[redis\]'"):
        open_store(config(tmp_path, "redis://127.0.0.1:1/0"), engine.DEFAULT_NOTICES, never)
