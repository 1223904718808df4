from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._daemon import DaemonProcess
from tests._redis import RedisServer, require_redis_server


@pytest.fixture
def anyio_backend() -> str:
    """pyzmq's asyncio support means asyncio only."""
    return "asyncio"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A real ctxwind subprocess on a private ipc endpoint and state dir."""
    process = DaemonProcess(tmp_path)
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server child process on a unix socket in a short temp dir of its own."""
    require_redis_server()
    # Not tmp_path: a unix socket path must stay under 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="ctxwin-redis-"))
    server = RedisServer(root)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
