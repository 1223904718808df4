"""ctxwind's log format choice and what its events leave out."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from ctxwin.daemon._logging import choose_format
from tests._daemon import DaemonProcess

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
