"""``ctxwin``'s parser, what its commands share (exit codes, tables, JSON, reading a
conversation file), and its small commands: ``ping``, ``stats``, ``flush``, ``rollback``
and ``close``. ``inspect`` is in :mod:`._inspect`, ``replay`` in :mod:`.replay._command`.

Each command returns an exit code; results go to ``out``, progress to ``err``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO, TypeVar

from ctxwin import proto

from .._core import DEFAULT_TIMEOUT
from .._sync import Client
from . import _keys
from ._corpus import About, load_conversation, load_history
from .replay import USAGE_MODES

EXIT_OK = 0
EXIT_DAEMON_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_BROKEN_PIPE = 141
"""What a shell reports for a writer stopped by SIGPIPE (128 + 13): the reader left early."""

PROBE_TIMEOUT = 5.0


CONVERSATION_SHAPES = (
    "the conversation: a Cline api_conversation_history.json (a JSON list of messages); "
    "a JSON object holding messages (OpenAI Chat or Anthropic), input (OpenAI Responses) "
    "or contents (Gemini); or a Claude Code JSONL session log"
)
"""The files ``replay`` and ``inspect --messages`` read (``ctxwin.client.cli._corpus``)."""


class UsageError(Exception):
    """A problem with what was asked, found before or after talking to the daemon."""


def _task_id(value: str) -> str:
    if not proto.is_valid_task_id(value):
        raise argparse.ArgumentTypeError(
            f"invalid task id {value!r} (expected ^{proto.TASK_ID_PATTERN.pattern}$)"
        )
    return value


_MAX_COUNT = 2**53 - 1
"""The largest count, time or index the daemon takes (JSON's exact integers)."""


N = TypeVar("N", int, float)


def _number(value: str, kind: type[N]) -> N:
    """``value`` as an int or a float, or the argument's error."""
    try:
        return kind(value)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"not {what}: {value!r}") from None


def _non_negative_int(value: str) -> int:
    number = _number(value, int)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value!r}")
    if number > _MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be at most {_MAX_COUNT}: {value!r}")
    return number


def _positive_int(value: str) -> int:
    number = _number(value, int)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value!r}")
    return number


def _positive_float(value: str) -> float:
    number = _number(value, float)
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

    _add_task_commands(commands, json_flag)
    _add_replay(commands, json_flag)
    return parser


def _add_task_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    json_flag: argparse.ArgumentParser,
) -> None:
    """``inspect``, ``flush``, ``rollback`` and ``close``."""
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


def _add_replay(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    json_flag: argparse.ArgumentParser,
) -> None:
    """``replay`` and its options."""
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
        type=_positive_int,
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


def print_json(data: Any, out: TextIO) -> None:
    out.write(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def table(rows: Sequence[Sequence[object]], header: Sequence[str], out: TextIO) -> None:
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


def shown_range(deleted_range: Any) -> str:
    return "none" if not deleted_range else f"[{deleted_range[0]}, {deleted_range[1]}]"


def shown_set(dropped: Any) -> str:
    """A deleted set's inclusive ranges (``inspect``'s ``dropped``): ``[40, 51], [60, 71]``."""
    return ", ".join(shown_range(pair) for pair in dropped) if dropped else "none"


def ping(client: Client, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    started = time.perf_counter()
    result = client.ping()
    elapsed_ms = (time.perf_counter() - started) * 1000
    if args.json:
        print_json({**result, "endpoint": client.endpoint, "ms": round(elapsed_ms, 3)}, out)
    else:
        out.write(
            f"pong from {client.endpoint}: ctxwind {result['version']}, "
            f"protocol {result['proto']}, {elapsed_ms:.1f} ms\n"
        )
    return EXIT_OK


def stats(client: Client, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    result = client.stats()
    if args.json:
        print_json(result, out)
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


def flush(client: Client, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    result = client.flush(args.task)
    if args.json:
        print_json(result, out)
    elif args.task and result.get("loaded") is False:
        out.write(f"task {args.task}: not loaded, nothing to write\n")
    elif args.task:
        written = "written to disk" if result["flushed"] else "nothing new to write"
        out.write(f"task {args.task}: {written}\n")
    else:
        out.write(f"flushed all tasks: {result['flushed']} written\n")
    return EXIT_OK


def rollback(client: Client, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.range is None:
        # A rollback of a task the daemon neither holds nor stores answers as on an empty
        # task (and creates nothing): to a person that is a mistyped task id.
        if client.inspect(args.task).get("exists") is False:
            err.write(
                f"ctxwin: task {args.task} does not exist (nothing stored, not loaded): "
                "there is nothing to roll back\n"
            )
            return EXIT_DAEMON_ERROR
        result = client.rollback(args.task, args.ts)
    else:
        result = client.rollback(args.task, args.ts, deleted_range=list(args.range))
    if args.json:
        print_json(result, out)
    else:
        out.write(f"task {args.task}: removed {result['removed']} update(s) newer than {args.ts}\n")
    return EXIT_OK


def close(client: Client, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    result = client.close_task(args.task)
    if args.json:
        print_json(result, out)
    elif result.get("loaded") is False:
        out.write(f"task {args.task}: was not loaded, nothing to close\n")
    else:
        out.write(f"task {args.task}: closed (written first unless ephemeral)\n")
    return EXIT_OK


def read_history(path: Path) -> list[dict[str, Any]]:
    try:
        return load_history(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    except RecursionError:
        raise UsageError(f"cannot read {path}: JSON nested too deeply") from None


def read_conversation(
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
