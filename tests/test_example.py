"""client/examples/agent_loop.py runs against the real daemon."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests._daemon import DaemonProcess

EXAMPLE = Path(__file__).resolve().parents[1] / "client" / "examples" / "agent_loop.py"


def test_agent_loop_example_compacts_retries_and_runs_a_subagent(daemon: DaemonProcess) -> None:
    """The example exits 0 after a context-window error, a compaction, a retry and a subagent."""
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--endpoint", daemon.endpoint],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert 0 == run.returncode, run.stderr
    lines = run.stdout.splitlines()
    assert any("context window exceeded" in line and "compacted to range" in line for line in lines)
    assert any("retry succeeded" in line for line in lines)
    assert any(".sub-1] finished" in line and "ephemeral, closed" in line for line in lines)
    assert [] == daemon.tasks_left()  # neither the main task nor the subagent's
