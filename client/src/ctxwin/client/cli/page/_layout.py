"""The page around its messages: header, cards, events, the turn picker, and
which messages each turn's view shows.

Every message of the history is written once, its body folded; the messages a
view altered are written once per distinct form. A Cline view is its range,
its deleted set and its altered messages (the removed middle folded into one
line, each run of the deleted set into one line of its own); a view of
another dialect lists its messages in order. The script (``page.js``) shows
another turn's view by hiding, showing and moving those items; it and the
style sheet (``page.css``) are files of this package.
"""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from ctxwin import proto

from .._dialects import chars_of, message_chars
from ..replay import TokenCounts, Variant, ViewState
from ._bodies import message_item

__all__ = ["Page", "PageTurn", "render", "signed"]

_PACKAGE = __name__.rpartition(".")[0]


@dataclass(slots=True)
class PageTurn:
    """One selectable turn of the page: how many messages existed and which view was sent."""

    turn: int
    end: int
    view: int
    label: str = ""
    estimated: int | None = None


@dataclass(slots=True)
class Page:
    """What a page shows: its header, cards, chart and events, and every turn's view."""

    title: str
    facts: list[str]
    notes: list[str]
    cards: list[tuple[str, str]]
    chart: str
    events: list[dict[str, Any]]
    turns: list[PageTurn]
    views: list[ViewState]
    variants: list[Variant]
    history: Sequence[Mapping[str, Any]]
    counts: TokenCounts
    legend: list[tuple[str, str]] = field(default_factory=list)
    dialect: str = proto.CLINE


def signed(value: int | None) -> str:
    if value is None:
        return ""
    return f"{value:,}" if value >= 0 else f"{value:,} (notice longer than the text)"


def _fold(view: ViewState, page: Page, end: int) -> tuple[str, bool]:
    """The one line a dropped range folds into, and whether the view has one."""
    deleted = view.deleted_range
    if not deleted or end <= 2:
        return "", False
    last = min(deleted[1], end - 1)
    if last < 2:
        return "", False
    hidden = range(2, last + 1)
    chars = sum(chars_of(page.history[i].get("content")) for i in hidden)
    tokens = sum(page.counts.messages[i] for i in hidden)
    return (
        f"messages 2-{last} dropped, {chars:,} characters ({tokens:,} tokens)",
        True,
    )


def _gap_line(page: Page, first: int, last: int) -> str:
    """The one line a run of the deleted set folds into (as the range's, :func:`_fold`)."""
    hidden = range(first, last + 1)
    chars = sum(chars_of(page.history[i].get("content")) for i in hidden)
    tokens = sum(page.counts.messages[i] for i in hidden)
    return f"messages {_runs(list(hidden))} dropped, {chars:,} characters ({tokens:,} tokens)"


def render(page: Page) -> str:
    selected = page.turns[-1]
    view = page.views[selected.view]
    if page.dialect != proto.CLINE:
        return _frame(page, selected, *_ordered(page, selected), _script(ordered=True))
    # Each run of a deleted set any view leaves out folds into a line of its own, after
    # its last message; a view shows the lines of its runs.
    gaps = sorted({(first, last) for state in page.views for first, last in state.dropped})
    gap_number = {gap: number for number, gap in enumerate(gaps)}
    data = {
        "turns": [[turn.turn, turn.end, turn.view, turn.estimated] for turn in page.turns],
        "views": [
            {
                "keep": state.deleted_range[1] + 1 if state.deleted_range else 2,
                "last": state.deleted_range[1] if state.deleted_range else 1,
                "gaps": [gap_number[first, last] for first, last in state.dropped],
                "altered": {str(index): variant for index, variant in state.altered.items()},
            }
            for state in page.views
        ],
        "gaps": [list(gap) for gap in gaps],
        "chars": [chars_of(message.get("content")) for message in page.history],
        "tokens": page.counts.messages,
    }
    ends: dict[int, list[int]] = {}
    for number, (_, last) in enumerate(gaps):
        ends.setdefault(last, []).append(number)
    shown_gaps = {gap_number[first, last] for first, last in view.dropped}
    items: list[str] = []
    used = _originals_shown(page)
    by_index: dict[int, list[int]] = {}
    for number, variant in enumerate(page.variants):
        by_index.setdefault(variant.index, []).append(number)
    for index, message in enumerate(page.history):
        in_view = view.sent(index, selected.end)
        if index in used:
            items.append(
                message_item(
                    index,
                    message,
                    page.counts.messages[index],
                    not in_view or index in view.altered,
                )
            )
        for number in by_index.get(index, []):
            variant = page.variants[number]
            items.append(
                message_item(
                    index,
                    variant.message,
                    page.counts.variants[number],
                    not in_view or view.altered.get(index) != number,
                    number,
                    variant.kinds,
                )
            )
        if index == 1:
            text, shown = _fold(view, page, selected.end)
            items.append(
                f'<li id="fold" class="fold"{"" if shown else " hidden"}>'
                f'<span id="fold-text">{html.escape(text)}</span></li>'
            )
        for number in ends.get(index, []):
            items.append(
                f'<li class="fold gap" data-gap="{number}"'
                f"{'' if number in shown_gaps else ' hidden'}>"
                f"<span>{html.escape(_gap_line(page, *gaps[number]))}</span></li>"
            )
    return _frame(page, selected, data, items, _script(ordered=False))


def _frame(
    page: Page, selected: PageTurn, data: dict[str, Any], items: list[str], script_text: str
) -> str:
    """The whole page around its conversation's items, with the data its script reads."""
    options = "".join(
        f'<option value="{number}"{" selected" if turn is selected else ""}>'
        + (f"turn {turn.turn}" if turn.turn else "")
        + (" · " if turn.turn and turn.label else "")
        + html.escape(turn.label)
        + "</option>"
        for number, turn in enumerate(page.turns)
    )
    events = "".join(_event_row(event) for event in page.events) or (
        '<tr><td colspan="5" class="none">no truncation or optimisation happened</td></tr>'
    )
    cards = "".join(
        f'<div class="card"><div class="value">{html.escape(value)}</div>'
        f'<div class="label">{html.escape(label)}</div></div>'
        for label, value in page.cards
    )
    chart = ""
    if page.chart:
        chart = (
            '<section><h2>Input tokens per turn</h2><div class="legend">'
            '<span class="key estimated"></span>ctxwin\'s estimate of its view (calibrated)'
            '<span class="key reported"></span>reported usage of that view'
            '<span class="key recorded"></span>recorded usage of another view'
            '<span class="key budget"></span>max allowed'
            '<span class="key cut"></span>truncation'
            '<span class="key opt"></span>optimisation'
            '<span class="dot"></span>over the window</div>'
            f'<div class="chart">{page.chart}</div>'
            '<p class="hint">Click the chart or an event to see that turn below.</p></section>'
        )
    script = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    facts = " · ".join(html.escape(fact) for fact in page.facts)
    notes = "".join(f'<p class="note">{html.escape(note)}</p>' for note in page.notes)
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{html.escape(page.title)}</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>\n{_asset('page.css')}</style></head><body><main>"
        f'<header><h1>{html.escape(page.title)}</h1><p class="facts">{facts}</p>{notes}'
        f'</header><div class="cards">{cards}</div>{chart}'
        '<section><h2>Events</h2><div class="scroll"><table id="events"><thead><tr>'
        "<th>turn</th><th>event</th>"
        "<th>what</th><th>chars saved</th><th>tokens saved</th></tr></thead>"
        f"<tbody>{events}</tbody></table></div></section>"
        '<section><h2>What the model received</h2><div class="pick">'
        f'<label for="turn">turn</label> <select id="turn">{options}</select>'
        f' <span id="view-summary">{html.escape(_summary(page, selected))}</span></div>'
        '<p class="legend-line"><span class="badge notice">notice</span> a ctxwin notice '
        'stands in for the text <span class="badge read">file read replaced</span> a stale '
        'file read replaced by a notice <span class="badge read">shortened</span> <span '
        'class="badge read">result stubbed</span> a result too large shortened, or stubbed, '
        'by strategy auto <span class="badge repair">tool pair repaired</span> '
        "tool calls and results made to match. Click a message to open it.</p>"
        "<noscript><p>Without JavaScript the page shows the last turn.</p></noscript>"
        f'<ol id="conversation">{"".join(items)}</ol></section>'
        f'</main><script type="application/json" id="ctxwin-data">{script}</script>'
        f"<script>\n{script_text}</script></body></html>\n"
    )


def _runs(indices: Sequence[int]) -> str:
    """``3-15, 17, 19-40``: sorted indices as runs (the first eight, then how many more)."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and runs[-1][1] == index - 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    shown = ", ".join(f"{a}-{b}" if a < b else f"{a}" for a, b in runs[:8])
    return shown + (f" and {len(runs) - 8} more" if len(runs) > 8 else "")


def _ordered_fold(page: Page, view: ViewState, end: int) -> tuple[int, str] | None:
    """Where in a native view's order the line of its removed messages goes, and the line."""
    assert view.order is not None
    removed = view.removed(end)
    if not removed:
        return None
    chars = sum(message_chars(page.history[index], page.dialect) for index in removed)
    tokens = sum(page.counts.messages[index] for index in removed)
    position = next(
        (at for at, (index, _) in enumerate(view.order) if index > removed[0]), len(view.order)
    )
    return position, (
        f"messages {_runs(removed)} dropped, {chars:,} characters ({tokens:,} tokens)"
    )


def _ordered(page: Page, selected: PageTurn) -> tuple[dict[str, Any], list[str]]:
    """A native page's data and items: the selected view's messages in its order (and the
    line of the messages it removed where they stood), then every other one hidden."""
    folds = [_ordered_fold(page, page.views[turn.view], turn.end) for turn in page.turns]
    fold_of = {turn.view: fold for turn, fold in zip(page.turns, folds, strict=True)}
    data = {
        "turns": [[turn.turn, turn.end, turn.view, turn.estimated] for turn in page.turns],
        "views": [
            {"order": state.order, "fold": fold_of.get(number)}
            for number, state in enumerate(page.views)
        ],
    }
    view = page.views[selected.view]
    assert view.order is not None
    fold = fold_of.get(selected.view)
    items: list[str] = []
    written: set[tuple[int, int | None]] = set()

    def item(index: int, variant: int | None, hidden: bool) -> str:
        written.add((index, variant))
        if variant is None:
            return message_item(
                index, page.history[index], page.counts.messages[index], hidden,
                dialect=page.dialect,
            )  # fmt: skip
        altered = page.variants[variant]
        return message_item(
            index, altered.message, page.counts.variants[variant], hidden, variant,
            altered.kinds, page.dialect, altered.added,
        )  # fmt: skip

    fold_line = '<li id="fold" class="fold"{hidden}><span id="fold-text">{text}</span></li>'
    for position, (index, variant) in enumerate(view.order):
        if fold is not None and fold[0] == position:
            items.append(fold_line.format(hidden="", text=html.escape(fold[1])))
        items.append(item(index, variant, False))
    if fold is not None and fold[0] == len(view.order):
        items.append(fold_line.format(hidden="", text=html.escape(fold[1])))
    elif fold is None:
        items.append(fold_line.format(hidden=" hidden", text=""))
    used = {
        index
        for turn in page.turns
        for index, variant in page.views[turn.view].order or ()
        if variant is None
    }
    by_index: dict[int, list[int]] = {}
    for number, altered in enumerate(page.variants):
        by_index.setdefault(altered.index, []).append(number)
    for index in range(len(page.history)):
        if index in used and (index, None) not in written:
            items.append(item(index, None, True))
        for number in by_index.get(index, []):
            if (index, number) not in written:
                items.append(item(index, number, True))
    return data, items


def _originals_shown(page: Page) -> set[int]:
    """The history indices that some turn's view sends as they are (the others need no copy)."""
    used: set[int] = set()
    for turn in page.turns:
        view = page.views[turn.view]
        keep = view.deleted_range[1] + 1 if view.deleted_range else 2
        for index in (*range(min(2, turn.end)), *range(keep, turn.end)):
            if index not in view.altered and view.sent(index, turn.end):
                used.add(index)
    return used


def _summary(page: Page, turn: PageTurn) -> str:
    view = page.views[turn.view]
    estimate = "" if turn.estimated is None else f" (calibrated estimate {turn.estimated:,})"
    if view.order is not None:
        tokens = sum(
            page.counts.messages[index] if variant is None else page.counts.variants[variant]
            for index, variant in view.order
        )
        return f"{len(view.order)} of {turn.end} messages sent, {tokens:,} tokens counted{estimate}"
    shown = [i for i in range(turn.end) if view.sent(i, turn.end)]
    tokens = sum(
        page.counts.variants[view.altered[i]] if i in view.altered else page.counts.messages[i]
        for i in shown
    )
    return f"{len(shown)} of {turn.end} messages sent, {tokens:,} tokens counted{estimate}"


def _event_row(event: Mapping[str, Any]) -> str:
    turn = event["turn"]
    cell = "" if turn is None else f'<a href="#turn={turn}" data-turn="{turn}">{turn}</a>'
    kind = str(event["kind"])
    css = kind.replace(" ", "-")
    chars = "" if event["chars"] is None else signed(int(event["chars"]))
    tokens = "" if event["tokens"] is None else signed(int(event["tokens"]))
    return (
        f'<tr class="event {html.escape(css)}"><td class="num">{cell}</td>'
        f'<td><span class="kind">{html.escape(kind)}</span></td>'
        f"<td>{html.escape(str(event['what']))}</td>"
        f'<td class="num">{html.escape(chars)}</td><td class="num">{html.escape(tokens)}</td></tr>'
    )


@functools.cache
def _asset(name: str) -> str:
    """A file of this package as text (``page.css``, ``page.js``), read once."""
    return resources.files(_PACKAGE).joinpath(name).read_text(encoding="utf-8")


def _script(ordered: bool) -> str:
    """The page's script for its kind of view. ``page.js`` holds both ways of showing a
    turn, a range (from its ``/* range */`` line) and an order (from ``/* order */`` up to
    ``/* end */``); a page carries the one its views need, without the marker lines."""
    head, rest = _asset("page.js").split("/* range */\n")
    ranged, rest = rest.split("/* order */\n")
    in_order, tail = rest.split("/* end */\n")
    return head + (in_order if ordered else ranged) + tail
