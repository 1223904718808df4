from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests._daemon import DaemonProcess
from tests._redis import RedisServer, require_redis_server

# No property test may depend on the machine being idle: how long an example takes
# to generate or to run varies with load, so neither the generation-time health
# check nor the per-example deadline applies. A test's own @settings inherits these
# unless it names suppress_health_check or deadline itself (tests/test_hypothesis_profile.py
# holds every @given test to that).
LOAD_INDEPENDENT = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ctxwin", LOAD_INDEPENDENT)
# CI runs the same examples every time (.ci/run sets CTXWIN_CI); a local run explores.
settings.register_profile("ci", LOAD_INDEPENDENT, derandomize=True)
settings.load_profile("ci" if os.environ.get("CTXWIN_CI") else "ctxwin")

_PRIVATE_DIRS = ("XDG_RUNTIME_DIR", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME")
_own: list[Path] = []


def pytest_configure(config: pytest.Config) -> None:
    """Point the user's runtime, state, config and cache dirs at a private temp dir.

    Set before any test runs and inherited by every daemon and client the tests
    start, so nothing reads the user's ctxwin config or leaves a socket or
    state in their real directories (a desktop session sets XDG_RUNTIME_DIR),
    and no test talks to the user's own daemon through $CTXWIN_ENDPOINT.
    """
    root = Path(tempfile.mkdtemp(prefix="ctxwin-tests-"))
    _own.append(root)
    for name in _PRIVATE_DIRS:
        path = root / name.lower()
        path.mkdir(mode=0o700)
        os.environ[name] = str(path)
    os.environ.pop("CTXWIN_ENDPOINT", None)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the private dirs of :func:`pytest_configure`."""
    while _own:
        shutil.rmtree(_own.pop(), ignore_errors=True)


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
