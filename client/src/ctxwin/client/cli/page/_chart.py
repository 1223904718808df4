"""The chart of a replay's page: tokens per turn as inline SVG."""

from __future__ import annotations

import html

from ..replay import ReplayReport

__all__ = ["chart"]

_W, _H = 980, 320
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 16, 36


def _nice_step(top: float) -> float:
    raw = top / 5
    magnitude = 10 ** (len(str(int(raw))) - 1) if raw >= 1 else 1
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def chart(report: ReplayReport) -> str:
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
