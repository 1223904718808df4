"""The command line says exactly what happened: refusals, wording, labels, read-only inspect."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from ctxwin import proto
from ctxwin.client import Client
from ctxwin.engine._auto_edits import _stub
from tests._client_data import conversation, read_file_result
from tests._daemon import DaemonFactory, DaemonProcess
from tests.test_cli import run


@pytest.fixture(scope="module")
def exact(daemon_factory: DaemonFactory) -> DaemonProcess:
    return daemon_factory()


def write(tmp_path: Path, name: str, data: Any) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def cline_material(turns: int = 40) -> list[dict[str, Any]]:
    """A Cline task of ``turns`` requests, each with a sizeable result and answer."""
    messages = conversation(1)
    for turn in range(turns):
        messages.append(read_file_result(f"f{turn}.py", "code line\n" * 200))
        text = f"thinking about step {turn} " * 40
        messages.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
    messages.append({"role": "user", "content": [{"type": "text", "text": "finish"}]})
    return messages


def _call(call_id: str, path: str) -> dict[str, Any]:
    arguments = json.dumps({"path": path})
    return {"id": call_id, "type": "function", "function": {"name": "read", "arguments": arguments}}


def split_calls(rounds: int = 6) -> list[dict[str, Any]]:
    """A Chat conversation whose parallel calls are split over two assistant messages, as
    logs converted from other agents have them."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read both files, each round."}]
    for round_ in range(rounds):
        first, second = f"a{round_}", f"b{round_}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [_call(first, "a")]})
        messages.append({"role": "assistant", "content": None, "tool_calls": [_call(second, "b")]})
        messages.append({"role": "tool", "tool_call_id": first, "content": "a\n" * 300})
        messages.append({"role": "tool", "tool_call_id": second, "content": "b\n" * 300})
    messages.append({"role": "assistant", "content": "Both read."})
    return messages


# Refusals -------------------------------------------------------------------


def test_rollback_of_a_task_that_does_not_exist_is_refused_and_creates_nothing(
    exact: DaemonProcess,
) -> None:
    """rollback of an unknown task exits 1 with a clear message; inspect still finds nothing."""
    code, out, err = run("--endpoint", exact.endpoint, "rollback", "no-such-task", "0")
    assert (1, "") == (code, out)
    assert "task no-such-task does not exist (nothing stored, not loaded)" in err
    code, _, err = run("--endpoint", exact.endpoint, "inspect", "no-such-task")
    assert 1 == code
    assert "does not exist" in err
    with Client(exact.endpoint) as client:
        client.flush()
    assert not exact.task_dir("no-such-task").exists()


def test_a_rollback_range_past_the_history_is_refused_in_every_dialect(
    exact: DaemonProcess,
) -> None:
    """A range ending past the last message the task was sent is refused, nothing persisted."""
    with Client(exact.endpoint) as client:
        task = client.task("past-the-end", dialect="openai-chat", delta=False)
        history = split_calls(2)
        task.truncated_messages(history)
        code, _, err = run(
            "--endpoint", exact.endpoint, "rollback", "past-the-end", "0", "--range", "2", "9999"
        )
        assert 1 == code
        assert "deleted_range [2, 9999] reaches past the task's history" in err
        assert task.inspect()["deleted_range"] is None
        client.close_task("past-the-end")


@pytest.mark.parametrize("window", ["0", "-5"])
def test_a_window_that_is_not_positive_is_a_usage_error(
    exact: DaemonProcess, tmp_path: Path, window: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--model-window 0 or below exits 2 before any replay (argparse writes to stderr)."""
    path = write(tmp_path, "h.json", cline_material(2))
    code, out, _ = run(
        "--endpoint", exact.endpoint, "replay", str(path), f"--model-window={window}"
    )
    assert (2, "") == (code, out)
    assert "argument --model-window: must be" in capsys.readouterr().err


def test_a_cut_that_removes_nothing_is_no_truncation(exact: DaemonProcess, tmp_path: Path) -> None:
    """A window so small that the first cut can remove nothing lists no [2, 1] truncation."""
    material = cline_material(6)
    material[0] = {"role": "user", "content": [{"type": "text", "text": "the task " * 2000}]}
    path = write(tmp_path, "h.json", material)
    code, out, err = run(
        "--endpoint", exact.endpoint, "replay", str(path), "--model-window", "1000"
    )
    assert 0 == code, err
    assert "truncation" in out
    assert "[2, 1]" not in out


# Wording --------------------------------------------------------------------


def test_the_report_says_what_each_column_and_count_is(
    exact: DaemonProcess, tmp_path: Path
) -> None:
    """The events table's history column, an ordinal for the sample, the last request's
    messages of its own history, and the page's card agreeing with its picker."""
    material = cline_material(40)
    path = write(tmp_path, "h.json", material)
    page = tmp_path / "page.html"
    code, out, err = run(
        "--endpoint", exact.endpoint, "replay", str(path), "--model-window", "16000",
        "--html", str(page),
    )  # fmt: skip
    assert 0 == code, err
    assert re.search(r"^turn +history +event +range", out, flags=re.M)
    assert re.search(r"^turn +sent +estimated +reported", out, flags=re.M)
    assert "(every 2nd turn and events; --per-turn for all)" in out
    assert "th turn" not in out
    found = re.search(r"the last request \(turn 43\) sent (\d+) of its (\d+) messages", out)
    assert found is not None
    sent, made_of = found.groups()
    assert int(made_of) == len(material)  # the last request comes after the last message
    html = page.read_text()
    assert f'<div class="value">{sent} of {made_of}</div>' in html
    assert f"{sent} of {made_of} messages sent" in html


def test_messages_merged_into_one_are_not_dropped(exact: DaemonProcess, tmp_path: Path) -> None:
    """Split calls the view sends as one message are not listed as dropped."""
    path = write(tmp_path, "split.json", {"model": "gpt-4o", "messages": split_calls()})
    page = tmp_path / "page.html"
    code, out, err = run("--endpoint", exact.endpoint, "replay", str(path), "--html", str(page))
    assert 0 == code, err
    assert "no truncation or optimisation happened" in out
    assert "dropped" not in page.read_text()
    code, out, _ = run("--endpoint", exact.endpoint, "--json", "replay", str(path))
    assert [] == [view["added"] for view in json.loads(out)["views"] if view.get("added")]


def test_summaries_are_events_of_the_page(exact: DaemonProcess, tmp_path: Path) -> None:
    """Each condense of --summaries basic is a row of the page's Events."""
    path = write(tmp_path, "h.json", cline_material(40))
    page = tmp_path / "page.html"
    code, out, err = run(
        "--endpoint", exact.endpoint, "replay", str(path), "--model-window", "16000",
        "--summaries", "basic", "--html", str(page),
    )  # fmt: skip
    assert 0 == code, err
    stored = len(re.findall(r"^\d+ +stored ", out, flags=re.M))
    assert stored >= 1
    html = page.read_text()
    assert stored == html.count('<tr class="event summary">')
    assert "summary of messages [2, " in html


def test_an_edit_is_labelled_by_what_it_did(exact: DaemonProcess, tmp_path: Path) -> None:
    """A result auto shortened reads shortened, a stubbed one stubbed, not "no file read" (nor
    "file read replaced" on the page)."""
    assert "stubbed" == proto.edit_label(proto.EDIT_NO_FILE_READ, _stub("bash", {"c": 1}, 900))
    assert "read_file" == proto.edit_label(proto.EDIT_READ_FILE, "[ctxwin] This copy ...")
    messages = conversation(1)
    messages.append(read_file_result("huge.log", "a log line that goes on\n" * 6000))
    with Client(exact.endpoint) as client:
        task = client.task("labelled")
        model: Any = {"id": "m", "context_window": 16000}
        task.prepare_request(messages, model, strategy="auto")
        code, out, _ = run("--endpoint", exact.endpoint, "inspect", "labelled")
        page = tmp_path / "page.html"
        path = write(tmp_path, "h.json", messages)
        paged = run(
            "--endpoint", exact.endpoint, "inspect", "labelled", "--messages", str(path),
            "--html", str(page),
        )  # fmt: skip
        client.close_task("labelled")
    assert 0 == code
    assert re.search(r"^4 +0 +shortened ", out, flags=re.M), out
    assert "no file read" not in out
    assert 0 == paged[0], paged[2]
    html = page.read_text()
    assert 1 == html.count('<span class="kind">shortened</span>')  # the event
    assert 2 == html.count('<span class="badge read">shortened</span>')  # legend, message
    assert 1 == html.count(">file read replaced</span>")  # the legend's only


# Read-only inspect ----------------------------------------------------------


def _state(client: Client, task: str) -> dict[str, Any]:
    shown: Any = client.inspect(task)
    keys = ("updates", "deleted_range", "dirty", "calibration", "history", "summaries")
    return {key: shown.get(key) for key in keys}


@pytest.mark.parametrize("dialect", ["cline", "openai-chat"])
def test_inspect_changes_nothing_of_what_it_looks_at(
    exact: DaemonProcess, tmp_path: Path, dialect: str
) -> None:
    """inspect --messages --html, with the task's history or a rewound one, leaves the task's
    overlay, range, dirty flag, calibration, kept history and stored file as they were."""
    task_id = f"read-only-{dialect}"
    if dialect == "cline":
        history: Any = cline_material(12)
        path = write(tmp_path, "h.json", history)
    else:
        history = split_calls(8)
        path = write(tmp_path, "h.json", {"model": "gpt-4o", "messages": history})
    with Client(exact.endpoint) as client:
        task = client.task(task_id, dialect=None if dialect == "cline" else dialect, delta=False)
        task.compact(history, "quarter", ts=5)
        client.flush(task_id)
        stored = (exact.task_dir(task_id) / "ctxwin.json").read_bytes()
        before = _state(client, task_id)
        assert before["deleted_range"] is not None
        rewound = write(tmp_path, "rewound.json", history[:3] if dialect == "cline" else {
            "model": "gpt-4o", "messages": history[:3]
        })  # fmt: skip
        for given in (path, rewound):
            code, _, err = run(
                "--endpoint", exact.endpoint, "inspect", task_id, "--messages", str(given),
                "--html", str(tmp_path / "page.html"),
            )  # fmt: skip
            assert 0 == code, err
            assert ("starts the task over" in err) == (given == rewound)
            assert before == _state(client, task_id)
        client.flush(task_id)
        assert stored == (exact.task_dir(task_id) / "ctxwin.json").read_bytes()
        client.close_task(task_id)


# No daemon ------------------------------------------------------------------


def test_no_daemon_is_said_once_for_a_command_line_user(tmp_path: Path) -> None:
    """The endpoint and how to start a daemon, once; no library advice."""
    stale = tmp_path / "stale.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(stale))
    listener.close()  # a socket file nothing listens on
    for endpoint in (f"ipc://{tmp_path / 'none.sock'}", f"ipc://{stale}"):
        code, _, err = run("--endpoint", endpoint, "--timeout", "0.5", "ping")
        assert 3 == code
        assert 1 == err.count(endpoint), err
        assert 1 == err.count("ctxwind"), err
        assert "python3 dev.py daemon" in err
        assert "autostart" not in err
