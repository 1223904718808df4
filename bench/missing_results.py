"""How many "result is missing" notices the views of a replayed conversation carry.

A conversation file (any shape ``ctxwin replay`` takes) is replayed through
a real ``ctxwind`` at each window given, as ``ctxwin replay`` does it
(``ctxwin.client.cli.replay.replay``). For every view sent: the number of
filled-in results (blocks or messages holding the task's missing-result
text) and of tool results of the history that answer a call the view sends
but that the view does not send; and whether the history's newest message is
in the view. Reported per window: views, notices in all, the most in one view,
results left out, and views without their newest message.

Usage: ``.venv/bin/python -m bench.missing_results FILE [--window 200000 --window 32000]
[--dialect D] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from ctxwin import engine
from ctxwin.client import Client
from ctxwin.client.cli._corpus import default_model, load_conversation
from ctxwin.client.cli.replay import ReplayOptions, ReplayReport, replay
from tests._daemon import DaemonProcess

MISSING = engine.DEFAULT_NOTICES.missing_result


def _sent(report: ReplayReport, history: list[Any], number: int) -> list[tuple[int, Any]]:
    """The messages of view ``number`` with their history index, as sent."""
    view = report.views[number]
    assert view.order is not None, "a native dialect's replay"
    out: list[tuple[int, Any]] = []
    for index, variant in view.order:
        if variant is None:
            out.append((index, history[index]))
        else:
            out.append((index, report.variants[variant].message))
    return out


def _results(value: Any, found: dict[str, bool]) -> None:
    """The results anywhere in ``value``: call id -> whether it is a filled-in one."""
    if isinstance(value, dict):
        for key in ("tool_call_id", "tool_use_id"):
            if isinstance(value.get(key), str):
                found[value[key]] = found.get(value[key], True) and MISSING in json.dumps(value)
                return
        if value.get("type") == "function_call_output" and isinstance(value.get("call_id"), str):
            found[value["call_id"]] = MISSING in json.dumps(value)
            return
        for item in value.values():
            _results(item, found)
    elif isinstance(value, list):
        for item in value:
            _results(item, found)


def _calls(message: Any) -> set[str]:
    """The ids of the calls an assistant message (or Responses call item) makes."""
    found: set[str] = set()
    if not isinstance(message, dict):
        return found
    if message.get("type") == "function_call" and isinstance(message.get("call_id"), str):
        found.add(message["call_id"])
    if message.get("role") != "assistant":
        return found
    for call in message.get("tool_calls") or []:
        if isinstance(call, dict) and isinstance(call.get("id"), str):
            found.add(call["id"])
    content = message.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                found.add(str(block.get("id")))
    return found


def measure(path: Path, window: int, dialect: str | None, endpoint: str) -> dict[str, Any]:
    """Replay ``path`` at ``window`` and count what its views fill in and leave out."""
    history, found_dialect = load_conversation(path)
    dialect = dialect or found_dialect
    # Where each real result stands in the history, by the call it answers.
    answered: dict[str, int] = {}
    for index, message in enumerate(history):
        found: dict[str, bool] = {}
        _results(message, found)
        for call in found:
            answered.setdefault(call, index)
    with Client(endpoint, timeout=120) as client:
        report = replay(
            client,
            history,
            default_model(history, window),
            ReplayOptions(task_id=f"missing-{window}", dialect=dialect, file=path.name),
        )
    notices: list[int] = []
    left_out = 0
    without_newest = 0
    for turn in report.per_turn:
        sent = _sent(report, history, turn.view)
        notices.append(sum(json.dumps(message).count(MISSING) for _, message in sent))
        if turn.messages - 1 not in {index for index, _ in sent}:
            without_newest += 1
        calls: set[str] = set()
        real: set[str] = set()
        for _, message in sent:
            calls |= _calls(message)
            held: dict[str, bool] = {}
            _results(message, held)
            real |= {call for call, filled in held.items() if not filled}
        left_out += sum(
            1 for call in calls - real if answered.get(call, turn.messages) < turn.messages
        )
    return {
        "file": path.name,
        "window": window,
        "views": len(notices),
        "notices": sum(notices),
        "most_in_one_view": max(notices, default=0),
        "results_left_out": left_out,
        "views_without_newest": without_newest,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--window", type=int, action="append")
    parser.add_argument("--dialect")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    windows = args.window or [200_000, 32_000]
    rows = []
    with tempfile.TemporaryDirectory() as root, DaemonProcess(Path(root)) as daemon:
        for window in windows:
            rows.append(measure(args.file, window, args.dialect, daemon.endpoint))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print("window   views  notices  most in one view  results left out  views without newest")
    for row in rows:
        print(
            f"{row['window']:>7,}  {row['views']:>5}  {row['notices']:>7}  "
            f"{row['most_in_one_view']:>16}  {row['results_left_out']:>16}  "
            f"{row['views_without_newest']:>20}"
        )


if __name__ == "__main__":
    main()
