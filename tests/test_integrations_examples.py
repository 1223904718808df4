"""client/examples/: one runnable agent per SDK and framework, against the fake provider."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._daemon import DaemonProcess

EXAMPLES = Path(__file__).resolve().parents[1] / "client" / "examples"


@pytest.mark.parametrize(
    "name",
    ["openai_chat", "anthropic_messages", "agents_sdk", "langchain_agent", "pydantic_ai_agent"],
)
def test_the_example_runs_to_its_answer_and_ctxwin_cuts_on_the_way(
    daemon: DaemonProcess, name: str
) -> None:
    """The example exits 0 with the model's answer after at least one cut by ctxwin."""
    script = str(EXAMPLES / f"{name}.py")
    run = subprocess.run(
        # 24 tool calls: enough for a cut, fewer than the example's 40
        [sys.executable, script, "--endpoint", daemon.endpoint, "--turns", "24"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert 0 == run.returncode, run.stderr
    assert "tracing" not in run.stderr.lower(), run.stderr  # an offline run uploads nothing
    lines = run.stdout.splitlines()
    cuts = [re.search(r"\bsent (\d+) of (\d+) messages, ", line) for line in lines]
    assert any(cut and int(cut[1]) < int(cut[2]) for cut in cuts), run.stdout
    assert "Done: both files read." in lines[-1]
    assert [] == daemon.tasks_left()  # the example's task is ephemeral: nothing left behind
