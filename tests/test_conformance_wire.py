"""Every conformance scenario over the wire, against the real ctxwind and its files."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxwin.daemon.store._record import TaskRecord, encode_task
from tests._daemon import DaemonFactory, DaemonProcess, WirePeer
from tests._redis import RedisServer, require_redis_server
from tests._scenarios import (
    PLACEHOLDER_ENV,
    SCENARIO_DIR,
    Scenario,
    expand_args,
    expected_value,
    load_scenarios,
    normalise_updates,
)

SCENARIOS = load_scenarios()


@pytest.fixture(scope="module")
def conformance_daemon(daemon_factory: DaemonFactory) -> DaemonProcess:
    """The shared daemon configured with the scenarios' placeholder notice texts."""
    return daemon_factory(env=PLACEHOLDER_ENV)


@pytest.fixture(scope="module")
def connection(conformance_daemon: DaemonProcess) -> Iterator[WirePeer]:
    """The module's connection to the conformance daemon."""
    with WirePeer(conformance_daemon.endpoint, timeout=30) as peer:
        yield peer


def _write_initial(daemon: DaemonProcess, scenario: Scenario) -> None:
    task_dir = daemon.task_dir(scenario.task)
    assert not task_dir.exists(), "scenario tasks must start empty"
    if scenario.initial_updates is not None:
        task_dir.mkdir(parents=True)
        (task_dir / "context_history.json").write_text(json.dumps(scenario.initial_updates))


def _run_steps(scenario: Scenario, connection: WirePeer) -> Any:
    """Run the scenario's steps, checking replies and overlays; the overlay it ends with."""
    overlay = normalise_updates(scenario.initial_updates or [])
    for number, step in enumerate(scenario.steps):
        args = expand_args(step["args"], scenario.conversation)
        result = connection.result(step["op"], args)
        for key, expected in step["expect"].items():
            left, right = expected_value(expected, result.get(key))
            assert left == right, f"step {number} ({step['op']}): {key}"
        if "expect_updates" in step:
            overlay = normalise_updates(step["expect_updates"])
        if "expect_updates" in step or number == len(scenario.steps) - 1:
            inspected = connection.result("inspect", {"task": scenario.task})
            assert normalise_updates(inspected["updates"]) == overlay, f"step {number} overlay"
    return overlay


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario_over_the_wire(
    scenario: Scenario, conformance_daemon: DaemonProcess, connection: WirePeer
) -> None:
    """The scenario's replies and overlays match, and after flush the file equals the overlay."""
    _write_initial(conformance_daemon, scenario)
    overlay = _run_steps(scenario, connection)
    connection.result("flush", {"task": scenario.task})
    history = conformance_daemon.task_dir(scenario.task) / "context_history.json"
    on_disk: Any = json.loads(history.read_text()) if history.exists() else []
    assert normalise_updates(on_disk) == overlay
    connection.result("close", {"task": scenario.task})


@pytest.fixture(scope="module")
def redis_for_conformance() -> Iterator[RedisServer]:
    """A redis-server for the module's Redis-backed daemon."""
    require_redis_server()
    root = Path(tempfile.mkdtemp(prefix="ctxwin-redis-"))
    try:
        with RedisServer(root) as server:
            yield server
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def redis_daemon(
    tmp_path_factory: pytest.TempPathFactory, redis_for_conformance: RedisServer
) -> Iterator[DaemonProcess]:
    """A conformance daemon whose state store is Redis (it lives no longer than its server)."""
    with DaemonProcess(
        tmp_path_factory.mktemp("conformance-redis"),
        "--state-store",
        redis_for_conformance.url,
        env=PLACEHOLDER_ENV,
    ) as process:
        yield process


@pytest.fixture(scope="module")
def redis_connection(redis_daemon: DaemonProcess) -> Iterator[WirePeer]:
    """The module's connection to the Redis-backed daemon."""
    with WirePeer(redis_daemon.endpoint, timeout=30) as peer:
        yield peer


@pytest.fixture(scope="module")
def redis_client(redis_for_conformance: RedisServer) -> Iterator[Any]:
    """A plain Redis client of the test's own, to seed and read back task states."""
    import redis

    client = redis.Redis(unix_socket_path=str(redis_for_conformance.socket))
    try:
        yield client
    finally:
        client.close()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario_with_the_redis_store(
    scenario: Scenario, redis_daemon: DaemonProcess, redis_connection: WirePeer, redis_client: Any
) -> None:
    """The scenario passes with --state-store on Redis; after flush Redis holds the overlay."""
    key = f"ctxwin:{{{scenario.task}}}:state"
    assert redis_client.get(key) is None, "scenario tasks must start empty"
    if scenario.initial_updates is not None:
        redis_client.set(key, encode_task(TaskRecord(scenario.initial_updates)).authority)
    overlay = _run_steps(scenario, redis_connection)
    assert redis_connection.result("inspect", {"task": scenario.task})["store"] == "redis"
    redis_connection.result("flush", {"task": scenario.task})
    raw = redis_client.get(key)
    stored: Any = json.loads(raw)["updates"] if raw is not None else []
    assert normalise_updates(stored) == overlay
    redis_connection.result("close", {"task": scenario.task})
    assert not (redis_daemon.task_dir(scenario.task)).exists()  # nothing went to files


def test_the_scenarios_are_the_repositorys_own() -> None:
    """The scenarios are read from tests/conformance in this checkout, every file of it."""
    repository = Path(__file__).resolve().parents[1]
    assert SCENARIO_DIR.is_relative_to(repository)
    files = sorted(path.name.removesuffix(".json.gz") for path in SCENARIO_DIR.glob("*.json.gz"))
    assert [scenario.name for scenario in SCENARIOS] == files
