"""``--html``: one self-contained page of what the model saw, turn by turn.

The page holds inline CSS, an inline SVG chart and a few lines of plain
JavaScript (to pick another turn); it loads nothing. Every message of the
history is written once, its body folded; the messages a view altered (a
notice, a replaced file read, a repaired tool pair) are written once per
distinct form. Each turn's view is then a choice of which of them to show,
so a 1.5 MB conversation of 222 turns makes a page of about its own size.
The last turn is rendered as the page loads, so it reads without JavaScript.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cli._dialects import chars_of, message_chars
from .cli.replay import (
    FILE_READ,
    NOTICE,
    REPAIRED,
    SUMMARY,
    ReplayReport,
    TokenCounts,
    Variant,
    ViewState,
    usage_line,
)

__all__ = ["PageTurn", "inspect_page", "page_problem", "replay_page", "write_page"]

_PREVIEW = 140
_BADGES = {NOTICE: "notice", FILE_READ: "read", REPAIRED: "repair", SUMMARY: "summary"}


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


@dataclass(slots=True)
class PageTurn:
    """One selectable turn of the page: how many messages existed and which view was sent."""

    turn: int
    end: int
    view: int
    label: str = ""
    estimated: int | None = None


@dataclass(slots=True)
class _Page:
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
    dialect: str = "cline"


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
                f"range {_range(event.deleted_range)}, {event.removed_messages} messages removed"
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
    events.sort(key=lambda event: (event["turn"], event["kind"] == "over window"))
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
    page = _Page(
        title=f"ctxwin replay: {Path(report.file).name}",
        facts=[
            f"model {report.model.get('id')}",
            f"window {report.context_window:,} tokens",
            f"max allowed {report.max_allowed_size:,}",
            f"{report.turns} turns, {report.messages} messages",
        ],
        notes=[usage_line(report)],
        cards=[
            ("truncations", f"{totals['truncations']}"),
            ("messages removed", f"{totals['messages_removed']}"),
            ("optimisations", f"{totals['optimisations']}"),
            ("tokens saved", _signed(totals["tokens_saved"])),
            ("peak input", f"{report.peak_tokens:,}"),
            ("over the window", f"{len(report.over_window)}"),
            ("messages in the last request", f"{report.last_request_messages} / {report.messages}"),
            *_cost_cards(report),
        ],
        chart=_chart(report),
        events=events,
        turns=turns,
        views=report.views,
        variants=report.variants,
        history=history,
        counts=counts,
        dialect=report.dialect,
    )
    return _render(page)


def inspect_page(
    task: str,
    history: Sequence[Mapping[str, Any]],
    view: ViewState,
    variants: list[Variant],
    counts: TokenCounts,
    edits: Sequence[Mapping[str, Any]],
    dialect: str = "cline",
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

    Returns:
        The HTML text.
    """
    deleted = view.deleted_range
    hidden = 0 if not deleted else max(0, min(deleted[1], len(history) - 1) - 1)
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
    page = _Page(
        title=f"ctxwin task {task}",
        facts=[f"{len(history)} messages", f"range {_range(deleted)}"],
        notes=["The conversation as the model receives it now, under the task's range and edits."],
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
    return _render(page)


def _range(deleted_range: Any) -> str:
    return "none" if not deleted_range else f"[{deleted_range[0]}, {deleted_range[1]}]"


def _list(indices: Sequence[int]) -> str:
    shown = ", ".join(str(index) for index in indices[:8])
    return shown + (f" and {len(indices) - 8} more" if len(indices) > 8 else "")


def _signed(value: int | None) -> str:
    if value is None:
        return ""
    return f"{value:,}" if value >= 0 else f"{value:,} (notice longer than the text)"


# -- the chart -------------------------------------------------------------------

_W, _H = 980, 320
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 16, 36


def _nice_step(top: float) -> float:
    raw = top / 5
    magnitude = 10 ** (len(str(int(raw))) - 1) if raw >= 1 else 1
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def _chart(report: ReplayReport) -> str:
    """Tokens per turn as inline SVG: estimate, reported usage, budget and window, events."""
    rows = report.per_turn
    if not rows:
        return ""
    values = [row.estimated for row in rows] + [row.recorded or 0 for row in rows]
    top = max([*values, report.context_window, int(report.max_allowed_size)]) * 1.08
    step = _nice_step(top)
    count = len(rows)
    width = _W - _LEFT - _RIGHT
    height = _H - _TOP - _BOTTOM

    def x(turn: float) -> float:
        return _LEFT + (turn - 1) / max(count - 1, 1) * width

    def y(tokens: float) -> float:
        return _TOP + height - tokens / top * height

    parts = [
        f'<svg id="chart" viewBox="0 0 {_W} {_H}" role="img" '
        'aria-label="input tokens per turn" xmlns="http://www.w3.org/2000/svg">'
    ]
    tick = 0.0
    while tick <= top:
        parts.append(
            f'<line class="grid" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y(tick):.1f}" '
            f'y2="{y(tick):.1f}"/><text class="axis" x="{_LEFT - 6}" y="{y(tick) + 4:.1f}" '
            f'text-anchor="end">{_short(tick)}</text>'
        )
        tick += step
    every = max(1, round(count / 10 / 5) * 5) if count > 12 else 1
    for turn in range(1, count + 1):
        if turn == 1 or turn % every == 0:
            parts.append(
                f'<text class="axis" x="{x(turn):.1f}" y="{_H - _BOTTOM + 16}" '
                f'text-anchor="middle">{turn}</text>'
            )
    parts.append(
        f'<text class="axis" x="{_LEFT + width / 2:.1f}" y="{_H - 4}" '
        'text-anchor="middle">turn</text>'
    )
    for event in report.events:
        cls = "cut" if event.kind == "truncation" else "opt"
        parts.append(
            f'<line class="{cls}" x1="{x(event.turn):.1f}" x2="{x(event.turn):.1f}" '
            f'y1="{_TOP}" y2="{_TOP + height}"><title>turn {event.turn}: {event.kind}'
            f"</title></line>"
        )
    for tokens, cls, label in (
        (report.context_window, "window", f"window {report.context_window:,}"),
        (report.max_allowed_size, "budget", f"max allowed {report.max_allowed_size:,}"),
    ):
        parts.append(
            f'<line class="{cls}" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y(tokens):.1f}" '
            f'y2="{y(tokens):.1f}"/><text class="{cls}-label" x="{_W - _RIGHT - 4}" '
            f'y="{y(tokens) - 5:.1f}" text-anchor="end">{label}</text>'
        )
    other = [row for row in rows if row.recorded is not None and row.reported is None]
    if other:
        parts.append(_polyline([(x(r.turn), y(r.recorded or 0)) for r in other], "recorded"))
    reported = [row for row in rows if row.reported is not None]
    if reported:
        parts.append(_polyline([(x(r.turn), y(r.reported or 0)) for r in reported], "reported"))
    parts.append(_polyline([(x(r.turn), y(r.estimated)) for r in rows], "estimated"))
    for turn in report.over_window:
        row = rows[turn - 1]
        tokens = row.reported if row.reported is not None else row.estimated
        parts.append(
            f'<circle class="over" cx="{x(turn):.1f}" cy="{y(tokens):.1f}" r="3.5">'
            f"<title>turn {turn}: {tokens:,} tokens, over the window</title></circle>"
        )
    parts.append(
        f'<line id="selected" class="selected" x1="{x(count):.1f}" x2="{x(count):.1f}" '
        f'y1="{_TOP}" y2="{_TOP + height}"/>'
    )
    slot = width / max(count - 1, 1)
    spent = everything = 0.0
    for row in rows:
        cache = ""
        if row.cache is not None:
            spent += row.cache["cost"]
            everything += row.cache["keep_all_cost"]
            cache = (
                f"; {row.cache['cached_tokens']:,} cached, {row.cache['written_tokens']:,} "
                f"written; cost so far {spent:,.0f} (sending everything {everything:,.0f})"
            )
        parts.append(
            f'<rect class="hit" data-turn="{row.turn}" x="{x(row.turn) - slot / 2:.1f}" '
            f'y="{_TOP}" width="{slot:.2f}" height="{height}"><title>turn {row.turn}: '
            f"{row.sent} messages sent, estimate {row.estimated:,}"
            + ("" if row.reported is None else f", reported {row.reported:,}")
            + (
                ""
                if row.recorded is None or row.reported is not None
                else f", recorded (another view) {row.recorded:,}"
            )
            + html.escape(cache)
            + "</title></rect>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _polyline(points: list[tuple[float, float]], cls: str) -> str:
    text = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
    return f'<polyline class="{cls}" points="{text}"/>'


def _short(tokens: float) -> str:
    if tokens >= 1000:
        return f"{tokens / 1000:g}k"
    return f"{tokens:g}"


# -- messages --------------------------------------------------------------------


def _text(value: Any) -> str:
    """A value as text: a string as it is, anything else as indented JSON (compact when
    nested too deeply to indent, a note when too deeply even for that)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, indent=1)
    except RecursionError:
        pass
    try:
        return json.dumps(value, ensure_ascii=False)
    except RecursionError:
        return "(nested too deeply to show)"


def _body(content: Any) -> str:
    """A message's content as HTML: each block a labelled, preformatted part."""
    if isinstance(content, str):
        return f"<pre>{html.escape(content)}</pre>"
    if not isinstance(content, list):
        return f"<pre>{html.escape(_text(content))}</pre>"
    parts: list[str] = []
    for block in content:
        if not isinstance(block, Mapping):
            parts.append(f"<pre>{html.escape(_text(block))}</pre>")
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append(f"<pre>{html.escape(str(block.get('text', '')))}</pre>")
        elif kind == "tool_use":
            parts.append(
                f'<div class="block">tool_use <b>{html.escape(str(block.get("name")))}</b> '
                f"<code>{html.escape(str(block.get('id')))}</code></div>"
                f"<pre>{html.escape(_text(block.get('input')))}</pre>"
            )
        elif kind == "tool_result":
            parts.append(
                '<div class="block">tool_result for '
                f"<code>{html.escape(str(block.get('tool_use_id')))}</code></div>"
                + _body(block.get("content"))
            )
        elif kind == "image":
            source = block.get("source")
            data = source.get("data") if isinstance(source, Mapping) else None
            size = len(data) if isinstance(data, str) else 0
            parts.append(f'<div class="block">image ({size:,} base64 characters, not shown)</div>')
        else:
            parts.append(
                f'<div class="block">{html.escape(str(kind))}</div>'
                f"<pre>{html.escape(_text(block))}</pre>"
            )
    return "".join(parts) or '<div class="block">(no content)</div>'


def _preview(content: Any) -> str:
    """The first words of a message: its text first, then tool calls, then tool results."""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        blocks = [block for block in content if isinstance(block, Mapping)]
        order = {"text": 0, "tool_use": 1, "image": 2, "tool_result": 3}
        pieces: list[str] = []
        for block in sorted(blocks, key=lambda block: order.get(str(block.get("type")), 4)):
            kind = block.get("type")
            if kind == "text":
                pieces.append(str(block.get("text", "")))
            elif kind == "tool_use":
                pieces.append(f"[{block.get('name')}]")
            elif kind == "tool_result":
                pieces.append("[result] " + _preview(block.get("content")))
            elif kind == "image":
                pieces.append("[image]")
            if sum(len(piece) for piece in pieces) > _PREVIEW:
                break
        text = " ".join(pieces)
    else:
        text = ""
    text = " ".join(text.split())
    return text if len(text) <= _PREVIEW else text[: _PREVIEW - 1] + "…"


# -- messages of the other dialects ---------------------------------------------

_MODEL_SIDE = {"assistant", "model"}
"""Roles of the model's own messages (drawn as the assistant's)."""


def _block(label: str, name: Any = None, code: Any = None) -> str:
    """A part's label line: its kind, a name in bold, an id in code."""
    text = html.escape(label)
    if name is not None:
        text += f" <b>{html.escape(str(name))}</b>"
    if code is not None:
        text += f" <code>{html.escape(str(code))}</code>"
    return f'<div class="block">{text}</div>'


def _pre(value: Any) -> str:
    return f"<pre>{html.escape(_text(value))}</pre>"


def _arguments(value: Any) -> str:
    """A call's arguments: a JSON string shown indented when it parses, else as it is."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):  # not JSON, or nested too deeply to parse here
            return _pre(value)
    return _pre(value)


def _other(part: Any, kind: Any) -> str:
    return _block(str(kind)) + _pre(part)


def _parts(content: Any, render: Any) -> str:
    """A string content as text, a list as each part rendered by ``render``."""
    if isinstance(content, str):
        return _pre(content)
    if content is None:
        return ""
    if not isinstance(content, list):
        return _pre(content)
    return "".join(render(part) if isinstance(part, Mapping) else _pre(part) for part in content)


def _media(label: str, part: Mapping[str, Any]) -> str:
    """An image, audio or file part: what it is, never its data."""
    for key in ("source", "image_url", "input_audio", "file", "inlineData", "inline_data"):
        inner = part.get(key)
        if isinstance(inner, Mapping):
            data = inner.get("data") or inner.get("file_data")
            if isinstance(data, str):
                return _block(f"{label} ({len(data):,} base64 characters, not shown)")
            url = inner.get("url") or inner.get("file_id") or inner.get("fileUri")
            if isinstance(url, str):
                return _block(label, code=url[:200])
        elif isinstance(inner, str):
            return _block(label, code=inner[:200])
    return _block(f"{label} (not shown)")


def _chat_part(part: Mapping[str, Any]) -> str:
    kind = part.get("type")
    if kind == "text":
        return _pre(part.get("text", ""))
    if kind == "refusal":
        return _block("refusal") + _pre(part.get("refusal", ""))
    if kind in ("image_url", "input_audio", "file"):
        return _media(str(kind).replace("_url", "").replace("input_", ""), part)
    return _other(part, kind)


def _chat_body(message: Mapping[str, Any]) -> str:
    """An OpenAI Chat message: its content, reasoning, tool calls, or the call it answers."""
    parts: list[str] = []
    if message.get("role") == "tool":
        parts.append(_block("result for", code=message.get("tool_call_id")))
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        parts.append(_block("reasoning") + _pre(reasoning))
    parts.append(_parts(message.get("content"), _chat_part))
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        parts.append(_block("refusal") + _pre(refusal))
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        if not isinstance(call, Mapping):
            continue
        inner = call.get("function") or call.get("custom")
        inner = inner if isinstance(inner, Mapping) else {}
        parts.append(_block("tool call", inner.get("name"), call.get("id")))
        parts.append(_arguments(inner.get("arguments", inner.get("input"))))
    return "".join(parts)


def _anthropic_part(part: Mapping[str, Any]) -> str:
    kind = part.get("type")
    if kind == "text":
        return _pre(part.get("text", ""))
    if kind in ("tool_use", "server_tool_use"):
        return _block(str(kind), part.get("name"), part.get("id")) + _pre(part.get("input"))
    if kind == "tool_result" or str(kind).endswith("_tool_result"):
        error = " (error)" if part.get("is_error") else ""
        return _block(f"{kind}{error} for", code=part.get("tool_use_id")) + _parts(
            part.get("content"), _anthropic_part
        )
    if kind == "thinking":
        return _block("thinking") + _pre(part.get("thinking", ""))
    if kind == "redacted_thinking":
        data = part.get("data")
        size = len(data) if isinstance(data, str) else 0
        return _block(f"redacted thinking ({size:,} characters, not shown)")
    if kind in ("image", "document"):
        return _media(str(kind), part)
    return _other(part, kind)


def _responses_part(part: Mapping[str, Any]) -> str:
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
        return _pre(part.get("text", ""))
    if kind == "refusal":
        return _block("refusal") + _pre(part.get("refusal", ""))
    if kind in ("input_image", "input_file", "input_audio"):
        return _media(str(kind).replace("input_", ""), part)
    return _other(part, kind)


def _responses_body(item: Mapping[str, Any]) -> str:
    """An OpenAI Responses item: a message, a call, its output, reasoning, or another item."""
    kind = item.get("type", "message")
    if kind == "message":
        return _parts(item.get("content"), _responses_part)
    if kind in ("function_call", "custom_tool_call"):
        label = kind.replace("_", " ")
        arguments = item.get("arguments", item.get("input"))
        return _block(label, item.get("name"), item.get("call_id")) + _arguments(arguments)
    if isinstance(kind, str) and kind.endswith("_call_output"):
        output = item.get("output")
        return _block(kind.replace("_", " ") + " for", code=item.get("call_id")) + _parts(
            output, _responses_part
        )
    if kind == "reasoning":
        parts = [_block("reasoning")]
        for key in ("summary", "content"):
            inner = item.get(key)
            if isinstance(inner, list):
                parts.append(_parts(inner, _responses_part))
        if item.get("encrypted_content"):
            parts.append(_block("encrypted reasoning (not shown)"))
        return "".join(parts)
    return _other(item, kind)


def _gemini_part(part: Mapping[str, Any]) -> str:
    call = part.get("functionCall", part.get("function_call"))
    if isinstance(call, Mapping):
        return _block("functionCall", call.get("name"), call.get("id")) + _pre(call.get("args"))
    answer = part.get("functionResponse", part.get("function_response"))
    if isinstance(answer, Mapping):
        return _block("functionResponse", answer.get("name"), answer.get("id")) + _pre(
            answer.get("response")
        )
    text = part.get("text")
    if isinstance(text, str):
        return (_block("thought") if part.get("thought") else "") + _pre(text)
    for key in ("inlineData", "inline_data", "fileData", "file_data"):
        if isinstance(part.get(key), Mapping):
            return _media("data", part)
    return _other(part, next(iter(part), "part"))


def _native_body(message: Mapping[str, Any], dialect: str) -> str:
    """A message of a dialect other than ``cline`` as HTML, each part labelled."""
    if dialect == "openai-chat":
        body = _chat_body(message)
    elif dialect == "openai-responses":
        body = _responses_body(message)
    elif dialect == "gemini":
        body = _parts(message.get("parts"), _gemini_part)
    else:
        body = _parts(message.get("content"), _anthropic_part)
    return body or '<div class="block">(no content)</div>'


def _pieces(value: Any, found: list[tuple[int, str]], result: bool = False) -> None:
    """What a preview shows of a part, with its order: texts, calls, media, results."""
    if isinstance(value, str):
        found.append((3 if result else 0, value))
        return
    if isinstance(value, list):
        for item in value:
            _pieces(item, found, result)
        return
    if not isinstance(value, Mapping):
        return
    kind = value.get("type")
    call = value.get("functionCall", value.get("function_call"))
    answer = value.get("functionResponse", value.get("function_response"))
    function = value.get("function")
    if isinstance(call, Mapping):
        found.append((1, f"[{call.get('name')}]"))
    elif isinstance(answer, Mapping):
        found.append((3, f"[result] {_text(answer.get('response'))}"))
    elif kind in ("tool_use", "server_tool_use", "function_call", "custom_tool_call"):
        found.append((1, f"[{value.get('name')}]"))
    elif isinstance(function, Mapping):
        found.append((1, f"[{function.get('name')}]"))
    elif kind == "tool_result" or (isinstance(kind, str) and kind.endswith("_output")):
        inner: list[tuple[int, str]] = []
        _pieces(value.get("content", value.get("output")), inner, True)
        found.append((3, "[result] " + " ".join(text for _, text in inner)))
    elif kind in ("image", "image_url", "input_image") or "inlineData" in value:
        found.append((2, "[image]"))
    elif kind in ("thinking", "redacted_thinking", "reasoning") or value.get("thought"):
        return  # the model's reasoning: not what the message says
    elif isinstance(value.get("text"), str):
        found.append((3 if result else 0, str(value["text"])))
    elif "content" in value:
        _pieces(value["content"], found, result)


def _native_preview(message: Mapping[str, Any], dialect: str) -> str:
    """The first words of a message of another dialect: text, then calls, then results."""
    found: list[tuple[int, str]] = []
    if dialect == "openai-chat" and message.get("role") == "tool":
        _pieces(message.get("content"), found, True)
        found = [(3, "[result] " + " ".join(text for _, text in found))]
    elif dialect == "openai-responses" and message.get("type", "message") != "message":
        _pieces(message, found)
    else:
        _pieces(message.get("parts", message.get("content")), found)
        _pieces(message.get("tool_calls"), found)
    pieces: list[str] = []
    for _, piece in sorted(found, key=lambda item: item[0]):
        pieces.append(piece)
        if sum(len(text) for text in pieces) > _PREVIEW:
            break
    text = " ".join(" ".join(pieces).split())
    return text if len(text) <= _PREVIEW else text[: _PREVIEW - 1] + "…"


def _role(message: Mapping[str, Any], dialect: str) -> tuple[str, str]:
    """A message's label and its CSS class (``assistant`` for the model's side)."""
    role = message.get("role")
    kind = message.get("type")
    label = str(role) if role is not None else str(kind or "?")
    if dialect == "openai-responses" and kind not in (None, "message"):
        label = str(kind)
        side = "user" if str(kind).endswith("_output") else "assistant"
    else:
        side = "assistant" if role in _MODEL_SIDE else str(role)
    return label, side


def _message(
    index: int,
    message: Mapping[str, Any],
    tokens: int,
    hidden: bool,
    variant: int | None = None,
    kinds: Sequence[str] = (),
    dialect: str = "cline",
    added: bool = False,
) -> str:
    badges = "".join(
        f'<span class="badge {_BADGES.get(kind, "other")}">{html.escape(kind)}</span>'
        for kind in kinds
    )
    if dialect == "cline":
        role = css = str(message.get("role", "?"))
        content = message.get("content")
        chars, preview, body = chars_of(content), _preview(content), _body(content)
    else:
        role, css = _role(message, dialect)
        chars = message_chars(message, dialect)
        preview = _native_preview(message, dialect)
        body = _native_body(message, dialect)
    attributes = f'class="msg {html.escape(css)}" data-i="{index}" data-t="{tokens}"'
    if variant is not None:
        attributes += f' data-v="{variant}"'
    if hidden:
        attributes += " hidden"
    number = (
        f'<span class="idx" title="added by the view">+#{index}</span>'
        if added
        else f'<span class="idx">#{index}</span>'
    )
    return (
        f"<li {attributes}><details><summary>"
        f'{number}<span class="role">{html.escape(role)}</span>'
        f'<span class="tok">{tokens:,} tok</span>'
        f'<span class="chars">{chars:,} chars</span>{badges}'
        f'<span class="preview">{html.escape(preview)}</span>'
        f"</summary>{body}</details></li>"
    )


def _fold(view: ViewState, page: _Page, end: int) -> tuple[str, bool]:
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


# -- the page --------------------------------------------------------------------


def _render(page: _Page) -> str:
    selected = page.turns[-1]
    view = page.views[selected.view]
    if page.dialect != "cline":
        return _frame(page, selected, *_ordered(page, selected), _JS_ORDERED)
    keep = view.deleted_range[1] + 1 if view.deleted_range else 2
    data = {
        "turns": [[turn.turn, turn.end, turn.view, turn.estimated] for turn in page.turns],
        "views": [
            {
                "keep": state.deleted_range[1] + 1 if state.deleted_range else 2,
                "last": state.deleted_range[1] if state.deleted_range else 1,
                "altered": {str(index): variant for index, variant in state.altered.items()},
            }
            for state in page.views
        ],
        "chars": [chars_of(message.get("content")) for message in page.history],
        "tokens": page.counts.messages,
    }
    items: list[str] = []
    used = _originals_shown(page)
    by_index: dict[int, list[int]] = {}
    for number, variant in enumerate(page.variants):
        by_index.setdefault(variant.index, []).append(number)
    for index, message in enumerate(page.history):
        in_view = index < selected.end and (index < 2 or index >= keep)
        if index in used:
            items.append(
                _message(
                    index,
                    message,
                    page.counts.messages[index],
                    not in_view or index in view.altered,
                )
            )
        for number in by_index.get(index, []):
            variant = page.variants[number]
            items.append(
                _message(
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
    return _frame(page, selected, data, items, _JS)


def _frame(
    page: _Page, selected: PageTurn, data: dict[str, Any], items: list[str], script_text: str
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
        f"<style>{_CSS}</style></head><body><main>"
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
        'file read replaced by a notice <span class="badge repair">tool pair repaired</span> '
        "tool calls and results made to match. Click a message to open it.</p>"
        "<noscript><p>Without JavaScript the page shows the last turn.</p></noscript>"
        f'<ol id="conversation">{"".join(items)}</ol></section>'
        f'</main><script type="application/json" id="ctxwin-data">{script}</script>'
        f"<script>{script_text}</script></body></html>\n"
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


def _ordered_fold(page: _Page, view: ViewState, end: int) -> tuple[int, str] | None:
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


def _ordered(page: _Page, selected: PageTurn) -> tuple[dict[str, Any], list[str]]:
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
            return _message(
                index, page.history[index], page.counts.messages[index], hidden,
                dialect=page.dialect,
            )  # fmt: skip
        altered = page.variants[variant]
        return _message(
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


def _originals_shown(page: _Page) -> set[int]:
    """The history indices that some turn's view sends as they are (the others need no copy)."""
    used: set[int] = set()
    for turn in page.turns:
        view = page.views[turn.view]
        keep = view.deleted_range[1] + 1 if view.deleted_range else 2
        for index in (*range(min(2, turn.end)), *range(keep, turn.end)):
            if index not in view.altered:
                used.add(index)
    return used


def _summary(page: _Page, turn: PageTurn) -> str:
    view = page.views[turn.view]
    estimate = "" if turn.estimated is None else f" (calibrated estimate {turn.estimated:,})"
    if view.order is not None:
        tokens = sum(
            page.counts.messages[index] if variant is None else page.counts.variants[variant]
            for index, variant in view.order
        )
        return f"{len(view.order)} of {turn.end} messages sent, {tokens:,} tokens counted{estimate}"
    keep = view.deleted_range[1] + 1 if view.deleted_range else 2
    shown = [i for i in range(turn.end) if i < 2 or i >= keep]
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
    chars = "" if event["chars"] is None else _signed(int(event["chars"]))
    tokens = "" if event["tokens"] is None else _signed(int(event["tokens"]))
    return (
        f'<tr class="event {html.escape(css)}"><td class="num">{cell}</td>'
        f'<td><span class="kind">{html.escape(kind)}</span></td>'
        f"<td>{html.escape(str(event['what']))}</td>"
        f'<td class="num">{html.escape(chars)}</td><td class="num">{html.escape(tokens)}</td></tr>'
    )


_CSS = """
:root{--ink:#1d2330;--mute:#667085;--line:#e4e7ec;--bg:#f7f8fa;--card:#fff;
--est:#2563eb;--rep:#059669;--rec:#98a2b3;--budget:#dc2626;--cut:#f59e0b;--opt:#7c3aed}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);
font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1040px;margin:0 auto;padding:28px 24px 60px}
h1{font-size:24px;margin:0 0 4px}
h2{font-size:17px;margin:0 0 12px}
.facts{color:var(--mute);margin:0 0 8px}
.note{margin:4px 0;padding:8px 12px;background:#eef4ff;border-left:3px solid var(--est);
border-radius:4px;font-size:14px}
section{background:var(--card);border:1px solid var(--line);border-radius:10px;
padding:18px 20px;margin:18px 0}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:18px 0}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;
padding:10px 14px;min-width:120px;flex:1}
.card .value{font-size:20px;font-weight:600;font-variant-numeric:tabular-nums}
.card .label{color:var(--mute);font-size:13px}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;font-size:13px;color:var(--mute);
margin-bottom:6px;align-items:center}
.key{display:inline-block;width:18px;height:0;border-top:3px solid;margin-right:5px;
vertical-align:middle}
.key.estimated{border-color:var(--est)}.key.reported{border-color:var(--rep)}
.key.recorded{border-color:var(--rec);border-top-style:dotted}
.key.budget{border-color:var(--budget);border-top-style:dashed}
.key.cut{border-color:var(--cut)}.key.opt{border-color:var(--opt)}
.dot{display:inline-block;width:9px;height:9px;border-radius:50%;background:var(--budget);
margin-right:5px}
.chart svg{width:100%;height:auto;display:block}
.grid{stroke:var(--line);stroke-width:1}
.axis{fill:var(--mute);font-size:11px}
.window{stroke:#475467;stroke-width:1.2}.window-label{fill:#475467;font-size:11px}
.budget{stroke:var(--budget);stroke-width:1.5;stroke-dasharray:6 4}
.budget-label{fill:var(--budget);font-size:11px}
.cut{stroke:var(--cut);stroke-width:1.2;opacity:.6}
.opt{stroke:var(--opt);stroke-width:1.2;stroke-dasharray:2 3;opacity:.7}
polyline{fill:none;stroke-width:2;stroke-linejoin:round}
polyline.estimated{stroke:var(--est)}polyline.reported{stroke:var(--rep)}
polyline.recorded{stroke:var(--rec);stroke-dasharray:2 3}
.over{fill:var(--budget)}
.selected{stroke:var(--ink);stroke-width:1;stroke-dasharray:3 3}
.hit{fill:transparent;cursor:pointer}.hit:hover{fill:rgba(37,99,235,.08)}
.hint{color:var(--mute);font-size:12px;margin:6px 0 0}
table{border-collapse:collapse;width:100%;font-size:14px}
.scroll{max-height:360px;overflow:auto}
thead th{position:sticky;top:0;background:var(--card)}
th{text-align:left;color:var(--mute);font-weight:500;border-bottom:1px solid var(--line);
padding:6px 8px}
td{border-bottom:1px solid var(--line);padding:6px 8px;vertical-align:top}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.none{color:var(--mute)}
.kind{font-size:12px;padding:1px 8px;border-radius:10px;background:#f2f4f7;white-space:nowrap}
.truncation .kind{background:#fef3c7;color:#92400e}
.optimisation .kind{background:#ede9fe;color:#5b21b6}
.over-window .kind{background:#fee2e2;color:#991b1b}
a{color:var(--est)}
.pick{display:flex;gap:10px;align-items:center;flex-wrap:wrap;margin-bottom:6px}
select{font:inherit;padding:3px 6px}
#view-summary{color:var(--mute)}
.legend-line{font-size:13px;color:var(--mute);margin:4px 0 12px}
ol#conversation{list-style:none;margin:0;padding:0}
li.msg{border:1px solid var(--line);border-left:4px solid #c7d2fe;border-radius:6px;
margin:4px 0;background:#fff}
li.msg.assistant{border-left-color:#d0d5dd;background:#fcfcfd}
li.msg summary{display:flex;gap:10px;align-items:baseline;padding:5px 10px;cursor:pointer;
list-style:none;white-space:nowrap;overflow:hidden}
li.msg summary::-webkit-details-marker{display:none}
.idx{color:var(--mute);font-variant-numeric:tabular-nums;min-width:38px}
.role{font-weight:600;min-width:64px}
.tok,.chars{color:var(--mute);font-size:12px;font-variant-numeric:tabular-nums;min-width:78px;
text-align:right;flex:none}
.idx,.role,.badge{flex:none}
.preview{overflow:hidden;text-overflow:ellipsis;color:#344054;font-size:14px}
.badge{font-size:11px;padding:1px 7px;border-radius:9px;white-space:nowrap}
.badge.notice{background:#fef3c7;color:#92400e}
.badge.read{background:#ede9fe;color:#5b21b6}
.badge.repair{background:#fee2e2;color:#991b1b}
.badge.summary{background:#dcfce7;color:#166534}
li.fold{margin:6px 0;padding:8px 12px;border:1px dashed #f59e0b;border-radius:6px;
background:repeating-linear-gradient(135deg,#fffbeb,#fffbeb 8px,#fef3c7 8px,#fef3c7 16px);
color:#92400e;font-weight:500}
details pre{margin:0;padding:8px 12px;white-space:pre-wrap;word-break:break-word;
font:12.5px/1.45 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;
background:#f9fafb;border-top:1px solid var(--line);max-height:480px;overflow:auto}
.block{padding:4px 12px;font-size:12px;color:var(--mute);border-top:1px solid var(--line)}
[hidden]{display:none!important}
"""

_JS_OPEN = """
(function () {
  var data = JSON.parse(document.getElementById("ctxwin-data").textContent);
  var select = document.getElementById("turn");
  var items = document.querySelectorAll("#conversation li.msg");
  var fold = document.getElementById("fold");
  var mark = document.getElementById("selected");
  function fmt(n) { return n.toLocaleString("en-US"); }
  function show(k) {
    var t = data.turns[k], end = t[1], view = data.views[t[2]];
    var sent = 0, tokens = 0;
"""

_JS_RANGE = """    for (var n = 0; n < items.length; n++) {
      var li = items[n], i = +li.dataset.i, v = li.dataset.v;
      var want = view.altered[i];
      var inView = i < end && (i < 2 || i >= view.keep);
      var on = inView && (v === undefined ? want === undefined : +v === want);
      li.hidden = !on;
      if (on) { sent++; tokens += +li.dataset.t; }
    }
    var last = Math.min(view.last, end - 1);
    if (last >= 2) {
      var chars = 0, dropped = 0;
      for (var j = 2; j <= last; j++) { chars += data.chars[j]; dropped += data.tokens[j]; }
      document.getElementById("fold-text").textContent = "messages 2-" + last +
        " dropped, " + fmt(chars) + " characters (" + fmt(dropped) + " tokens)";
      fold.hidden = false;
    } else {
      fold.hidden = true;
    }
"""

_JS_ORDER = """
    var list = document.getElementById("conversation"), keyed = {}, order = view.order;
    for (var n = 0; n < items.length; n++) {
      var item = items[n];
      item.hidden = true;
      keyed[item.dataset.i + "/" + (item.dataset.v === undefined ? "" : item.dataset.v)] = item;
    }
    fold.hidden = true;
    for (var p = 0; p <= order.length; p++) {
      if (view.fold && view.fold[0] === p) {
        document.getElementById("fold-text").textContent = view.fold[1];
        fold.hidden = false;
        list.appendChild(fold);
      }
      if (p === order.length) { break; }
      var li = keyed[order[p][0] + "/" + (order[p][1] === null ? "" : order[p][1])];
      li.hidden = false;
      list.appendChild(li);
      sent++; tokens += +li.dataset.t;
    }
"""

_JS_CLOSE = """    document.getElementById("view-summary").textContent = sent + " of " + end +
      " messages sent, " + fmt(tokens) + " tokens counted" +
      (t[3] === null ? "" : " (calibrated estimate " + fmt(t[3]) + ")");
    select.value = String(k);
    if (mark) {
      var hit = document.querySelector('.hit[data-turn="' + t[0] + '"]');
      if (hit) {
        var x = (+hit.getAttribute("x") + (+hit.getAttribute("width")) / 2).toFixed(1);
        mark.setAttribute("x1", x); mark.setAttribute("x2", x);
      }
    }
  }
  function pick(turn) {
    for (var k = 0; k < data.turns.length; k++) {
      if (data.turns[k][0] === turn) { show(k); return true; }
    }
    return false;
  }
  select.addEventListener("change", function () { show(+select.value); });
  document.addEventListener("click", function (e) {
    var el = e.target.closest ? e.target.closest("[data-turn]") : null;
    if (el) { e.preventDefault(); pick(+el.getAttribute("data-turn"));
      history.replaceState(null, "", "#turn=" + el.getAttribute("data-turn")); }
  });
  var m = /turn=(\\d+)/.exec(location.hash);
  if (!(m && pick(+m[1]))) { show(data.turns.length - 1); }
})();
"""

_JS = _JS_OPEN + _JS_RANGE + _JS_CLOSE
"""The script of a Cline page: a turn's view is the range with its altered messages."""

_JS_ORDERED = _JS_OPEN + _JS_ORDER.removeprefix("\n") + _JS_CLOSE
"""The script of a page of another dialect: each view lists its messages in order."""
