"""The ``ctxwin`` command line against the real daemon: commands, output, exit codes, replay."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ctxwin import proto
from ctxwin.client import Client
from ctxwin.client.cli import main
from ctxwin.client.cli._plot import plot_problem
from ctxwin.client.cli.replay._command import _Bar
from tests._client_data import conversation, read_file_result
from tests._client_fake import FakeRouter, error, ok
from tests._corpus import corpus_param
from tests._daemon import DaemonFactory, DaemonProcess
from tests._shapes import conversation_file
from tests.test_auto_wire import render

REAL_TASK = "mra-api_conversation_history.json"
CLINE_TASKS = ["cline_task.json", corpus_param(REAL_TASK)]
"""A synthetic Cline task with the provider's usage in metrics.tokens, and the real one."""


@pytest.fixture(scope="module")
def shared(daemon_factory: DaemonFactory) -> DaemonProcess:
    """The shared daemon for the command-line tests."""
    return daemon_factory()


def run(*argv: str) -> tuple[int, str, str]:
    """Run ``ctxwin`` in-process; return (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_ping_prints_version_and_exits_0(shared: DaemonProcess) -> None:
    """``ping`` reports the daemon's version and protocol."""
    code, out, _ = run("--endpoint", shared.endpoint, "ping")
    assert 0 == code
    assert out.startswith(f"pong from {shared.endpoint}: ctxwind 0.1.0, protocol 1")
    code, out, _ = run("--endpoint", shared.endpoint, "ping", "--json")
    assert (0, True, 1) == (code, json.loads(out)["pong"], json.loads(out)["proto"])


def test_stats_as_table_and_json(shared: DaemonProcess) -> None:
    """``stats`` prints every counter, as a table or JSON."""
    code, out, _ = run("--endpoint", shared.endpoint, "stats")
    assert 0 == code
    assert {"actors", "flushes", "requests", "tasks", "uptime_s", "write_failures"} <= {
        line.split()[0] for line in out.splitlines()[1:]
    }
    code, out, _ = run("--endpoint", shared.endpoint, "--json", "stats")
    assert 0 == code
    stats = json.loads(out)
    assert stats["requests"] >= 1
    assert {"histories", "history_bytes", "calibrated_tasks", "calibration_median"} <= set(stats)


def _history_file(tmp_path: Path, messages: list[dict[str, Any]]) -> Path:
    path = tmp_path / "api_conversation_history.json"
    path.write_text(json.dumps(messages))
    return path


def test_inspect_shows_overlay_range_and_savings(shared: DaemonProcess, tmp_path: Path) -> None:
    """``inspect`` lists overlay blocks, the range and, given the messages, what they save."""
    messages = conversation(1)
    for copy in range(3):
        messages.append(read_file_result("a.py", f"copy {copy}\n" + "line\n" * 500))
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "ok"}]})
    with Client(shared.endpoint) as client:
        client.optimize_file_reads("cli-inspect", messages, ts=7)
        client.compact("cli-inspect", messages, "quarter", ts=8)
    code, out, _ = run("--endpoint", shared.endpoint, "inspect", "cli-inspect")
    assert 0 == code
    assert "task cli-inspect: range [2, 7] (6 messages hidden)" in out
    assert "calibration 1.000 reported/estimated tokens (0 reports); no kept history" in out
    assert "read_file" in out
    assert "notice" in out
    history = _history_file(tmp_path, messages)
    code, out, _ = run(
        "--endpoint", shared.endpoint, "inspect", "cli-inspect", "--messages", str(history)
    )
    assert 0 == code
    assert "overlay saves" in out
    # A rollback to a range past the end of the history the task was last sent is refused.
    code, _, err = run(
        "--endpoint", shared.endpoint, "rollback", "cli-inspect", "9", "--range", "2", "1000"
    )
    assert 1 == code
    assert "deleted_range [2, 1000] reaches past the task's history, which has 10" in err
    # Taken as it is by a daemon that has not seen the history since it loaded the task, a
    # range past its end hides only what exists of it.
    with Client(shared.endpoint) as client:
        client.close_task("cli-inspect")
        client.rollback("cli-inspect", 9, deleted_range=[2, 1000])
    code, out, _ = run(
        "--endpoint", shared.endpoint, "inspect", "cli-inspect", "--messages", str(history)
    )
    assert f"range [2, 1000] ({len(messages) - 2} messages hidden" in out
    with Client(shared.endpoint) as client:
        client.rollback("cli-inspect", 9, deleted_range=[2, 7])
    code, out, _ = run(
        "--endpoint",
        shared.endpoint,
        "inspect",
        "cli-inspect",
        "--json",
        "--messages",
        str(history),
    )
    data = json.loads(out)
    assert [2, 7] == data["deleted_range"]
    assert {"notice", "read_file"} == {block["edit"] for block in data["blocks"]}
    # The replaced reads (messages 4 and 6) are hidden by the range: the range saves them
    # (hidden_chars), the overlay does not save them a second time.
    hidden = [block for block in data["blocks"] if block["hidden"]]
    assert [(4, None), (6, None)] == [(block["message"], block["saved"]) for block in hidden]
    shown = [block["saved"] for block in data["blocks"] if not block["hidden"]]
    assert sum(shown) == data["overview"]["overlay_chars_saved"] < 0  # the notices only
    with Client(shared.endpoint) as client:
        client.rollback("cli-inspect", 9, deleted_range=[2, 3])
    code, out, _ = run(
        "--endpoint", shared.endpoint, "inspect", "cli-inspect", "--messages", str(history)
    )
    assert 0 == code
    saved = int(out.split("overlay saves ")[1].split(" chars")[0].replace(",", ""))
    assert saved > 2000  # both replaced reads are sent now


def test_inspect_json_keeps_the_summary_the_view_carries(shared: DaemonProcess) -> None:
    """``--json inspect`` of a condensed task gives the daemon's ``summary`` as it is."""
    model: Any = {"id": "small-model", "context_window": 16000}
    with Client(shared.endpoint) as client:
        messages = conversation(12)
        for message in messages[2:]:
            message["content"][0]["text"] += " word" * 400
        done = client.condense(
            "cli-condensed", messages, model, summary="Parser half done.", ts=5000
        )
        assert done["condensed"], done
        carried = client.inspect("cli-condensed")["summary"]
    code, out, err = run("--endpoint", shared.endpoint, "--json", "inspect", "cli-condensed")
    assert 0 == code, err
    data = json.loads(out)
    assert carried is not None
    assert "Parser half done." in carried["text"]
    assert carried == data["summary"]
    assert data["overview"]["hidden_messages"] > 0


def test_flush_rollback_close(shared: DaemonProcess) -> None:
    """``flush``, ``flush TASK``, ``rollback TASK TS [--range]`` and ``close TASK`` work."""
    with Client(shared.endpoint) as client:
        client.compact("cli-ops", conversation(10), "quarter", ts=500)
    base = ("--endpoint", shared.endpoint)
    assert 0 == run(*base, "flush")[0]
    code, out, _ = run(*base, "flush", "cli-ops")
    assert (0, "task cli-ops: nothing new to write\n") == (code, out)  # flush all wrote it
    code, out, _ = run(*base, "rollback", "cli-ops", "100", "--range", "2", "5")
    assert (0, "task cli-ops: removed 2 update(s) newer than 100\n") == (code, out)
    code, out, _ = run(*base, "--json", "inspect", "cli-ops")
    assert ([2, 5], []) == (json.loads(out)["deleted_range"], json.loads(out)["updates"])
    code, out, _ = run(*base, "close", "cli-ops", "--json")
    assert (0, {"closed": True, "loaded": True}) == (code, json.loads(out))


def test_close_and_flush_of_a_task_not_loaded_say_so(shared: DaemonProcess) -> None:
    """A task the daemon does not hold is neither "closed" nor "flushed" as if it had been."""
    base = ("--endpoint", shared.endpoint)
    code, out, _ = run(*base, "close", "cli-never-seen")
    assert (0, "task cli-never-seen: was not loaded, nothing to close\n") == (code, out)
    code, out, _ = run(*base, "--json", "close", "cli-never-seen")
    assert (0, {"closed": False, "loaded": False}) == (code, json.loads(out))  # closed nothing
    code, out, _ = run(*base, "flush", "cli-never-seen")
    assert (0, "task cli-never-seen: not loaded, nothing to write\n") == (code, out)
    code, out, _ = run(*base, "--json", "flush", "cli-never-seen")
    assert {"flushed": 0, "loaded": False} == json.loads(out)
    with Client(shared.endpoint) as client:
        client.compact("cli-seen", conversation(10), "quarter", ts=500)
        assert {"flushed": 1, "loaded": True} == client.flush("cli-seen")
    code, out, _ = run(*base, "close", "cli-seen")
    assert (0, "task cli-seen: closed (written first unless ephemeral)\n") == (code, out)


def test_stats_rounds_its_fractions(shared: DaemonProcess) -> None:
    """Fractional counters print with three decimals, not a float's seventeen digits."""
    code, out, _ = run("--endpoint", shared.endpoint, "stats")
    values = dict(line.split() for line in out.splitlines()[1:])
    assert 0 == code
    assert re.fullmatch(r"\d+\.\d{3}", values["uptime_s"]), values["uptime_s"]


def test_stats_prints_one_aligned_column_and_no_none(daemon: DaemonProcess) -> None:
    """Every value starts in one column; a value the daemon has none of yet is ``-``."""
    with Client(daemon.endpoint) as client:
        wire = client.stats()
    assert wire["calibration_median"] is None  # a fresh daemon: no task calibrated yet
    code, out, _ = run("--endpoint", daemon.endpoint, "stats")
    assert 0 == code
    lines = out.splitlines()
    column = lines[0].index("value")
    names = [line[:column].rstrip() for line in lines[1:]]
    flattened = [
        f"{name}.{key}" if isinstance(item, dict) else name
        for name, item in wire.items()
        for key in (item if isinstance(item, dict) else [""])
    ]
    assert flattened == names  # the daemon's order, a map's fields under its name
    assert all(line[column - 2 : column] == "  " and line[column] != " " for line in lines)
    assert "None" not in out
    assert "-" == lines[1 + names.index("calibration_median")][column:]
    assert str(daemon.state_dir / "tasks") == lines[1 + names.index("store.path")][column:]


def test_unreachable_daemon_exits_3_with_endpoint_and_hint(tmp_path: Path) -> None:
    """No socket, or a socket nobody answers on, exits 3 naming the endpoint and how to start."""
    missing = f"ipc://{tmp_path / 'none.sock'}"
    code, _, err = run("--endpoint", missing, "ping")
    assert 3 == code
    assert missing in err
    assert "ctxwind" in err
    assert "python3 dev.py daemon" in err
    stale = tmp_path / "stale.sock"
    stale.touch()
    code, _, err = run("--endpoint", f"ipc://{stale}", "--timeout", "0.3", "stats")
    assert 3 == code
    assert str(stale) in err


def test_daemon_errors_exit_1(tmp_path: Path) -> None:
    """An error reply from the daemon exits 1 and prints its code."""

    def handler(request: proto.Request) -> list[bytes]:
        return ok(request) if request.op == "ping" else error(request, "internal", "disk on fire")

    with FakeRouter(tmp_path, handler) as fake:
        code, _, err = run("--endpoint", fake.endpoint, "stats")
    assert 1 == code
    assert "internal: disk on fire" in err


def test_a_slow_answer_is_a_timeout_not_a_missing_daemon(tmp_path: Path) -> None:
    """A daemon that answered ping but not the command in time: said so, with --timeout."""

    def handler(request: proto.Request) -> list[bytes]:
        return ok(request) if request.op == "ping" else []  # still working on it

    with FakeRouter(tmp_path, handler) as fake:
        code, _, err = run("--endpoint", fake.endpoint, "--timeout", "0.5", "stats")
    assert 1 == code
    assert "no daemon answered" not in err
    assert "is up but did not answer within 0.5 s" in err
    assert "--timeout SECONDS" in err


def test_usage_errors_exit_2(shared: DaemonProcess, tmp_path: Path) -> None:
    """Bad task ids, bad numbers, missing arguments and unreadable files exit 2."""
    base = ("--endpoint", shared.endpoint)
    assert 2 == run(*base, "inspect", "../etc")[0]
    assert 2 == run(*base, "rollback", "t1", "soon")[0]
    assert 2 == run(*base, "rollback", "t1", "5", "--range", "3", "5")[0]
    assert 2 == run(*base)[0]
    assert 2 == run(*base, "replay", str(tmp_path / "missing.json"))[0]
    (tmp_path / "bad.json").write_text('{"not": "a list"}')
    assert 2 == run(*base, "replay", str(tmp_path / "bad.json"))[0]
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    code, _, err = run(*base, "replay", str(tmp_path / "deep.json"))
    assert (2, True) == (code, "nested too deeply" in err)
    assert 2 == run(*base, "rollback", "t1", str(2**64))[0]
    assert 2 == run(*base, "rollback", "t1", "5", "--range", "2", str(2**64))[0]
    code, _, err = run("--endpoint", "localhost:7878", "ping")
    assert (2, True) == (code, "localhost:7878" in err)


def test_replay_fails_fast_on_a_plot_it_cannot_write(shared: DaemonProcess, tmp_path: Path) -> None:
    """A --plot target in no directory, or of an unknown format, exits 2 before replaying."""
    history = _history_file(tmp_path, _replay_material())
    base = ("--endpoint", shared.endpoint, "replay", str(history), "--plot")
    code, out, err = run(*base, str(tmp_path / "absent" / "x.png"))
    assert (2, "", True) == (code, out, "no directory" in err)
    code, out, err = run(*base, str(tmp_path / "x.unknownext"))
    assert (2, "", True) == (code, out, ".png" in err)


def test_replay_into_a_live_persistent_task_is_refused(
    shared: DaemonProcess, tmp_path: Path
) -> None:
    """Without --keep, replaying into a task open as persistent exits 1 and changes nothing:
    the task stays loaded for the agent that holds it."""
    with Client(shared.endpoint) as client:
        client.compact("cli-live", conversation(10), "quarter", ts=1)
        before = client.inspect("cli-live")
        history = _history_file(tmp_path, _replay_material())
        code, _, err = run(
            "--endpoint", shared.endpoint, "replay", str(history), "--task", "cli-live"
        )
        assert (1, True) == (code, "persistent" in err)
        closed = client.close_task("cli-live")  # before inspect, which would load it again
        after = client.inspect("cli-live")
    assert (before["deleted_range"], before["updates"]) == (
        after["deleted_range"],
        after["updates"],
    )
    assert closed["loaded"], "the refused replay unloaded the live task"


def test_an_abstract_ipc_endpoint_is_not_taken_for_a_missing_socket(tmp_path: Path) -> None:
    """ipc://@name has no file to look for: the CLI asks the daemon there."""
    endpoint = f"ipc://@ctxwin-test-{os.getpid()}"
    with DaemonProcess(tmp_path, endpoint=endpoint):
        code, out, err = run("--endpoint", endpoint, "ping")
    assert (0, True) == (code, out.startswith(f"pong from {endpoint}")), err


def test_installed_script_reports_exit_codes(tmp_path: Path) -> None:
    """The ``ctxwin`` console script exits 3 when nothing listens and 2 on bad usage."""
    script = Path(sys.executable).with_name("ctxwin")
    missing = f"ipc://{tmp_path / 'none.sock'}"
    unreachable = subprocess.run(
        [script, "--endpoint", missing, "ping"], capture_output=True, text=True, check=False
    )
    assert 3 == unreachable.returncode
    assert 2 == subprocess.run([script, "frobnicate"], capture_output=True, check=False).returncode


def _replay_material() -> list[dict[str, Any]]:
    """Forty-three turns with big duplicate reads and no token metrics."""
    messages = conversation(1)
    for turn in range(40):
        messages.append(read_file_result("big.py", f"v{turn % 3}\n" + "code line\n" * 300))
        thoughts = f"thinking about step {turn} " * 60
        messages.append({"role": "assistant", "content": [{"type": "text", "text": thoughts}]})
    messages.append({"role": "user", "content": [{"type": "text", "text": "finish"}]})
    return messages


def test_replay_reports_events_with_estimated_usage(shared: DaemonProcess, tmp_path: Path) -> None:
    """Without metrics, usage is counted; a small window yields truncations and optimisations."""
    history = _history_file(tmp_path, _replay_material())
    base = ("--endpoint", shared.endpoint)
    code, out, err = run(
        *base, "replay", str(history), "--model-window", "8000", "--json", "--progress"
    )
    assert 0 == code, err
    report = json.loads(out)
    assert ("count_tokens", 43, 85) == (report["usage_source"], report["turns"], report["messages"])
    kinds = {event["kind"] for event in report["events"]}
    assert {"truncation", "optimisation"} == kinds
    for event in report["events"]:
        assert event["chars_saved"] > 0
        assert event["tokens_saved"] > 0
    truncations = [event for event in report["events"] if event["kind"] == "truncation"]
    assert report["final_range"] == truncations[-1]["deleted_range"]
    assert report["totals"]["messages_removed"] == sum(e["removed_messages"] for e in truncations)
    assert "43/43 turns" in err
    code, out, _ = run(*base, "replay", str(history), "--model-window", "8000")
    assert 0 == code
    assert "truncation" in out
    assert "optimisation" in out
    assert "final range [2, " in out


def test_replay_with_basic_summaries_condenses_and_lists_each_summary(
    shared: DaemonProcess, tmp_path: Path
) -> None:
    """--summaries basic cuts by summary only: each condense is listed with its size, the
    view after it is under half the trigger, and the text report shows them."""
    history = _history_file(tmp_path, _replay_material())
    base = ("--endpoint", shared.endpoint, "replay", str(history), "--model-window", "8000")
    code, out, err = run(*base, "--summaries", "basic", "--json")
    assert 0 == code, err
    report = json.loads(out)
    stored = [item for item in report["summaries"] if item["condensed"]]
    assert stored
    for item in stored:
        assert 0 < item["tokens"] < item["chars"]
        assert item["tokens_after"] <= 6000 / 2 < item["tokens_before"]  # 0.75 of 8000
    truncations = [event for event in report["events"] if event["kind"] == "truncation"]
    assert [item["range"] for item in stored] == [e["deleted_range"] for e in truncations]
    page = tmp_path / "page.html"
    code, out, _ = run(*base, "--summaries", "basic", "--html", str(page))
    assert 0 == code
    assert "view after" in out
    assert "stored" in out
    assert '<span class="badge summary">summary</span>' in page.read_text()


def test_inspect_shows_the_summary_a_task_view_carries(shared: DaemonProcess) -> None:
    """inspect prints the summary of a condensed task: kind, range, size and its first lines."""
    history = _replay_material()
    with Client(shared.endpoint) as client:
        done: Any = client.task("inspected-summary").condense(
            history, {"id": "m", "context_window": 8000}, summary="Goal: fix main().\nNext: test."
        )
    assert done["condensed"], done["reason"]
    code, out, _ = run("--endpoint", shared.endpoint, "inspect", "inspected-summary")
    assert 0 == code
    end = done["deleted_range"][1]
    assert f"summary (model, 1 stored): stands for messages [2, {end}], 29 chars" in out
    assert "  Goal: fix main()." in out


def _window(name: str) -> list[str]:
    """The real task replays at its model's window; the smaller synthetic one at 64k."""
    return [] if name == REAL_TASK else ["--model-window", "64000"]


@pytest.mark.parametrize("name", CLINE_TASKS)
def test_replay_of_a_cline_task_estimates_once_the_views_differ(
    shared: DaemonProcess, tmp_path: Path, name: str
) -> None:
    """Recorded usage while it is of ctxwin's view, then estimates; only the first calibrates."""
    source = conversation_file(name, tmp_path)
    history = json.loads(source.read_text(encoding="utf-8"))
    picture = tmp_path / "tokens.png"
    code, out, err = run(
        "--endpoint", shared.endpoint, "replay", str(source), *_window(name), "--json",
        "--plot", str(picture),
    )  # fmt: skip
    assert 0 == code, err
    report = json.loads(out)
    requests = sum(message["role"] == "user" for message in history)
    assert (len(history), requests, "metrics.tokens", "auto") == (
        report["messages"],
        report["turns"],
        report["usage_source"],
        report["usage_mode"],
    )
    assert report["totals"]["truncations"] >= 1
    assert report["totals"]["tokens_saved"] > (100_000 if name == REAL_TASK else 20_000)
    assert report["final_range"][0] == 2
    turns = report["per_turn"]
    assert all(turn["estimated"] > 0 for turn in turns)
    assert turns[-1]["reported"] is None  # the last request has no answer in the file
    first = report["estimated_from"]
    if name == REAL_TASK:
        # At 128k ctxwin first cuts at turn 41, where the recorded run cut its own view too
        # (its prompt falls from 97,679 to 48,018 tokens): from then on the figures differ.
        assert 41 == first
    assert report["differs"].startswith(f"from turn {first} ")
    recorded, estimated = turns[: first - 1], turns[first - 1 : -1]
    assert len(recorded) > 12, first
    assert estimated, first
    assert {"recorded"} == {turn["source"] for turn in recorded}
    assert {"estimated"} == {turn["source"] for turn in estimated}
    assert all(turn["reported"] is None and turn["recorded"] is not None for turn in estimated)
    warm = [turn for turn in recorded[10:] if turn["reported"]]
    errors = sorted(abs(turn["estimated"] / turn["reported"] - 1) for turn in warm)
    assert errors[len(errors) // 2] < 0.15, "calibrated estimates track the reported usage"
    frozen = estimated[0]["calibration"]  # the last recorded usage's, fed to this request
    assert frozen != 1.0
    assert all(abs(turn["calibration"] - frozen) < 0.005 for turn in estimated), (
        "an estimate fed back does not move the calibration"
    )
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert picture.stat().st_size > 10_000


@pytest.mark.parametrize("name", CLINE_TASKS)
def test_replay_per_turn_lists_every_turn(shared: DaemonProcess, tmp_path: Path, name: str) -> None:
    """--per-turn prints one row per turn under a single header, with each turn's usage source."""
    source = conversation_file(name, tmp_path)
    history = json.loads(source.read_text(encoding="utf-8"))
    requests = sum(message["role"] == "user" for message in history)
    code, out, _ = run(
        "--endpoint", shared.endpoint, "replay", str(source), *_window(name), "--per-turn"
    )
    assert 0 == code
    assert "final calibration" in out
    assert len([line for line in out.splitlines() if " est/rep " in line]) == 1
    rows = out.split(" est/rep ")[1].splitlines()[1:]
    assert [str(turn) for turn in range(1, requests + 1)] == [
        row.split()[0] for row in rows[:requests]
    ]
    found = re.search(r"usage: recorded in the file \(metrics\.tokens\) for turns 1-(\d+)", out)
    assert found is not None, out
    last = int(found[1])
    assert last == 40 or name != REAL_TASK
    assert "recorded" == rows[last - 1].split()[-1]
    assert "estimated" == rows[last].split()[-1]


def test_the_progress_bar_fits_a_narrow_terminal() -> None:
    """In 50 columns every redraw stays on one line shorter than the terminal."""
    stream = io.StringIO()
    bar = _Bar(stream, columns=50)
    for done in range(1, 223):
        bar(done, 222, [2, 151] if done > 150 else None)
    text = stream.getvalue()
    assert text.endswith("\n")
    assert text.count("\n") == 1
    frames = text.rstrip("\n").split("\r")[1:]
    assert 222 == len(frames)
    assert all(len(frame) == 49 for frame in frames), {len(frame) for frame in frames}
    assert frames[-1].rstrip().endswith("222/222 turns, range [2, 151]")
    assert "[" in frames[0]
    assert "#" in frames[-1]


def test_ctrl_c_during_a_replay_clears_the_progress_line(
    shared: DaemonProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted at turn 3, the bar's line is blanked and the message starts a clean line."""
    draw = _Bar.__call__

    def interrupted(bar: _Bar, done: int, total: int, deleted_range: Any) -> None:
        draw(bar, done, total, deleted_range)
        if done == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(_Bar, "__call__", interrupted)
    monkeypatch.setenv("COLUMNS", "60")
    history = _history_file(tmp_path, conversation(12))
    code, _, err = run("--endpoint", shared.endpoint, "replay", str(history), "--progress")
    assert 130 == code
    frames = err.split("\r")
    assert "3/" in frames[-3]  # the last frame drawn, then the blank, then the message
    assert (" " * 59, "ctxwin: interrupted\n") == (frames[-2], frames[-1])


def test_plot_without_matplotlib_names_the_readme_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without matplotlib, --plot suggests the install command the README gives."""
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    problem = plot_problem(tmp_path / "tokens.png")
    assert problem is not None
    assert "pip install './client[plot]'" in problem
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "pip install './client[plot]'" in readme


def test_a_failed_replay_closes_its_ephemeral_task(shared: DaemonProcess, tmp_path: Path) -> None:
    """A replay refused part way (here a message the daemon cannot take) leaves no task loaded."""
    messages = [*conversation(3), {"role": "user", "content": 5}]
    history = _history_file(tmp_path, messages)
    base = ("--endpoint", shared.endpoint)
    code, _, err = run(*base, "replay", str(history), "--task", "cli-refused")
    assert code in (1, 2), err
    assert "bad_request" in err
    code, out, _ = run(*base, "--json", "close", "cli-refused")
    assert {"closed": False, "loaded": False} == json.loads(out)


def test_inspect_writes_a_page_of_what_the_model_receives(
    shared: DaemonProcess, tmp_path: Path
) -> None:
    """inspect --html folds the hidden range and marks the notices of the task's view."""
    messages = conversation(1)
    for copy in range(4):
        messages.append(read_file_result("a.py", f"copy {copy}\n" + "line\n" * 200))
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "ok"}]})
    with Client(shared.endpoint) as client:
        client.compact("cli-page", messages, "quarter", ts=8)
    history = _history_file(tmp_path, messages)
    page = tmp_path / "page.html"
    base = ("--endpoint", shared.endpoint, "inspect", "cli-page")
    assert 2 == run(*base, "--html", str(page))[0]  # the page needs the messages
    code, out, _ = run(*base, "--messages", str(history), "--html", str(page))
    assert 0 == code
    assert f"page written to {page}\n" in out
    text = page.read_text(encoding="utf-8")
    with Client(shared.endpoint) as client:
        deleted_range = client.inspect("cli-page")["deleted_range"]
    assert deleted_range is not None
    last = deleted_range[1]
    chars = sum(len(message["content"][0]["text"]) for message in messages[2 : last + 1])
    assert f'<span id="fold-text">messages 2-{last} dropped, {chars:,} characters' in text
    assert '<span class="badge notice">notice</span>' in text  # message 0 and message 1
    assert "<link" not in text
    assert "<script src" not in text


def test_a_reader_that_goes_away_ends_the_output_quietly(shared: DaemonProcess) -> None:
    """``ctxwin stats | head`` with head gone: exit 141, no BrokenPipeError traceback."""
    ctxwin = str(Path(sys.executable).with_name("ctxwin"))
    argv = [ctxwin, "--endpoint", shared.endpoint, "stats"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        assert process.stdout is not None
        assert process.stderr is not None
        process.stdout.close()  # the reader leaves before anything is written
        err = process.stderr.read().decode()
        assert (141, "") == (process.wait(timeout=60), err)


def test_help_names_every_file_replay_reads(capsys: pytest.CaptureFixture[str]) -> None:
    """``ctxwin --help`` and ``replay --help`` name the four shapes, not only Cline's file."""
    assert 0 == run("--help")[0]
    commands = " ".join(capsys.readouterr().out.split())  # argparse wraps at the terminal width
    assert (
        "replay replay a saved conversation turn by turn (Cline, OpenAI, Anthropic, Gemini, "
        "Claude Code)" in commands
    )
    assert 0 == run("replay", "--help")[0]
    usage = " ".join(capsys.readouterr().out.split())  # argparse wraps at the terminal width
    for shape in (
        "Cline api_conversation_history.json",
        "messages (OpenAI Chat or Anthropic)",
        "input (OpenAI Responses)",
        "contents (Gemini)",
        "Claude Code JSONL session log",
    ):
        assert shape in usage


def test_inspect_of_a_task_that_does_not_exist_says_so_and_creates_nothing(
    shared: DaemonProcess, tmp_path: Path
) -> None:
    """``inspect`` of a task id never used: exit 1 naming it, no actor left running, no
    files written, even with ``--messages`` (which would send its history)."""
    history = _history_file(tmp_path, conversation())
    with Client(shared.endpoint) as client:
        before = client.stats()["actors"]
        code, _, err = run("--endpoint", shared.endpoint, "inspect", "never-made")
        assert (1, "ctxwin: task never-made does not exist") == (code, err.split(" (")[0])
        code, _, err = run(
            "--endpoint", shared.endpoint, "inspect", "never-made", "--messages", str(history)
        )
        assert 1 == code
        assert "does not exist" in err
        assert before == client.stats()["actors"]
        assert client.inspect("never-made")["exists"] is False
        assert before == client.stats()["actors"]
        client.prepare_request("made-now", conversation(), {"id": "m"})
        assert "exists" not in client.inspect("made-now")
    assert not (shared.state_dir / "tasks" / "never-made").exists()


def test_replay_does_not_take_a_recorded_usage_far_below_the_estimate(
    shared: DaemonProcess, tmp_path: Path
) -> None:
    """A file recording ``prompt: 10`` on every turn: the replay says those are no usage of
    the requests, uses the daemon's estimates, so the calibration stays and the window cuts,
    and the peak is the estimate's, not 10."""
    messages = _replay_material()
    for message in messages:
        if message["role"] == "assistant":
            message["metrics"] = {"tokens": {"prompt": 10, "completion": 5, "cached": 0}}
    history = _history_file(tmp_path, messages)
    base = ("--endpoint", shared.endpoint, "replay", str(history), "--model-window", "8000")
    code, out, err = run(*base, "--json")
    assert 0 == code, err
    report = json.loads(out)
    recorded = [row["turn"] for row in report["per_turn"] if row["recorded"] is not None]
    # The first two requests are short: 10 tokens may be theirs. Once ctxwin's view is
    # not the recorded run's, no recorded figure is used anyway.
    assert 3 == report["implausible"][0]
    assert recorded[2:] == sorted(
        {*report["implausible"], *(r["turn"] for r in report["per_turn"] if not r["agrees"])}
        & set(recorded)
    )
    later = report["per_turn"][2:]
    assert all(row["source"] in ("estimated", "none") for row in later)
    assert all(row["reported"] is None for row in later)
    assert report["per_turn"][-1]["calibration"] > 0.25
    assert any(event["kind"] == "truncation" for event in report["events"])
    assert report["peak_tokens"] > 1_000
    code, out, _ = run(*base)
    assert 0 == code
    assert "the file's metrics.tokens are far below the estimate of the same request" in out
    assert "turn 3: 10 recorded" in out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            json.dumps([{"ts": 1, "type": "say", "say": "text", "text": "hi"}] * 3),
            "this is Cline's ui_messages.json (the task's UI events, no model messages); "
            "replay the api_conversation_history.json next to it",
        ),
        ("[1, 2, 3]", "messages[0] is int, not a message object"),
        (
            json.dumps({"messages": [{"role": "user", "content": "hi"}, None]}),
            "messages[1] is null, not a message object",
        ),
        ("[]", "no model request in it"),
        ('{"type": "user"}\n{"type": "user", "mess\n', "(line 2, column 18: Unterminated string"),
    ],
)
def test_replay_refuses_a_file_it_cannot_replay_with_a_clear_error(
    shared: DaemonProcess, tmp_path: Path, text: str, expected: str
) -> None:
    """Files that hold no conversation to replay: exit 2 and one line saying why (the Cline
    UI file named as such, the message or line at fault by its own number), no traceback."""
    path = tmp_path / "conversation.json"
    path.write_text(text, encoding="utf-8")
    code, out, err = run("--endpoint", shared.endpoint, "replay", str(path))
    assert (2, "") == (code, out)
    assert expected in err
    assert "Traceback" not in err
    assert 1 == len(err.splitlines())


def test_replay_names_the_message_a_dialect_cannot_carry_by_its_own_index(
    shared: DaemonProcess, tmp_path: Path
) -> None:
    """A call without an id in message 3 of an Anthropic file is named messages[3], not by
    its place in a request of one message."""
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": [{"type": "tool_use"}]},
        {"role": "user", "content": "d"},
    ]
    path = tmp_path / "messages.json"
    path.write_text(json.dumps({"messages": messages}), encoding="utf-8")
    code, _, err = run("--endpoint", shared.endpoint, "replay", str(path))
    assert 1 == code
    assert "messages[3].content[0]" in err


def test_replay_leaves_out_the_last_line_of_a_log_being_written(
    shared: DaemonProcess, tmp_path: Path
) -> None:
    """A Claude Code log whose last line is cut short (no newline after it): the replay says
    so on stderr and replays the lines before it."""
    lines = [
        {"type": "user", "message": {"role": "user", "content": "fix it"}},
        {"type": "assistant", "message": {"id": "a1", "role": "assistant", "content": "ok"}},
        {"type": "user", "message": {"role": "user", "content": "go on"}},
    ]
    text = "\n".join(json.dumps(line) for line in lines)
    path = tmp_path / "session.jsonl"
    path.write_text(text + '\n{"type": "assistant", "message": {"role": "assis', encoding="utf-8")
    code, out, err = run("--endpoint", shared.endpoint, "--json", "replay", str(path))
    assert 0 == code, err
    assert (3, 2) == (json.loads(out)["messages"], json.loads(out)["turns"])
    assert "the last line (line 4, column 43: Unterminated string" in err
    assert "left out" in err


def test_replay_uses_the_published_window_of_the_model_the_file_names(
    shared: DaemonProcess, tmp_path: Path
) -> None:
    """The window of the model a file names (a Claude Code log's ``message.model``, an
    object's ``model``), said with where it came from; ``--model-window`` still wins; an
    unknown model gets the daemon's default, said as such."""
    lines = [
        {"type": "user", "message": {"role": "user", "content": "fix it"}},
        {
            "type": "assistant",
            "message": {"role": "assistant", "model": "<synthetic>", "content": "..."},
        },
        {
            "type": "assistant",
            "message": {
                "id": "a",
                "role": "assistant",
                "model": "claude-opus-4-6",
                "content": "ok",
            },
        },
        {"type": "user", "message": {"role": "user", "content": "go on"}},
    ]
    log = tmp_path / "session.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    chat = tmp_path / "chat.json"
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}]
    chat.write_text(json.dumps({"model": "gpt-4.1", "messages": messages}), encoding="utf-8")
    base = ("--endpoint", shared.endpoint, "--json", "replay")
    for path, model, window, source in (
        (log, "claude-opus-4-6", 200_000, "published for claude-opus-4-6"),
        (chat, "gpt-4.1", 1_047_576, "published for gpt-4.1"),
    ):
        code, out, err = run(*base, str(path))
        assert 0 == code, err
        report = json.loads(out)
        assert (model, window) == (report["model"]["id"], report["context_window"])
        assert report["window_source"].startswith(source)
    code, out, _ = run(*base, str(log), "--model-window", "50000")
    assert (0, 50_000) == (code, json.loads(out)["context_window"])
    assert "given with --model-window" == json.loads(out)["window_source"]
    code, out, _ = run("--endpoint", shared.endpoint, "replay", str(chat), "--model", "mine-1")
    assert 0 == code
    assert "model mine-1: window 128,000 (the daemon's default: the model is not a known" in out


def test_a_request_over_the_window_names_its_largest_message_and_what_would_prevent_it(
    shared: DaemonProcess, tmp_path: Path
) -> None:
    """A tool result far larger than the window arrives at once: the report names it (its
    history index, what it is, its tokens, that it was new) and what would have kept the
    request inside the window."""
    messages = conversation(3)
    huge = len(messages)
    messages.append(read_file_result("dump.log", "log line 1234\n" * 4000))
    messages.append({"role": "assistant", "content": [{"type": "text", "text": "seen"}]})
    messages.append({"role": "user", "content": [{"type": "text", "text": "go on"}]})
    history = _history_file(tmp_path, messages)
    base = ("--endpoint", shared.endpoint, "replay", str(history), "--model-window", "8000")
    code, out, err = run(*base, "--json")
    assert 0 == code, err
    report = json.loads(out)
    cause = report["over_window_cause"]
    assert report["over_window"]
    assert (huge, True) == (cause["index"], cause["new"])
    assert cause["turn"] in report["over_window"]
    assert "tool result as text" in cause["kind"]
    assert cause["message_tokens"] > 8_000
    assert 'strategy "auto"' in cause["prevent"]
    code, out, _ = run(*base)
    assert 0 == code
    assert f"largest message: #{huge}, user message: tool result as text" in out
    assert "new in that request" in out
    assert "capping the tool's output" in out


def test_replay_compares_strategies_by_their_cost(
    shared: DaemonProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--strategy with several names replays under each; --pricing prices every turn."""
    history = _history_file(tmp_path, _replay_material())
    base = ("--endpoint", shared.endpoint, "replay", str(history), "--model-window", "8000")
    code, out, err = run(*base, "--strategy", "default,auto", "--pricing", "anthropic", "--json")
    assert 0 == code, err
    reports = {report["strategy"]: report for report in json.loads(out)}
    assert set(reports) == {"default", "auto"}
    for report in reports.values():
        cache = report["cache"]
        turns = report["per_turn"]
        assert cache["cached_tokens"] == sum(t["cache"]["cached_tokens"] for t in turns)
        assert cache["cost"] == pytest.approx(
            1.25 * cache["written_tokens"] + 0.1 * cache["cached_tokens"], abs=0.5
        )
        assert report["pricing"] == "anthropic"
    assert reports["auto"]["over_window"] == []
    code, out, _ = run(*base, "--strategy", "default,fit,auto")
    assert 0 == code
    assert re.search(r"^auto +\d+ +0 ", out, re.MULTILINE), out
    code, out, _ = run(
        *base, "--strategy", "auto", "--pricing", '{"input": 1, "cache_write": 1, "cache_read": 1}'
    )
    assert 0 == code
    assert "strategy auto: " in out
    page = tmp_path / "auto.html"
    code, _, _ = run(*base, "--strategy", "auto", "--pricing", "anthropic", "--html", str(page))
    assert 0 == code
    shown = page.read_text()
    assert "cost vs sending everything" in shown
    assert re.search(r"cached, [\d,]+ written; cost so far [\d,]+ \(sending everything", shown)
    capsys.readouterr()
    code, _, _ = run(*base, "--strategy", "auto,cheapest")
    assert 2 == code
    assert "strategies are default, fit, auto" in capsys.readouterr().err
    code, _, _ = run(*base, "--pricing", "free")
    assert 2 == code
    assert "pricing must name a price sheet" in capsys.readouterr().err


def test_replay_and_inspect_name_the_deleted_set_beside_the_range(
    shared: DaemonProcess, tmp_path: Path
) -> None:
    """An ``auto`` replay's cuts name the deleted set after the range, as ``inspect`` of the
    task does, which counts the set's messages as hidden."""
    history = _history_file(tmp_path, render("cline", 40))
    base = ("--endpoint", shared.endpoint)
    code, out, err = run(
        *base, "replay", str(history), "--model-window", "12000", "--strategy", "auto",
        "--pricing", "anthropic", "--keep", "--task", "cli-set",
    )  # fmt: skip
    assert 0 == code, err
    assert re.search(r"^\d+ +\d+ +truncation +none, deleted set \[\d+, \d+\]", out, re.M), out
    with Client(shared.endpoint) as client:
        dropped = client.inspect("cli-set")["dropped"]
    code, out, _ = run(*base, "inspect", "cli-set")
    assert 0 == code
    shown = ", ".join(f"[{first}, {last}]" for first, last in dropped)
    hidden = sum(last - first + 1 for first, last in dropped)
    assert f"task cli-set: range none, deleted set {shown} ({hidden} messages hidden)" in out
