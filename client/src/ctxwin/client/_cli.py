"""``ctxwin``: operate a running ``ctxwind`` from the command line.

Exit codes: 0 ok, 1 the daemon answered with an error, 2 usage error,
3 the daemon is not reachable, 141 the reader of the output went away.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from ctxwin import proto

from . import _autostart, _keys
from ._core import DEFAULT_TIMEOUT
from ._corpus import About, load_conversation
from ._errors import AuthenticationError, CtxwinError, DaemonUnavailableError
from ._page import inspect_page, page_problem, replay_page, write_page
from ._plot import plot, plot_problem
from ._replay import (
    USAGE_MODES,
    NativeViews,
    ReplayReport,
    ReplayTurn,
    Variant,
    ViewState,
    chars_of,
    load_history,
    message_chars,
    message_tokens,
    model_for,
    no_request,
    parse_sources,
    parse_updates,
    replay,
    request_points,
    text_of,
    usage_line,
    view_state,
)
from ._sync import Client
from ._task import Task

EXIT_OK = 0
EXIT_DAEMON_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_BROKEN_PIPE = 141
"""What a shell reports for a writer stopped by SIGPIPE (128 + 13): the reader left early."""

_PROBE_TIMEOUT = 5.0


CONVERSATION_SHAPES = (
    "the conversation: a Cline api_conversation_history.json (a JSON list of messages); "
    "a JSON object holding messages (OpenAI Chat or Anthropic), input (OpenAI Responses) "
    "or contents (Gemini); or a Claude Code JSONL session log"
)
"""The files ``replay`` and ``inspect --messages`` read (``ctxwin.client._corpus``)."""


class UsageError(Exception):
    """A problem with what was asked, found before or after talking to the daemon."""


def _task_id(value: str) -> str:
    if not proto.is_valid_task_id(value):
        raise argparse.ArgumentTypeError(
            f"invalid task id {value!r} (expected ^{proto.TASK_ID_PATTERN.pattern}$)"
        )
    return value


def _non_negative_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value!r}")
    return number


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value!r}")
    return number


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``ctxwin``."""
    parser = argparse.ArgumentParser(
        prog="ctxwin",
        description="Operate a running ctxwind (the ctxwin context-window daemon).",
        epilog=(
            "Exit codes: 0 ok, 1 daemon error, 2 usage error, 3 daemon not reachable, "
            "141 output reader gone."
        ),
    )
    parser.add_argument(
        "--endpoint",
        help=f"daemon endpoint (default: ${proto.ENDPOINT_ENV}, else {proto.default_endpoint()})",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds to wait for each reply (default {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument(
        "--server-key",
        metavar="KEY|FILE",
        help=f"pin the daemon's public key: TCP then uses CURVE (default: ${proto.SERVER_KEY_ENV})",
    )
    parser.add_argument(
        "--client-key",
        metavar="FILE",
        help=f"this client's key pair, a .key_secret file (default: ${proto.CLIENT_KEY_ENV}, "
        "else client.key_secret in the keys directory)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    json_flag = argparse.ArgumentParser(add_help=False)
    json_flag.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    commands.add_parser("ping", parents=[json_flag], help="check that the daemon answers")
    _keys.add_parser(commands)
    commands.add_parser("stats", parents=[json_flag], help="the daemon's counters")

    inspect = commands.add_parser(
        "inspect", parents=[json_flag], help="a task's overlay, deleted range and savings"
    )
    inspect.add_argument("task", type=_task_id, metavar="TASK")
    inspect.add_argument(
        "--messages",
        type=Path,
        metavar="FILE",
        help="the task's conversation, in any shape replay reads, to compute what the "
        "overlay saves",
    )
    inspect.add_argument(
        "--html",
        type=Path,
        metavar="FILE.html",
        help="with --messages: write a page of the conversation as the model now receives it",
    )
    inspect.add_argument(
        "--dialect",
        choices=proto.DIALECTS,
        help="the task's message dialect, for --messages (default: from the file's shape)",
    )

    flush = commands.add_parser(
        "flush", parents=[json_flag], help="write a task (or all tasks) to disk now"
    )
    flush.add_argument("task", type=_task_id, nargs="?", metavar="TASK")

    rollback = commands.add_parser(
        "rollback", parents=[json_flag], help="drop a task's overlay updates newer than TS"
    )
    rollback.add_argument("task", type=_task_id, metavar="TASK")
    rollback.add_argument("ts", type=_non_negative_int, metavar="TS", help="milliseconds")
    rollback.add_argument(
        "--range",
        type=_non_negative_int,
        nargs=2,
        metavar=("START", "END"),
        help="also set the deleted range the checkpoint had",
    )

    close = commands.add_parser("close", parents=[json_flag], help="flush a task and unload it")
    close.add_argument("task", type=_task_id, metavar="TASK")

    play = commands.add_parser(
        "replay",
        parents=[json_flag],
        help="replay a saved conversation turn by turn (Cline, OpenAI, Anthropic, Gemini, "
        "Claude Code)",
        description=(
            "Replay a saved conversation through the running daemon as an agent would, "
            "then list every truncation and optimisation with what it saved."
        ),
    )
    play.add_argument(
        "file",
        type=Path,
        metavar="FILE",
        help=CONVERSATION_SHAPES,
    )
    play.add_argument(
        "--dialect",
        choices=proto.DIALECTS,
        help="the conversation's message dialect (default: from the file's shape: a Cline "
        "array, an object with messages, input or contents, a Claude Code JSONL log)",
    )
    play.add_argument(
        "--model-window",
        type=_non_negative_int,
        metavar="N",
        help="the model's context window in tokens (default: the one published for the "
        "file's model, else the daemon's, 128000)",
    )
    play.add_argument("--model", metavar="ID", help="model id (default: from the file)")
    play.add_argument("--provider", help="provider id (default: from the file)")
    play.add_argument(
        "--task", type=_task_id, metavar="ID", help="task id to replay into (default: fresh)"
    )
    play.add_argument(
        "--keep",
        action="store_true",
        help="keep the task: persistent and not closed at the end (default: ephemeral)",
    )
    play.add_argument(
        "--per-turn", action="store_true", help="list every turn's estimate, not a sample"
    )
    play.add_argument(
        "--summaries",
        choices=("basic",),
        help="cut by summary as an auto-condensing agent does: when a summary is due, "
        "condense with ctxwin's basic summary (listed with its size)",
    )
    play.add_argument(
        "--usage",
        choices=USAGE_MODES,
        default="auto",
        help=(
            "each turn's usage: as recorded in the file, the daemon's estimate of ctxwin's "
            "own view, or auto (default): recorded while ctxwin's view is the recorded "
            "run's, estimated from the first turn it differs"
        ),
    )
    play.add_argument(
        "--html",
        type=Path,
        metavar="FILE.html",
        help="write a page: tokens per turn, the events, and what the model saw on each turn",
    )
    play.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="draw tokens per turn and the cuts (needs matplotlib: pip install './client[plot]')",
    )
    play.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    play.add_argument(
        "--strategy",
        type=_strategies,
        default=["default"],
        metavar="NAME[,NAME...]",
        help="the strategy of every request: default (SPEC.md), fit or auto; several, "
        "comma-separated, replay the conversation under each and compare them "
        "(docs/STRATEGIES.md)",
    )
    play.add_argument(
        "--pricing",
        type=_pricing,
        metavar="SHEET|JSON",
        help="the price sheet each turn's cache figures use: "
        + ", ".join(proto.PRICE_SHEETS)
        + ', or \'{"input": 1, "cache_write": 1.25, "cache_read": 0.1}\' '
        "(default: the model's; docs/PRICING.md)",
    )
    return parser


def _strategies(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in proto.STRATEGY_VALUES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"strategies are {', '.join(proto.STRATEGY_VALUES)} (got {value!r})"
        )
    return names


def _pricing(value: str) -> Any:
    parsed: Any = value
    if value.lstrip().startswith("{"):
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    problem = proto.pricing_error(parsed)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"pricing {problem}")
    return parsed


def _print_json(data: Any, out: TextIO) -> None:
    out.write(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def _table(rows: Sequence[Sequence[object]], header: Sequence[str], out: TextIO) -> None:
    cells = [[str(cell) for cell in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for row in cells:
        line = "  ".join(
            cell.ljust(width) if i == 0 or not _numeric(cell) else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        out.write(line.rstrip() + "\n")


def _numeric(cell: str) -> bool:
    return cell.replace(",", "").replace("-", "").replace(".", "").replace("%", "").isdigit()


def _range(deleted_range: Any) -> str:
    return "none" if not deleted_range else f"[{deleted_range[0]}, {deleted_range[1]}]"


# Commands. Each returns an exit code; results go to ``out``, progress to ``err``.


def _ping(client: Client, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    started = time.perf_counter()
    result = client.ping()
    elapsed_ms = (time.perf_counter() - started) * 1000
    if args.json:
        _print_json({**result, "endpoint": client.endpoint, "ms": round(elapsed_ms, 3)}, out)
    else:
        out.write(
            f"pong from {client.endpoint}: ctxwind {result['version']}, "
            f"protocol {result['proto']}, {elapsed_ms:.1f} ms\n"
        )
    return EXIT_OK


def _stats(client: Client, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    result = client.stats()
    if args.json:
        _print_json(result, out)
    else:
        # In the daemon's order, a map's fields as name.field; every value starts in one column.
        rows = [
            (f"{name}.{key}" if key else name, _stat(value))
            for name, item in result.items()
            for key, value in (item.items() if isinstance(item, dict) else [("", item)])
        ]
        width = max(len(name) for name, _ in [("counter", ""), *rows])
        for name, value in [("counter", "value"), *rows]:
            out.write(f"{name.ljust(width)}  {value}".rstrip() + "\n")
    return EXIT_OK


def _stat(value: object) -> str:
    """A counter as ``stats`` prints it: ``-`` for none (yet), thousands separated."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.3f}"
    if isinstance(value, list | dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _inspect(client: Client, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.html is not None:
        problem = page_problem(args.html) if args.messages else "--html needs --messages FILE"
        if problem is not None:
            raise UsageError(problem)
    history, dialect = _inspect_history(args, err)
    result = client.inspect(args.task)
    if result.get("exists") is False:
        err.write(f"ctxwin: task {args.task} does not exist (nothing stored, not loaded)\n")
        return EXIT_DAEMON_ERROR
    view = None
    origins: list[int | None] | None = None
    if history is not None and dialect != "cline":
        # So that the daemon holds the mapped history and inspect names the sources; the
        # view comes as a patch, which says which history message each view message is.
        handle = Task(client, args.task, dialect=dialect)
        view = handle.truncated_messages(history)["messages"]
        origins = handle.view_origins()
        result = client.inspect(args.task)
    overlay = parse_updates(result["updates"])
    sources = parse_sources(result.get("sources", [])) if view is not None else None
    rows: list[dict[str, Any]] = []
    for (index, block), (edit_type, texts) in sorted(overlay.items()):
        row: dict[str, Any] = {
            "message": index,
            "block": block,
            "edit": proto.EDIT_TYPES.get(edit_type, str(edit_type)),
            "updates": len(texts),
            "chars": len(texts[-1]) if texts else 0,
            "saved": None,
        }
        if sources is not None:
            source = sources.get((index, block))
            if texts and source is not None:
                row["saved"] = len(source[1]) - len(texts[-1])
        elif history is not None and texts and index < len(history):
            content = history[index].get("content")
            blocks = content if isinstance(content, list) else []
            original = text_of(blocks[block]) if block < len(blocks) else None
            if original is not None:
                row["saved"] = len(original) - len(texts[-1])
        rows.append(row)
    deleted_range = result["deleted_range"]
    # Messages 2..end, within the history when its length is known (a range may
    # run past the end, or before its start, and then hides what exists of it).
    end = deleted_range[1] if deleted_range else 1
    length = len(history) if history is not None else result.get("history")
    if isinstance(length, int):
        end = min(end, length - 1)
    hidden = max(0, end - 1)
    hidden_chars = (
        sum(chars_of(history[i].get("content")) for i in range(2, 2 + hidden) if i < len(history))
        if history is not None
        else None
    )
    variants: list[Variant] = []
    state: ViewState | None = None
    if history is not None and view is not None and sources is not None:
        state = NativeViews(history, variants).state(
            view,
            origins if origins is not None else [None] * len(view),
            len(history),
            deleted_range,
            overlay,
            sources,
        )
        removed = state.removed(len(history))
        hidden = len(removed)
        hidden_chars = sum(message_chars(history[i], dialect) for i in removed)
    elif history is not None and args.html is not None:
        state = view_state(
            history,
            client.truncated_messages(args.task, history)["messages"],
            deleted_range,
            overlay,
            variants,
        )
    saved_values = [row["saved"] for row in rows if row["saved"] is not None]
    summary = {
        "task": args.task,
        "deleted_range": deleted_range,
        "hidden_messages": hidden,
        "hidden_chars": hidden_chars,
        "overlay_chars_saved": sum(saved_values) if history is not None else None,
        "dirty": result["dirty"],
    }
    if args.html is not None and history is not None and state is not None:
        counts = message_tokens(client, history, variants, dialect)
        page = inspect_page(args.task, history, state, variants, counts, rows, dialect)
        try:
            write_page(args.html, page)
        except OSError as exc:
            raise UsageError(f"--html: cannot write {args.html}: {exc}") from None
        if not args.json:
            out.write(f"page written to {args.html}\n")
    if args.json:
        # The daemon's "summary" (the one the view carries) is the last of "summaries".
        _print_json({**result, "summary": summary, "blocks": rows}, out)
        return EXIT_OK
    out.write(
        f"task {args.task}: range {_range(deleted_range)} ({hidden} messages hidden"
        + (f", {hidden_chars:,} chars" if hidden_chars is not None else "")
        + f"), {'unsaved changes' if result['dirty'] else 'saved'}\n"
    )
    if "store" in result:
        fence = result.get("fence")
        out.write(
            f"store {result['store']}, owner {result.get('owner') or '-'}"
            + (f", fence {fence}" if fence is not None else "")
            + "\n"
        )
    calibration = result.get("calibration")
    if calibration is not None:
        held = result.get("history")
        out.write(
            f"calibration {calibration['ratio']:.3f} reported/estimated tokens "
            f"({int(calibration['samples'])} reports); "
            + (
                f"{held} messages kept for delta sync\n"
                if held is not None
                else "no kept history\n"
            )
        )
    _write_summaries(result, out)
    if not rows:
        out.write("overlay: empty\n")
        return EXIT_OK
    out.write(f"overlay: {len({row['message'] for row in rows})} messages, {len(rows)} blocks\n")
    _table(
        [
            (
                row["message"],
                row["block"],
                row["edit"],
                row["updates"],
                f"{row['chars']:,}",
                "-" if row["saved"] is None else f"{row['saved']:,}",
            )
            for row in rows
        ],
        ("message", "block", "edit", "updates", "chars now", "chars saved"),
        out,
    )
    if history is not None:
        out.write(f"overlay saves {summary['overlay_chars_saved']:,} chars\n")
    else:
        out.write("(give --messages FILE to compute what the overlay saves)\n")
    return EXIT_OK


def _write_summaries(result: Mapping[str, Any], out: TextIO) -> None:
    """The summary the task's view carries, and how many are stored (docs/SUMMARIES.md)."""
    stored = result.get("summaries") or []
    if not stored:
        return
    shown = result.get("summary")
    if shown is None:
        out.write(f"summaries: {len(stored)} stored, none in the view (the range is below)\n")
        return
    out.write(
        f"summary ({shown['kind']}, {len(stored)} stored): stands for messages "
        f"{_range(shown['range'])}, {shown['chars']:,} chars, stored at ts {shown['ts']}\n"
    )
    for line in str(shown["text"]).splitlines()[:_SUMMARY_LINES]:
        out.write(f"  {line[:160]}\n")


_SUMMARY_LINES = 12


def _inspect_history(
    args: argparse.Namespace, err: TextIO
) -> tuple[list[dict[str, Any]] | None, str]:
    """``inspect --messages``: the history and its dialect (``--dialect``, else its shape)."""
    if not args.messages:
        return None, "cline"
    history, detected = _load_conversation(args.messages, err)
    dialect = args.dialect or detected
    if dialect == "cline":
        return _load(args.messages), dialect  # SPEC.md's messages, checked as such
    return history, dialect


def _flush(client: Client, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    result = client.flush(args.task)
    if args.json:
        _print_json(result, out)
    elif args.task and result.get("loaded") is False:
        out.write(f"task {args.task}: not loaded, nothing to write\n")
    elif args.task:
        written = "written to disk" if result["flushed"] else "nothing new to write"
        out.write(f"task {args.task}: {written}\n")
    else:
        out.write(f"flushed all tasks: {result['flushed']} written\n")
    return EXIT_OK


def _rollback(client: Client, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.range is None:
        result = client.rollback(args.task, args.ts)
    else:
        result = client.rollback(args.task, args.ts, deleted_range=list(args.range))
    if args.json:
        _print_json(result, out)
    else:
        out.write(f"task {args.task}: removed {result['removed']} update(s) newer than {args.ts}\n")
    return EXIT_OK


def _close(client: Client, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    result = client.close_task(args.task)
    if args.json:
        _print_json(result, out)
    elif result.get("loaded") is False:
        out.write(f"task {args.task}: was not loaded, nothing to close\n")
    else:
        out.write(f"task {args.task}: closed (written first unless ephemeral)\n")
    return EXIT_OK


def _load(path: Path) -> list[dict[str, Any]]:
    try:
        return load_history(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    except RecursionError:
        raise UsageError(f"cannot read {path}: JSON nested too deeply") from None


class _Bar:
    """A one-line progress bar redrawn on stderr, never wider than the terminal.

    Args:
        stream: where to draw.
        columns: the terminal's width (default: ``$COLUMNS``, else the
            stream's terminal, else 80).
    """

    def __init__(self, stream: TextIO, columns: int | None = None) -> None:
        self.stream = stream
        self.columns = columns or _columns(stream)
        self.drawn = False  # a line is on the terminal, not yet ended by a newline

    def __call__(self, done: int, total: int, deleted_range: Any) -> None:
        tail = f" {done}/{total} turns, range {_range(deleted_range)}"
        room = self.columns - 1  # the last column would wrap on some terminals
        width = min(30, room - len("replay []") - len(tail))
        if width >= 5:
            filled = width * done // max(total, 1)
            line = f"replay [{'#' * filled}{'.' * (width - filled)}]{tail}"
        else:
            line = f"replay{tail}"
        self.stream.write("\r" + line[:room].ljust(room))
        self.drawn = done < total
        if not self.drawn:
            self.stream.write("\n")
        self.stream.flush()

    def clear(self) -> None:
        """Blank a line left unfinished (a replay stopped part way), so nothing follows it."""
        if self.drawn:
            self.stream.write("\r" + " " * (self.columns - 1) + "\r")
            self.stream.flush()
            self.drawn = False


def _columns(stream: TextIO) -> int:
    try:
        return max(int(os.environ["COLUMNS"]), 10)
    except (KeyError, ValueError):
        pass
    try:
        return max(os.get_terminal_size(stream.fileno()).columns, 10)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return 80


def _load_conversation(
    path: Path, err: TextIO, about: About | None = None
) -> tuple[list[dict[str, Any]], str]:
    about = about if about is not None else About()
    try:
        loaded = load_conversation(path, about)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    except RecursionError:
        raise UsageError(f"cannot read {path}: JSON nested too deeply") from None
    for note in about.notes:
        err.write(f"ctxwin: {path}: {note}\n")
    return loaded


def _progress(args: argparse.Namespace, err: TextIO) -> _Bar | None:
    """A replay's progress bar: as ``--progress``/``--no-progress`` say, else on a terminal."""
    show = args.progress if args.progress is not None else err.isatty()
    return _Bar(err) if show else None


def _drop_task(client: Client, task_id: str, timeout: float) -> None:
    """Close a replay's task after a failure or a comparison, briefly and quietly."""
    with contextlib.suppress(CtxwinError):
        client.close_task(task_id, timeout=min(timeout, _PROBE_TIMEOUT))


def _replay(client: Client, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    about = About()
    history, detected = _load_conversation(args.file, err, about)
    dialect = args.dialect or detected
    if args.plot is not None:
        problem = plot_problem(args.plot)  # before the replay, not after it
        if problem is not None:
            raise UsageError(problem)
    if args.html is not None:
        problem = page_problem(args.html)
        if problem is not None:
            raise UsageError(problem)
    if not request_points(history, dialect):
        raise UsageError(f"cannot replay {args.file}: {no_request(dialect)}")
    model, window_source = model_for(history, args.model_window, about.model, args.model)
    if args.provider:
        model["provider"] = args.provider
    if len(args.strategy) > 1:
        return _compare(client, args, history, model, dialect, out, err)
    task_id = args.task or f"replay-{os.getpid()}-{time.time_ns() // 1_000_000}"
    bar = _progress(args, err)
    try:
        report = replay(
            client,
            history,
            model,
            task_id=task_id,
            ephemeral=not args.keep,
            file=str(args.file),
            progress=bar,
            usage=args.usage,
            dialect=dialect,
            summaries=args.summaries,
            strategy=args.strategy[0],
            pricing=args.pricing,
        )
    except BaseException:  # Ctrl-C included
        if bar is not None:
            bar.clear()
        if not args.keep:  # a failed replay leaves no task behind either
            _drop_task(client, task_id, args.timeout)
        raise
    report.window_source = window_source
    if not args.keep:
        client.close_task(task_id)
    if args.json:
        _print_json({**report.as_dict(), "task": task_id}, out)
    else:
        _write_report(report, task_id, out, args.per_turn)
    if args.html is not None:
        counts = message_tokens(client, history, report.variants, dialect)
        try:
            write_page(args.html, replay_page(report, history, counts))
        except OSError as exc:
            err.write(f"ctxwin: --html: cannot write {args.html}: {exc}\n")
            return EXIT_USAGE
        if not args.json:
            out.write(f"page written to {args.html}\n")
    if args.plot is not None:
        try:
            plot(report, args.plot)
        except (OSError, ValueError) as exc:
            err.write(f"ctxwin: --plot: cannot write {args.plot}: {exc}\n")
            return EXIT_USAGE
        if not args.json:
            out.write(f"plot written to {args.plot}\n")
    return EXIT_OK


def _compare(
    client: Client,
    args: argparse.Namespace,
    history: list[dict[str, Any]],
    model: proto.Model,
    dialect: str,
    out: TextIO,
    err: TextIO,
) -> int:
    """Replay under each strategy of ``--strategy`` (fresh ephemeral tasks) and compare them."""
    if args.task or args.keep or args.html is not None or args.plot is not None:
        raise UsageError(
            "several strategies compare in fresh tasks: no --task, --keep, --html, --plot"
        )
    reports: list[tuple[str, ReplayReport]] = []
    for strategy in args.strategy:
        task_id = f"replay-{strategy}-{os.getpid()}-{time.time_ns() // 1_000_000}"
        bar = _progress(args, err)
        try:
            report = replay(
                client,
                history,
                model,
                task_id=task_id,
                file=str(args.file),
                progress=bar,
                usage=args.usage,
                dialect=dialect,
                strategy=strategy,
                pricing=args.pricing,
            )
        finally:
            if bar is not None:
                bar.clear()
            _drop_task(client, task_id, args.timeout)
        reports.append((strategy, report))
    if args.json:
        _print_json([{"strategy": name, **report.as_dict()} for name, report in reports], out)
        return EXIT_OK
    rows = []
    for name, report in reports:
        cost = report.cost()
        totals = report.totals()
        rows.append(
            (
                name,
                totals["truncations"],
                len(report.over_window),
                f"{report.peak_tokens:,}",
                "-" if cost is None else f"{cost['cached_tokens']:,}",
                "-" if cost is None else f"{cost['written_tokens']:,}",
                "-" if cost is None else f"{cost['cost']:,.0f}",
                "-"
                if cost is None or not cost["keep_all_cost"]
                else f"{cost['cost'] / cost['keep_all_cost']:.3f}",
            )
        )
    out.write(
        f"{args.file}: {reports[0][1].turns} turns, window {reports[0][1].context_window:,}\n"
    )
    _table(
        rows,
        ("strategy", "cuts", "over window", "peak", "cached", "written", "cost", "vs all"),
        out,
    )
    return EXIT_OK


def _sampled(rows: list[ReplayTurn], events: set[int], every: int) -> list[ReplayTurn]:
    """Every ``every``-th turn, the last one, and the turns of events."""
    return [
        row
        for index, row in enumerate(rows)
        if index % every == 0 or index == len(rows) - 1 or row.turn in events
    ]


def _write_turns(report: ReplayReport, out: TextIO, every: int) -> None:
    marked = {event.turn for event in report.events} | set(report.over_window)
    rows = _sampled(report.per_turn, marked, every)
    _table(
        [
            (
                row.turn,
                row.sent,
                f"{row.estimated:,}",
                "-" if row.reported is None else f"{row.reported:,}",
                "-" if not row.reported else f"{row.estimated / row.reported:.2f}",
                f"{row.calibration:.3f}",
                _SOURCES.get(row.source, row.source)
                + (" (over window)" if row.turn in report.over_window else ""),
            )
            for row in rows
        ],
        ("turn", "sent", "estimated", "reported", "est/rep", "calibration", "usage"),
        out,
    )


_SOURCES = {"recorded": "recorded", "counted": "counted", "estimated": "estimated", "none": "-"}


def _saved(value: int) -> str:
    """A saving; a negative one is marked (see the footnote :func:`_write_report` adds)."""
    return f"{value:,}" if value >= 0 else f"{value:,}*"


def _turn_list(turns: Sequence[int]) -> str:
    """``1-3, 7, 9-10`` for [1, 2, 3, 7, 9, 10]."""
    spans: list[list[int]] = []
    for turn in turns:
        if spans and turn == spans[-1][1] + 1:
            spans[-1][1] = turn
        else:
            spans.append([turn, turn])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _write_report(report: ReplayReport, task_id: str, out: TextIO, per_turn: bool = False) -> None:
    totals = report.totals()
    out.write(
        f"replayed {report.turns} turns of {report.file} ({report.messages} messages) "
        f"as task {task_id}\n"
        f"model {report.model.get('id')}: window {report.context_window:,}"
        + (f" ({report.window_source})" if report.window_source else "")
        + ", "
        f"max allowed {report.max_allowed_size:,}; peak {report.peak_tokens:,} input tokens\n"
        f"{usage_line(report)}\n"
    )
    cost = report.cost()
    if cost is not None:
        ratio = cost["cost"] / cost["keep_all_cost"] if cost["keep_all_cost"] else 0.0
        out.write(
            f"strategy {report.strategy}: {cost['cached_tokens']:,} tokens read from the "
            f"cache, {cost['written_tokens']:,} written; cost {cost['cost']:,.0f} "
            f"(sending everything: {cost['keep_all_cost']:,.0f}, {ratio:.3f}x)\n"
        )
    negative = False
    if report.events:
        rows = []
        for event in report.events:
            negative = negative or event.chars_saved < 0 or event.tokens_saved < 0
            rows.append(
                (
                    event.turn,
                    event.message,
                    event.kind,
                    _range(event.deleted_range) if event.kind == "truncation" else "-",
                    event.removed_messages if event.kind == "truncation" else "-",
                    _saved(event.chars_saved),
                    _saved(event.tokens_saved),
                )
            )
        _table(
            rows, ("turn", "sent", "event", "range", "removed", "chars saved", "tokens saved"), out
        )
    else:
        out.write("no truncation or optimisation happened\n")
    if negative:
        out.write("* negative: the notice is longer than the text it replaced\n")
    if report.summaries:
        _table(
            [
                (
                    item["turn"],
                    "stored" if item["condensed"] else f"refused: {item['reason']}",
                    _range(item["range"]) if item["range"] else "-",
                    "-" if item["chars"] is None else f"{item['chars']:,}",
                    "-" if item["tokens"] is None else f"{item['tokens']:,}",
                    f"{item['tokens_before']:,}",
                    f"{item['tokens_after']:,}",
                )
                for item in report.summaries
            ],
            ("turn", "summary", "range", "chars", "tokens", "view before", "view after"),
            out,
        )
    out.write(
        f"{totals['truncations']} truncation(s) removing {totals['messages_removed']} messages, "
        f"{totals['optimisations']} optimisation(s); saved {_saved(totals['chars_saved'])} "
        f"chars, {_saved(totals['tokens_saved'])} tokens\n"
        f"final range {_range(report.final_range)}; the last request sent "
        f"{report.last_request_messages} of {report.messages} messages\n"
    )
    if report.over_window:
        worst = max(
            (row for row in report.per_turn if row.turn in report.over_window),
            key=lambda row: row.estimated,
        )
        out.write(
            f"over the {report.context_window:,}-token window (the model would refuse): "
            f"{len(report.over_window)} request(s), "
            f"{'turn' if len(report.over_window) == 1 else 'turns'} "
            f"{_turn_list(report.over_window)}; "
            f"largest {worst.estimated:,} estimated tokens at turn {worst.turn}\n"
        )
        cause = report.over_window_cause
        if cause is not None:
            out.write(
                f"  turn {cause.turn}'s largest message: #{cause.index}, {cause.kind}, "
                f"{cause.message_tokens:,} tokens"
                + (", new in that request" if cause.new else "")
                + f"; {cause.prevent}\n"
            )
    if report.per_turn:
        every = 1 if per_turn else max(1, len(report.per_turn) // 20)
        out.write(
            "estimated vs reported input tokens per turn"
            + ("" if every == 1 else f" (every {every}th turn and events; --per-turn for all)")
            + f"; final calibration {report.per_turn[-1].calibration:.3f}\n"
        )
        _write_turns(report, out, every)


COMMANDS: dict[str, Callable[[Client, argparse.Namespace, TextIO, TextIO], int]] = {
    "ping": _ping,
    "stats": _stats,
    "inspect": _inspect,
    "flush": _flush,
    "rollback": _rollback,
    "close": _close,
    "replay": _replay,
}


def _unreachable(endpoint: str, detail: str, err: TextIO) -> int:
    err.write(
        f"ctxwin: no daemon answered at {endpoint} ({detail})\n"
        "  start one with `ctxwind` (or `python3 dev.py daemon` from a checkout),\n"
        f"  or point at it with --endpoint / ${proto.ENDPOINT_ENV}\n"
    )
    return EXIT_UNREACHABLE


def main(
    argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run ``ctxwin`` and return its exit code.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
        out: where results go (default: stdout).
        err: where errors go (default: stderr).

    Returns:
        0 ok, 1 daemon error, 2 usage error, 3 daemon not reachable, 141 reader gone.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.command == "keys":
        return _keys.run(args, out, err)
    endpoint = proto.resolve_endpoint(args.endpoint)
    missing = _autostart.socket_missing(endpoint)
    if missing is not None:
        return _unreachable(endpoint, missing, err)
    try:
        with Client(
            endpoint,
            timeout=args.timeout,
            server_key=args.server_key,
            client_key=args.client_key,
        ) as client:
            client.ping(timeout=min(args.timeout, _PROBE_TIMEOUT))
            code = COMMANDS[args.command](client, args, out, err)
            out.flush()  # here, so that a reader gone away is seen here
            return code
    except BrokenPipeError:
        # `ctxwin ... | head`: the reader has what it wanted. Stop writing quietly;
        # at exit Python would flush stdout again and print a second traceback.
        if out is sys.stdout:
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except AuthenticationError as exc:
        err.write(f"ctxwin: {exc.message}\n")
        return EXIT_UNREACHABLE
    except DaemonUnavailableError as exc:
        return _unreachable(endpoint, exc.message, err)
    except UsageError as exc:
        err.write(f"ctxwin: {exc}\n")
        return EXIT_USAGE
    except CtxwinError as exc:
        if exc.local:
            err.write(f"ctxwin: {exc.code}: {exc.message}\n")
            return EXIT_USAGE
        err.write(f"ctxwin: daemon error {exc.code}: {exc.message}\n")
        return EXIT_DAEMON_ERROR
    except KeyboardInterrupt:
        err.write("ctxwin: interrupted\n")
        return 130
