"""A fresh venv with only ./proto and ./client installed runs the CLI against the daemon."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._daemon import DaemonProcess

ROOT = Path(__file__).resolve().parents[1]


def _run(argv: list[str | Path], env: dict[str, str], timeout: float = 120) -> str:
    run = subprocess.run(
        [str(arg) for arg in argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    assert 0 == run.returncode, run.stdout + run.stderr
    return run.stdout


@pytest.mark.slow
def test_client_only_venv_pings_the_daemon(daemon: DaemonProcess, tmp_path: Path) -> None:
    """pip install ./proto ./client gives a working ``ctxwin`` without the daemon's dependencies."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}
    }
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    _run([base, "-m", "venv", venv], env)
    python = venv / "bin" / "python"
    _run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         ROOT / "proto", ROOT / "client"],
        env,
    )  # fmt: skip
    out = _run([venv / "bin" / "ctxwin", "--endpoint", daemon.endpoint, "ping"], env)
    assert out.startswith(f"pong from {daemon.endpoint}: ctxwind ")
    probe = (
        "import importlib.util as u, ctxwin.client, zmq, msgpack;"
        "print([m for m in ('anyio', 'tiktoken', 'structlog', 'ctxwin.daemon', 'ctxwin.engine')"
        " if u.find_spec(m) is not None])"
    )
    assert "[]\n" == _run([python, "-c", probe], env)
