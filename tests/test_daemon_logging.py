"""ctxwind's log format choice and what its events leave out."""

from __future__ import annotations

import io
import json
import signal
import subprocess
from pathlib import Path

import pytest

from ctxwin.daemon._logging import choose_format
from tests._daemon import DaemonProcess, wait_until

SECRET = "SECRET-CONVERSATION-TEXT-4711"


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("requested", "stream", "environ", "expected"),
    [
        ("console", io.StringIO(), {"JOURNAL_STREAM": "8:1"}, "console"),
        (None, Terminal(), {"JOURNAL_STREAM": "8:1"}, "json"),
        (None, Terminal(), {"INVOCATION_ID": "abc"}, "json"),
        (None, Terminal(), {}, "console"),
        (None, io.StringIO(), {}, "json"),
    ],
)
def test_format_is_json_under_systemd_and_console_on_a_terminal(
    requested: str | None, stream: io.StringIO, environ: dict[str, str], expected: str
) -> None:
    """An explicit format wins; systemd means JSON; a terminal means console."""
    assert choose_format(requested, stream, environ) == expected


def test_logs_hold_no_conversation_text(tmp_path: Path) -> None:
    """Requests that succeed or fail leave events in the log but never their text."""
    with DaemonProcess(tmp_path, "--log-level", "debug") as daemon:
        message = {"role": "user", "content": [{"type": "text", "text": SECRET}]}
        assert daemon.call("truncated_messages", {"task": "t", "messages": [message]}).ok
        bad = daemon.call("truncated_messages", {"task": "t", "messages": [message, SECRET]})
        assert bad.code == "bad_request"
        assert daemon.call("count_tokens", {"text": SECRET}).ok
        assert daemon.call("flush").ok
    lines = daemon.log().splitlines()
    assert [json.loads(line)["event"] for line in lines if "request_refused" in line] == [
        "request_refused"
    ]
    assert SECRET not in daemon.log()


def test_a_log_stream_that_breaks_costs_the_logs_only(tmp_path: Path) -> None:
    """With the reader of its log pipe gone, the daemon still answers, starts tasks and flushes."""
    daemon = DaemonProcess(tmp_path, "--debounce-ms", "60000")
    proc = subprocess.Popen(
        daemon.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=daemon.env
    )
    try:
        wait_until(lambda: _answers(daemon), 20, "the daemon answers ping")
        messages = [
            {"role": "user" if n % 2 == 0 else "assistant", "content": f"message {n}"}
            for n in range(10)
        ]
        compacted = daemon.call(
            "compact", {"task": "kept", "messages": messages, "keep": "none", "ts": 1}
        )
        assert compacted.ok
        assert proc.stdout is not None
        proc.stdout.close()  # every later log line fails with EPIPE
        refused = daemon.call("inspect", {"task": "../x"})  # logged as refused
        assert (refused.ok, refused.code) == (False, "invalid_task_id")
        started = daemon.call("inspect", {"task": "fresh"})  # logs actor_started
        assert started.ok
        assert daemon.call("ping").ok
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    written = json.loads((daemon.task_dir("kept") / "ctxwin.json").read_text())
    assert compacted.result is not None
    assert written["deleted_range"] == compacted.result["deleted_range"] == [2, 9]


def _answers(daemon: DaemonProcess) -> bool:
    try:
        return daemon.call("ping", timeout=0.5).ok
    except TimeoutError:
        return False
