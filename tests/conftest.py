from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from hypothesis import HealthCheck, settings

from ctxwin.client import Client
from tests._conversation import NOTICE
from tests._daemon import Connect, DaemonFactory, DaemonProcess, WirePeer
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


@pytest.fixture(scope="session")
def daemon_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonFactory]:
    """Real ctxwind subprocesses shared per configuration by the tests of this worker:
    ``daemon_factory()``, ``daemon_factory("--max-bytes", "4096")``,
    ``daemon_factory(env={...})``, ``daemon_factory(config="...")``."""
    factory = DaemonFactory(tmp_path_factory.mktemp)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(autouse=True)
def _own_tasks(request: pytest.FixtureRequest, daemon_factory: DaemonFactory) -> Iterator[None]:
    """Fail a test that used a task of a shared daemon that an earlier test used."""
    yield
    taken = daemon_factory.claim(request.node.nodeid)
    assert not taken, "use task ids of the test's own: " + "; ".join(taken)


@pytest.fixture
def shared_daemon(daemon_factory: DaemonFactory) -> DaemonProcess:
    """The worker's daemon of the default configuration (use task ids of the test's own)."""
    return daemon_factory()


@pytest.fixture(scope="module")
def client(daemon_factory: DaemonFactory) -> Iterator[Client]:
    """A blocking client of the worker's default daemon, shared by one module's tests (use task
    ids of the test's own); a module that needs another client defines its own ``client``."""
    with Client(daemon_factory().endpoint, timeout=60) as connected:
        yield connected


@pytest.fixture(scope="module")
def ctxwind(daemon_factory: DaemonFactory) -> DaemonProcess:
    """The worker's daemon whose duplicate-read notice is the integration tests' NOTICE
    (tests/_conversation.py), to find it in what the fake provider got (own task ids)."""
    return daemon_factory(env={"CTXWIN_DUPLICATE_FILE_READ_NOTICE": NOTICE})


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A real ctxwind subprocess of the test's own, for tests that stop, kill, restart or
    corrupt it, or read what only one test may have done to it."""
    process = DaemonProcess(tmp_path)
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def wire_peer() -> Iterator[Connect]:
    """Open raw wire sockets: ``wire_peer(daemon.endpoint)`` (``kind=zmq.REQ`` for a REQ);
    every one is closed when the test ends."""
    peers: list[WirePeer] = []

    def connect(endpoint: str, kind: int = zmq.DEALER) -> WirePeer:
        peers.append(WirePeer(endpoint, kind))
        return peers[-1]

    try:
        yield connect
    finally:
        for peer in peers:
            peer.close()


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
