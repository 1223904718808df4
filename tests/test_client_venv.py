"""A fresh venv with only ./proto and ./client installed runs the CLI against the daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ctxwin.client import Client
from tests._daemon import DaemonProcess

ROOT = Path(__file__).resolve().parents[1]
PAGE_FILES = ROOT / "client" / "src" / "ctxwin" / "client" / "cli" / "page"


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
def test_client_only_venv_pings_the_daemon(shared_daemon: DaemonProcess, tmp_path: Path) -> None:
    """pip install ./proto ./client gives a working ``ctxwin`` without the daemon's dependencies,
    and the built client carries the page's style sheet and script (``inspect --html``)."""
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
    endpoint = shared_daemon.endpoint
    out = _run([venv / "bin" / "ctxwin", "--endpoint", endpoint, "ping"], env)
    assert out.startswith(f"pong from {endpoint}: ctxwind ")
    probe = (
        "import importlib.util as u, ctxwin.client, zmq, msgpack;"
        "print([m for m in ('anyio', 'tiktoken', 'structlog', 'ctxwin.daemon', 'ctxwin.engine')"
        " if u.find_spec(m) is not None])"
    )
    assert "[]\n" == _run([python, "-c", probe], env)
    messages = [
        {"role": role, "content": [{"type": "text", "text": f"message {index} " * 50}]}
        for index, role in enumerate(["user", "assistant"] * 4)
    ]
    with Client(endpoint) as client:
        client.compact("venv-page", messages, "quarter", ts=1)
    history, page = tmp_path / "history.json", tmp_path / "page.html"
    history.write_text(json.dumps(messages), encoding="utf-8")
    argv: list[str | Path] = [venv / "bin" / "ctxwin", "--endpoint", endpoint]
    _run([*argv, "inspect", "venv-page", "--messages", history, "--html", page], env)
    text = page.read_text(encoding="utf-8")
    style = (PAGE_FILES / "page.css").read_text(encoding="utf-8")
    script = (PAGE_FILES / "page.js").read_text(encoding="utf-8")
    assert f"<style>\n{style}</style>" in text
    assert f"<script>\n{script.split('/* range */')[0]}" in text
    assert '<span id="fold-text">messages 2-' in text
