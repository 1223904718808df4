"""The code of the README and of docs/ runs: every ```python block of theirs.

The README's blocks are under "## An agent in one line" and "## Client quick
start"; docs/INTEGRATIONS.md holds one per SDK and framework, and
docs/PROTOCOL.md one under "## Dialects (`dialects`)".
"""

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

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PROTOCOL = ROOT / "docs" / "PROTOCOL.md"
INTEGRATIONS = ROOT / "docs" / "INTEGRATIONS.md"
SECTION = "## Client quick start"


def python_blocks(text: str, heading: str | None = SECTION) -> list[str]:
    """The ```python blocks between ``heading`` and the next level-2 heading (None: all)."""
    if heading is None:
        return re.findall(r"^```python\n(.*?)^```$", text, flags=re.M | re.S)
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


def _run_block(
    code: str,
    daemon: DaemonProcess,
    provider: FakeProvider | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run a doc's block in a fresh interpreter, pointed at ``daemon`` by $CTXWIN_ENDPOINT and,
    with ``provider``, the SDKs at it by their own variables (offline: no tracing upload)."""
    env = {**os.environ, proto.ENDPOINT_ENV: daemon.endpoint}
    if provider is not None:
        env |= {
            "OPENAI_BASE_URL": provider.openai_url,
            "OPENAI_API_KEY": "test-key",
            "ANTHROPIC_BASE_URL": provider.url,
            "ANTHROPIC_API_KEY": "test-key",
            "OPENAI_AGENTS_DISABLE_TRACING": "1",
        }
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
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


def test_every_python_block_of_the_readme_and_the_protocol_is_one_these_tests_run() -> None:
    """No ```python block lies outside the sections these tests read, so none goes unrun."""
    sections: dict[Path, list[str | None]] = {
        README: [ONE_LINE, SECTION],
        PROTOCOL: [DIALECTS],
        INTEGRATIONS: [None],
    }
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        read = [
            block for heading in sections.get(page, []) for block in python_blocks(text, heading)
        ]
        assert sorted(python_blocks(text, None)) == sorted(read), page.name


ONE_LINE = "## An agent in one line"
# What the tests add after the README's line: one request, then the task it used.
ONE_REQUEST = {
    "openai": 'response = client.chat.completions.create(model="gpt-4o", messages=MESSAGES)\n',
    "anthropic": (
        "response = client.messages.create(\n"
        '    model="claude-sonnet-4-5", max_tokens=256, messages=MESSAGES\n'
        ")\n"
    ),
}


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_the_one_line_adoption_sends_a_request_through_the_daemon(
    daemon: DaemonProcess, sdk: str
) -> None:
    """The README's wrap(OpenAI()) line, and the wrap(Anthropic()) it names, reach the model."""
    (code,) = python_blocks(README.read_text(), ONE_LINE)
    assert "client = wrap(OpenAI())" in code
    if sdk == "anthropic":
        section = README.read_text().split(ONE_LINE, 1)[1]
        assert "`wrap(Anthropic())` (from `ctxwin.client.integrations.anthropic`)" in section
        code = code.replace("openai", "anthropic").replace("OpenAI", "Anthropic")
    code += (
        'MESSAGES = [{"role": "user", "content": "Fix main()."}]\n'
        + ONE_REQUEST[sdk]
        + "from ctxwin.client.integrations import window_of\n"
        + "print(window_of(client).last().task)\n"
    )
    with FakeProvider(tool_turns=0) as provider:
        run = _run_block(code, daemon, provider)
        sent = provider.sent()
    assert 0 == run.returncode, run.stderr
    assert run.stdout.startswith(f"{sdk}-")  # the conversation's derived task id
    assert [200] == [r.status for r in sent]
    assert [run.stdout.strip()] == daemon.tasks_left()  # an agent's task is persistent


DIALECTS = "## Dialects (`dialects`)"


def test_the_dialects_example_runs_against_the_daemon(daemon: DaemonProcess) -> None:
    """docs/PROTOCOL.md's dialect example runs to completion against a real daemon."""
    (code,) = python_blocks(PROTOCOL.read_text(), DIALECTS)
    run = _run_block(code, daemon)
    assert 0 == run.returncode, run.stderr
    assert [] == daemon.tasks_left()


INTEGRATION_MODULES = ["openai", "anthropic", "agents", "langchain", "pydantic_ai"]


def test_the_integrations_section_has_one_block_per_sdk_and_framework() -> None:
    """docs/INTEGRATIONS.md holds one example for each adapter, in the order of its sections."""
    blocks = python_blocks(INTEGRATIONS.read_text(), None)
    assert len(INTEGRATION_MODULES) == len(blocks)
    for module, block in zip(INTEGRATION_MODULES, blocks, strict=True):
        assert f"from ctxwin.client.integrations.{module} import" in block


@pytest.mark.parametrize("index", range(len(INTEGRATION_MODULES)))
def test_integration_block_runs_against_the_daemon_and_a_fake_provider(
    daemon: DaemonProcess, index: int
) -> None:
    """Each block runs as written, the SDK pointed at the fake provider by its own variables."""
    code = python_blocks(INTEGRATIONS.read_text(), None)[index]
    with FakeProvider(tool_turns=3) as provider:
        run = _run_block(code, daemon, provider, timeout=120)
        sent = provider.sent()
    assert 0 == run.returncode, run.stderr
    assert run.stdout
    assert "tracing" not in run.stderr.lower(), run.stderr  # offline as the README says
    assert 4 == len(sent)  # three tool calls, then the answer
    assert [200] * 4 == [r.status for r in sent]
    assert [] == [r.problems for r in sent if r.problems]
    assert [] == daemon.tasks_left()  # a run leaves no task behind
