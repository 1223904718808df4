"""``--html``: one self-contained page of what the model saw, turn by turn.

The page holds inline CSS, an inline SVG chart and a few lines of plain
JavaScript (to pick another turn); it loads nothing. Every message of the
history is written once, its body folded; the messages a view altered (a
notice, a replaced file read, a repaired tool pair) are written once per
distinct form. Each turn's view is then a choice of which of them to show,
so a 1.5 MB conversation of 222 turns makes a page of about its own size.
The last turn is rendered as the page loads, so it reads without JavaScript.

Here are the two pages (a replay's, a task's now) and their writing;
``_layout.py`` lays a page out, ``_bodies.py`` draws a message in each
dialect, ``_chart.py`` draws the chart, and the style sheet and script are
the package's files ``page.css`` and ``page.js``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ctxwin import proto

from .._commands import shown_set
from ..replay import (
    ReplayReport,
    TokenCounts,
    Variant,
    ViewState,
    unrecognised_line,
    usage_line,
)
from ._chart import chart
from ._layout import Page, PageTurn, render, signed

__all__ = ["PageTurn", "inspect_page", "page_problem", "replay_page", "write_page"]


def page_problem(path: Path) -> str | None:
    """Why ``path`` cannot take the page (checked before a long replay), or None when it can."""
    if not path.parent.is_dir():
        return f"--html: no directory {path.parent}"
    if path.is_dir():
        return f"--html: {path} is a directory"
    return None


def write_page(path: Path, text: str) -> None:
    """Write a page readable by its owner only (0600, as the daemon's state files: it holds
    whole conversations), atomically: a reader sees the old page or the new one, whole.

    The page goes to a new file in the same directory (created 0600), made durable, then
    renamed over ``path``; a failure leaves ``path`` as it was and no file behind.

    Raises:
        OSError: the page cannot be written.
    """
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _cost_cards(report: ReplayReport) -> list[tuple[str, str]]:
    """The replay's cost under its price sheet against sending everything, when priced."""
    cost = report.cost()
    if cost is None:
        return []
    ratio = cost["cost"] / cost["keep_all_cost"] if cost["keep_all_cost"] else 0.0
    return [
        (
            "cached share",
            f"{cost['cached_tokens'] / max(cost['cached_tokens'] + cost['written_tokens'], 1):.1%}",
        ),
        (
            "cost vs sending everything",
            f"{cost['cost']:,.0f} / {cost['keep_all_cost']:,.0f} ({ratio:.2f}x)",
        ),
    ]


def replay_page(
    report: ReplayReport, history: Sequence[Mapping[str, Any]], counts: TokenCounts
) -> str:
    """The page of a replay: tokens per turn, its events, and every turn's view.

    Args:
        report: the replay's report.
        history: the conversation replayed.
        counts: tokens of each message and variant (:func:`message_tokens`).

    Returns:
        The HTML text.
    """
    totals = report.totals()
    events: list[dict[str, Any]] = [
        {
            "turn": event.turn,
            "kind": event.kind,
            "what": (
                f"range {_range(event.deleted_range)}{_set(event.dropped)}, "
                f"{event.removed_messages} messages removed"
                if event.kind == "truncation"
                else "replaced file reads in messages " + _list(event.messages)
            ),
            "chars": event.chars_saved,
            "tokens": event.tokens_saved,
        }
        for event in report.events
    ]
    by_turn = {row.turn: row for row in report.per_turn}
    for turn in report.over_window:
        row = by_turn[turn]
        tokens = row.reported if row.reported is not None else row.estimated
        events.append(
            {
                "turn": turn,
                "kind": "over window",
                "what": f"{tokens:,} tokens for a {report.context_window:,}-token window",
                "chars": None,
                "tokens": None,
            }
        )
    for item in report.summaries:
        stored = item["condensed"]
        events.append(
            {
                "turn": item["turn"],
                "kind": "summary",
                "what": (
                    f"summary of messages {_range(item['range'])} stored, "
                    f"{item['chars']:,} chars ({item['tokens']:,} tokens); view "
                    f"{item['tokens_before']:,} -> {item['tokens_after']:,} tokens"
                    if stored
                    else f"no summary stored: {item['reason']}"
                ),
                "chars": None,
                "tokens": None,
            }
        )
    order = {"summary": 0, "truncation": 1, "optimisation": 2, "over window": 3}
    events.sort(key=lambda event: (event["turn"], order.get(event["kind"], 2)))
    marks: dict[int, str] = {}
    for event in events:
        marks[event["turn"]] = ", ".join(filter(None, (marks.get(event["turn"]), event["kind"])))
    turns = [
        PageTurn(
            row.turn,
            row.messages,
            row.view,
            marks.get(row.turn, ""),
            row.estimated,
        )
        for row in report.per_turn
    ]
    page = Page(
        title=f"ctxwin replay: {Path(report.file).name}",
        facts=[
            f"model {report.model.get('id')}",
            f"window {report.context_window:,} tokens",
            f"max allowed {report.max_allowed_size:,}",
            f"{report.turns} turns, {report.messages} messages",
        ],
        notes=[usage_line(report), *filter(None, [unrecognised_line(report.unrecognised)])],
        cards=[
            ("truncations", f"{totals['truncations']}"),
            ("messages removed", f"{totals['messages_removed']}"),
            ("optimisations", f"{totals['optimisations']}"),
            ("tokens saved", signed(totals["tokens_saved"])),
            ("peak input", f"{report.peak_tokens:,}"),
            ("over the window", f"{len(report.over_window)}"),
            ("messages in the last request", _last_request(report)),
            *_cost_cards(report),
        ],
        chart=chart(report),
        events=events,
        turns=turns,
        views=report.views,
        variants=report.variants,
        history=history,
        counts=counts,
        dialect=report.dialect,
    )
    return render(page)


def inspect_page(
    task: str,
    history: Sequence[Mapping[str, Any]],
    view: ViewState,
    variants: list[Variant],
    counts: TokenCounts,
    edits: Sequence[Mapping[str, Any]],
    dialect: str = proto.CLINE,
    dropped: Sequence[Sequence[int]] = (),
) -> str:
    """The page of a task now: its edits and the conversation as the model receives it.

    Args:
        task: the task id.
        history: the task's conversation.
        view: how the task's view alters it (:func:`view_state`, or
            :meth:`NativeViews.state` in another dialect).
        variants: the altered messages.
        counts: tokens of each message and variant.
        edits: one map per overlay block: ``message``, ``block``, ``edit``
            (its kind), ``updates`` (how many) and ``saved`` (chars, or None).
        dialect: the conversation's dialect.
        dropped: the task's deleted set (``inspect``'s ``dropped``), named with its range.

    Returns:
        The HTML text.
    """
    deleted = view.deleted_range
    hidden = sum(not view.sent(index, len(history)) for index in range(len(history)))
    if view.order is not None:
        hidden = len(view.removed(len(history)))
    events = [
        {
            "turn": None,
            "kind": str(edit["edit"]),
            "what": f"message {edit['message']} block {edit['block']}, {edit['updates']} update(s)",
            "chars": edit["saved"],
            "tokens": None,
        }
        for edit in edits
    ]
    sent = len(history) - hidden if view.order is None else len(view.order)
    page = Page(
        title=f"ctxwin task {task}",
        facts=[f"{len(history)} messages", f"range {_range(deleted)}{_set(dropped)}"],
        notes=[
            "The conversation as the model receives it now, under the task's range"
            + (", deleted set" if dropped else "")
            + " and edits.",
            *filter(None, [unrecognised_line(counts.unrecognised)]),
        ],
        cards=[
            ("messages hidden", f"{hidden}"),
            ("overlay edits", f"{len(edits)}"),
            ("next request", f"{sent} of {len(history)} messages"),
        ],
        chart="",
        events=events,
        turns=[PageTurn(0, len(history), 0, "now")],
        views=[view],
        variants=variants,
        history=history,
        counts=counts,
        dialect=dialect,
    )
    return render(page)


def _last_request(report: ReplayReport) -> str:
    """The last request's messages of the history it was made of (as its turn's picker says)."""
    end = report.per_turn[-1].messages if report.per_turn else report.messages
    return f"{report.last_request_messages} of {end}"


def _range(deleted_range: Any) -> str:
    return "none" if not deleted_range else f"[{deleted_range[0]}, {deleted_range[1]}]"


def _set(dropped: Sequence[Sequence[int]]) -> str:
    """``, deleted set [40, 51], [60, 71]`` (as ``ctxwin inspect`` says it), or nothing."""
    return f", deleted set {shown_set(dropped)}" if dropped else ""


def _list(indices: Sequence[int]) -> str:
    shown = ", ".join(str(index) for index in indices[:8])
    return shown + (f" and {len(indices) - 8} more" if len(indices) > 8 else "")
