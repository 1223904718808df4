"""The README's client code runs: every ```python block under "## Client quick start"."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ctxwin import proto
from tests._daemon import DaemonProcess
from tests._fake_provider import FakeProvider

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Client quick start"


def python_blocks(text: str, heading: str = SECTION) -> list[str]:
    """The ```python blocks between ``heading`` and the next level-2 heading."""
    start = text.index(heading + "\n")
    following = re.search(r"^## ", text[start + len(heading) :], flags=re.M)
    end = start + len(heading) + following.start() if following else len(text)
    return re.findall(r"^```python\n(.*?)^```$", text[start:end], flags=re.M | re.S)


def test_the_quick_start_has_sync_and_async_code() -> None:
    """The section holds a blocking, an asyncio and a delta-sync/estimates example."""
    blocks = python_blocks(README.read_text())
    assert 3 == len(blocks)
    assert "Client(" in blocks[0]
    assert "AsyncClient(" in blocks[1]
    assert "task.plan(" in blocks[2]


def _run_block(code: str, daemon: DaemonProcess) -> subprocess.CompletedProcess[str]:
    """Run a README block in a fresh interpreter, pointed at ``daemon`` by $CTXWIN_ENDPOINT."""
    env = {**os.environ, proto.ENDPOINT_ENV: daemon.endpoint}
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("index", [0, 1, 2])
def test_quick_start_block_runs_against_the_daemon(daemon: DaemonProcess, index: int) -> None:
    """Each block runs with the endpoint from $CTXWIN_ENDPOINT and prints the same when rerun."""
    code = python_blocks(README.read_text())[index]
    run = _run_block(code, daemon)
    assert 0 == run.returncode, run.stderr
    assert run.stdout
    again = _run_block(code, daemon)
    assert (0, run.stdout) == (again.returncode, again.stdout), "a second run prints the same"
    assert [] == daemon.tasks_left()  # a run leaves no task behind


def test_the_dialects_example_runs_against_the_daemon(daemon: DaemonProcess) -> None:
    """The wire section's dialect example runs to completion against a real daemon."""
    (code,) = python_blocks(README.read_text(), "## Wire protocol")
    run = _run_block(code, daemon)
    assert 0 == run.returncode, run.stderr
    assert [] == daemon.tasks_left()


INTEGRATIONS = "## SDKs and agent frameworks"
INTEGRATION_MODULES = ["openai", "anthropic", "agents", "langchain", "pydantic_ai"]


def test_the_integrations_section_has_one_block_per_sdk_and_framework() -> None:
    """The section holds one example for each adapter, in the order of its subsections."""
    blocks = python_blocks(README.read_text(), INTEGRATIONS)
    assert len(INTEGRATION_MODULES) == len(blocks)
    for module, block in zip(INTEGRATION_MODULES, blocks, strict=True):
        assert f"from ctxwin.client.integrations.{module} import" in block


@pytest.mark.parametrize("index", range(len(INTEGRATION_MODULES)))
def test_integration_block_runs_against_the_daemon_and_a_fake_provider(
    daemon: DaemonProcess, index: int
) -> None:
    """Each block runs as written, the SDK pointed at the fake provider by its own variables."""
    code = python_blocks(README.read_text(), INTEGRATIONS)[index]
    with FakeProvider(tool_turns=3) as provider:
        env = {
            **os.environ,
            proto.ENDPOINT_ENV: daemon.endpoint,
            "OPENAI_BASE_URL": provider.openai_url,
            "OPENAI_API_KEY": "test-key",
            "ANTHROPIC_BASE_URL": provider.url,
            "ANTHROPIC_API_KEY": "test-key",
            "OPENAI_AGENTS_DISABLE_TRACING": "1",
        }
        run = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        sent = provider.sent()
    assert 0 == run.returncode, run.stderr
    assert run.stdout
    assert "tracing" not in run.stderr.lower(), run.stderr  # offline as the README says
    assert 4 == len(sent)  # three tool calls, then the answer
    assert [200] * 4 == [r.status for r in sent]
    assert [] == [r.problems for r in sent if r.problems]
    assert [] == daemon.tasks_left()  # a run leaves no task behind
