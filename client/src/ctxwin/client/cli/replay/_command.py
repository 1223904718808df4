"""``ctxwin replay``: the command, its progress bar, the comparison of strategies, and the
report as text."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TextIO

from ctxwin import proto

from ..._errors import CtxwinError
from ..._sync import Client
from .. import _plot
from .._commands import (
    EXIT_OK,
    EXIT_USAGE,
    PROBE_TIMEOUT,
    UsageError,
    print_json,
    read_conversation,
    shown_range,
    shown_set,
    table,
)
from .._corpus import About, model_for
from .._dialects import no_request, request_points
from ..page import page_problem, replay_page, write_page
from ._events import message_tokens
from ._report import ReplayReport, ReplayTurn, unrecognised_line, usage_line
from ._run import ReplayOptions, replay


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
        tail = f" {done}/{total} turns, range {shown_range(deleted_range)}"
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


def _progress(args: argparse.Namespace, err: TextIO) -> _Bar | None:
    """A replay's progress bar: as ``--progress``/``--no-progress`` say, else on a terminal."""
    show = args.progress if args.progress is not None else err.isatty()
    return _Bar(err) if show else None


def _drop_task(client: Client, task_id: str, timeout: float) -> None:
    """Close a replay's task after a failure or a comparison, briefly and quietly."""
    with contextlib.suppress(CtxwinError):
        client.close_task(task_id, timeout=min(timeout, PROBE_TIMEOUT))


def run(client: Client, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``ctxwin replay``: replay the file, print the report, write the page and the plot."""
    about = About()
    history, detected = read_conversation(args.file, err, about)
    dialect = args.dialect or detected
    _check_outputs(args)  # before the replay, not after it
    if not request_points(history, dialect):
        raise UsageError(f"cannot replay {args.file}: {no_request(dialect)}")
    model, window_source = model_for(history, args.model_window, about.model, args.model)
    if args.provider:
        model["provider"] = args.provider
    options = ReplayOptions(
        task_id=args.task or f"replay-{os.getpid()}-{time.time_ns() // 1_000_000}",
        ephemeral=not args.keep,
        file=str(args.file),
        usage=args.usage,
        dialect=dialect,
        summaries=args.summaries,
        strategy=args.strategy[0],
        pricing=args.pricing,
    )
    if len(args.strategy) > 1:
        return _compare(client, args, history, model, options, out, err)
    # A task that existed before is someone else's: a refused replay leaves it loaded.
    existed = args.task is not None and client.inspect(args.task).get("exists") is not False
    bar = _progress(args, err)
    try:
        report = replay(client, history, model, replace(options, progress=bar))
    except BaseException:  # Ctrl-C included
        if bar is not None:
            bar.clear()
        if not args.keep and not existed:  # a failed replay leaves no task behind either
            _drop_task(client, options.task_id, args.timeout)
        raise
    report.window_source = window_source
    if not args.keep:
        client.close_task(options.task_id)
    if args.json:
        print_json({**report.as_dict(), "task": options.task_id}, out)
    else:
        _write_report(report, options.task_id, out, args.per_turn)
    return _write_outputs(client, args, history, report, out, err)


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse a ``--plot`` or ``--html`` file that cannot be written."""
    if args.plot is not None:
        problem = _plot.plot_problem(args.plot)
        if problem is not None:
            raise UsageError(problem)
    if args.html is not None:
        problem = page_problem(args.html)
        if problem is not None:
            raise UsageError(problem)


def _write_outputs(
    client: Client,
    args: argparse.Namespace,
    history: list[dict[str, Any]],
    report: ReplayReport,
    out: TextIO,
    err: TextIO,
) -> int:
    """Write the ``--html`` page and the ``--plot`` asked for."""
    if args.html is not None:
        counts = message_tokens(client, history, report.variants, report.dialect)
        try:
            write_page(args.html, replay_page(report, history, counts))
        except OSError as exc:
            err.write(f"ctxwin: --html: cannot write {args.html}: {exc}\n")
            return EXIT_USAGE
        if not args.json:
            out.write(f"page written to {args.html}\n")
    if args.plot is not None:
        try:
            _plot.plot(report, args.plot)
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
    options: ReplayOptions,
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
            each = replace(
                options, task_id=task_id, strategy=strategy, summaries=None, progress=bar
            )
            report = replay(client, history, model, each)
        finally:
            if bar is not None:
                bar.clear()
            _drop_task(client, task_id, args.timeout)
        reports.append((strategy, report))
    if args.json:
        print_json([{"strategy": name, **report.as_dict()} for name, report in reports], out)
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
    table(
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
    table(
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
    """The report as text: the header, the events, the summaries, the totals, the requests
    over the window, and the turns (a sample unless ``per_turn``)."""
    out.write(
        f"replayed {report.turns} turns of {report.file} ({report.messages} messages) "
        f"as task {task_id}\n"
        f"model {report.model.get('id')}: window {report.context_window:,}"
        + (f" ({report.window_source})" if report.window_source else "")
        + ", "
        f"max allowed {report.max_allowed_size:,}; peak {report.peak_tokens:,} input tokens\n"
        f"{usage_line(report)}\n"
    )
    parts = unrecognised_line(report.unrecognised)
    if parts is not None:
        out.write(parts + "\n")
    cost = report.cost()
    if cost is not None:
        ratio = cost["cost"] / cost["keep_all_cost"] if cost["keep_all_cost"] else 0.0
        out.write(
            f"strategy {report.strategy}: {cost['cached_tokens']:,} tokens read from the "
            f"cache, {cost['written_tokens']:,} written; cost {cost['cost']:,.0f} "
            f"(sending everything: {cost['keep_all_cost']:,.0f}, {ratio:.3f}x)\n"
        )
    _write_events(report, out)
    if report.summaries:
        _write_summaries(report, out)
    totals = report.totals()
    out.write(
        f"{totals['truncations']} truncation(s) removing {totals['messages_removed']} messages, "
        f"{totals['optimisations']} optimisation(s); saved {_saved(totals['chars_saved'])} "
        f"chars, {_saved(totals['tokens_saved'])} tokens\n"
        f"final range {shown_range(report.final_range)}; {last_request(report)}\n"
    )
    if report.over_window:
        _write_over_window(report, out)
    if report.per_turn:
        every = 1 if per_turn else max(1, len(report.per_turn) // 20)
        out.write(
            "estimated vs reported input tokens per turn"
            + (
                ""
                if every == 1
                else f" (every {ordinal(every)} turn and events; --per-turn for all)"
            )
            + f"; final calibration {report.per_turn[-1].calibration:.3f}\n"
        )
        _write_turns(report, out, every)


def ordinal(number: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``21st``, ..."""
    suffix = "th" if 10 <= number % 100 <= 20 else _SUFFIXES.get(number % 10, "th")
    return f"{number}{suffix}"


_SUFFIXES = {1: "st", 2: "nd", 3: "rd"}


def last_request(report: ReplayReport) -> str:
    """How many messages the last request sent of the history it was made of."""
    if not report.per_turn:
        return "no request was made"
    last = report.per_turn[-1]
    return (
        f"the last request (turn {last.turn}) sent {report.last_request_messages} of its "
        f"{last.messages} messages"
    )


def _write_events(report: ReplayReport, out: TextIO) -> None:
    if not report.events:
        out.write("no truncation or optimisation happened\n")
        return
    negative = False
    rows = []
    for event in report.events:
        negative = negative or event.chars_saved < 0 or event.tokens_saved < 0
        rows.append(
            (
                event.turn,
                event.message,
                event.kind,
                (
                    shown_range(event.deleted_range)
                    + (f", deleted set {shown_set(event.dropped)}" if event.dropped else "")
                    if event.kind == "truncation"
                    else "-"
                ),
                event.removed_messages if event.kind == "truncation" else "-",
                _saved(event.chars_saved),
                _saved(event.tokens_saved),
            )
        )
    table(
        rows, ("turn", "history", "event", "range", "removed", "chars saved", "tokens saved"), out
    )
    if negative:
        out.write("* negative: the notice is longer than the text it replaced\n")


def _write_summaries(report: ReplayReport, out: TextIO) -> None:
    table(
        [
            (
                item["turn"],
                "stored" if item["condensed"] else f"refused: {item['reason']}",
                shown_range(item["range"]) if item["range"] else "-",
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


def _write_over_window(report: ReplayReport, out: TextIO) -> None:
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
