"""autostart=True: nothing answers, ctxwind is started detached; racing clients share one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ctxwin import proto
from ctxwin.client import AsyncClient, Client, DaemonUnavailableError

CLIENT_SCRIPT = """
from ctxwin.client import Client
with Client(autostart=True, timeout=30) as client:
    print(client.ping()["pong"])
"""


def _daemons(endpoint: str) -> list[int]:
    """Pids of live ctxwind processes whose command line names ``endpoint``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        words = [word.decode(errors="replace") for word in cmdline]
        if state != "Z" and endpoint in words and any("ctxwind" in word for word in words):
            pids.append(int(entry.name))
    return pids


def _stop(endpoint: str) -> None:
    """SIGTERM every daemon on ``endpoint`` and wait until none is left."""
    for pid in _daemons(endpoint):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while _daemons(endpoint):
        assert time.monotonic() < deadline, "autostarted ctxwind did not stop"
        time.sleep(0.05)


@pytest.fixture
def private_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A private runtime and state dir; yields the default endpoint they imply."""
    monkeypatch.delenv(proto.ENDPOINT_ENV, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    monkeypatch.setenv("CTXWIN_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "xdg").mkdir(mode=0o700)
    endpoint = proto.default_endpoint()
    try:
        yield endpoint
    finally:
        _stop(endpoint)


@pytest.mark.slow
def test_two_racing_clients_end_with_one_daemon(private_env: str) -> None:
    """Two processes autostarting at once both get answers from a single daemon."""
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(2)
    ]
    outputs = [racer.communicate(timeout=60) for racer in racers]
    assert [0, 0] == [racer.returncode for racer in racers], outputs
    assert [b"True\n", b"True\n"] == [out for out, _ in outputs]
    assert 1 == len(_daemons(private_env))


def test_autostart_is_off_by_default(private_env: str) -> None:
    """Without autostart a client starts nothing: it fails at once, saying how to start one."""
    with Client(timeout=30) as client, pytest.raises(DaemonUnavailableError, match="autostart"):
        client.ping()
    assert [] == _daemons(private_env)


def test_autostart_reuses_a_running_daemon(private_env: str) -> None:
    """A second autostarting client finds the first one's daemon and starts none."""
    with Client(autostart=True, timeout=30) as first:
        assert first.ping()["pong"]
    pids = _daemons(private_env)
    with Client(autostart=True, timeout=30) as second:
        assert second.ping()["pong"]
    assert pids == _daemons(private_env)
    assert 1 == len(pids)


@pytest.mark.anyio
async def test_async_client_autostarts_too(private_env: str) -> None:
    """AsyncClient(autostart=True) starts the daemon without blocking the loop's callers."""
    async with AsyncClient(autostart=True, timeout=30) as client:
        assert (await client.ping())["pong"]
    assert 1 == len(_daemons(private_env))


def test_autostart_again_after_the_daemon_died(private_env: str) -> None:
    """After its daemon is killed, an autostarting client's next call starts a new one."""
    with Client(autostart=True, timeout=30) as client:
        assert client.ping()["pong"]
        [first] = _daemons(private_env)
        os.kill(first, signal.SIGKILL)
        with pytest.raises(TimeoutError):
            client.ping(timeout=0.3)
        assert client.ping()["pong"]
        [second] = _daemons(private_env)
    assert first != second
