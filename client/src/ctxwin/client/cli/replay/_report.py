"""What a replay found: its events, its turns, its views, and the sentence saying where
each turn's usage came from (:func:`usage_line`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ctxwin.proto import CLINE, DeletedRange

from ._views import Variant, ViewState

CALIBRATION_FLOOR = 0.25
"""The lowest ratio of reported to estimated tokens the daemon's calibration takes: a
recorded prompt under this share of the uncalibrated estimate of the same request counts
something else (a file whose ``metrics.tokens`` are not the request's usage)."""


@dataclass(slots=True)
class ReplayEvent:
    """One change of what the model sees.

    Attributes:
        turn: 1-based number of the model request it happened before.
        message: how many messages the request held.
        kind: ``truncation`` or ``optimisation``.
        deleted_range: the range after the event (truncations); in a dialect
            other than ``cline`` it counts the engine's internal messages.
        removed_messages: messages newly hidden by the range or the deleted
            set (truncations): in a dialect other than ``cline``, the history
            messages the cut removed from the view.
        messages: history indices of the messages concerned: a truncation's
            are those its range newly hid (in a dialect other than ``cline``,
            the history messages the previous turn's view sent and this
            turn's no longer sends, rebuilt ones still counting as sent).
        chars_saved: characters no longer sent.
        tokens_saved: tokens no longer sent (by the daemon's ``count_tokens``).
    """

    turn: int
    message: int
    kind: str
    deleted_range: DeletedRange
    removed_messages: int
    messages: list[int]
    chars_saved: int
    tokens_saved: int
    dropped: list[list[int]] = field(default_factory=list)
    """The deleted set after the event (truncations; ``auto``'s, docs/STRATEGIES.md): the
    inclusive ranges after the range that are not sent either, counted as the range is."""


@dataclass(slots=True)
class ReplayTurn:
    """One model request of the replay: what the daemon estimated and what was reported.

    Attributes:
        turn: 1-based request number.
        sent: messages in the request's view.
        estimated: the daemon's calibrated estimate of the view's tokens.
        reported: the reported input tokens of this view (the file's metrics
            while ctxwin's view is the recorded run's, else counted), or None:
            no answer follows, or the recorded figure belongs to another view.
        calibration: the task's ratio of reported to estimated tokens then.
        recorded: the input tokens the file records for this request (of the
            recorded run's view), or None.
        usage: the input tokens handed to the next turn as this request's usage.
        source: where ``usage`` came from: ``recorded``, ``counted``,
            ``estimated``, or ``none`` (no answer follows).
        agrees: ctxwin sent the whole conversation as the recorded run did: no
            message hidden or edited (a repaired tool pair that keeps every
            recorded block still agrees).
        view: the index of this turn's view in :attr:`ReplayReport.views`.
        messages: the history's length at this request (what the view was made of).
        cache: the view's ``cached_tokens``, ``written_tokens``, ``cost`` and
            ``keep_all_cost`` under the task's price sheet, when one is known
            (docs/PRICING.md).
    """

    turn: int
    sent: int
    estimated: int
    reported: int | None
    calibration: float
    recorded: int | None = None
    usage: int | None = None
    source: str = "none"
    agrees: bool = True
    view: int = 0
    messages: int = 0
    cache: dict[str, Any] | None = None


@dataclass(slots=True)
class OverWindow:
    """The largest message of the first request over the window, and what would prevent it.

    Attributes:
        turn: the request.
        tokens: its input tokens.
        index: the history index of its largest message.
        kind: what that message is (role and content, for people).
        message_tokens: that message's tokens.
        new: the message arrived with this request (no earlier request sent it).
        prevent: what would have kept the request inside the window.
    """

    turn: int
    tokens: int
    index: int
    kind: str
    message_tokens: int
    new: bool
    prevent: str


@dataclass(slots=True)
class ReplayReport:
    """What a replay did, for people (``format``) and machines (``as_dict``)."""

    file: str
    messages: int
    turns: int
    model: dict[str, Any]
    context_window: int
    max_allowed_size: float
    usage_source: str
    events: list[ReplayEvent] = field(default_factory=list)
    per_turn: list[ReplayTurn] = field(default_factory=list)
    final_range: DeletedRange = None
    peak_tokens: int = 0
    last_request_messages: int = 0
    usage_mode: str = "recorded"
    estimated_from: int | None = None
    over_window: list[int] = field(default_factory=list)
    over_window_cause: OverWindow | None = None
    implausible: list[int] = field(default_factory=list)
    differs: str | None = None
    views: list[ViewState] = field(default_factory=list)
    variants: list[Variant] = field(default_factory=list)
    dialect: str = CLINE
    window_source: str = ""
    summaries: list[dict[str, Any]] = field(default_factory=list)
    strategy: str = "default"
    pricing: Any = None
    unrecognised: dict[str, int] = field(default_factory=dict)

    def cost(self) -> dict[str, Any] | None:
        """The cache figures summed over the turns, when the daemon priced them."""
        priced = [turn.cache for turn in self.per_turn if turn.cache is not None]
        if not priced:
            return None
        return {
            "cached_tokens": sum(cache["cached_tokens"] for cache in priced),
            "written_tokens": sum(cache["written_tokens"] for cache in priced),
            "cost": round(sum(cache["cost"] for cache in priced), 3),
            "keep_all_cost": round(sum(cache["keep_all_cost"] for cache in priced), 3),
        }

    def totals(self) -> dict[str, int]:
        """Counts and savings summed over the events."""
        truncations = [event for event in self.events if event.kind == "truncation"]
        optimisations = [event for event in self.events if event.kind == "optimisation"]
        return {
            "truncations": len(truncations),
            "optimisations": len(optimisations),
            "messages_removed": sum(event.removed_messages for event in truncations),
            "chars_saved": sum(event.chars_saved for event in self.events),
            "tokens_saved": sum(event.tokens_saved for event in self.events),
        }

    def as_dict(self) -> dict[str, Any]:
        """The report as plain JSON-able data (the altered messages themselves left out)."""
        data = {
            name: getattr(self, name)
            for name in self.__dataclass_fields__
            if name not in ("events", "per_turn", "views", "variants", "over_window_cause")
        }
        data["events"] = [asdict(event) for event in self.events]
        cause = self.over_window_cause
        data["over_window_cause"] = None if cause is None else asdict(cause)
        data["per_turn"] = [asdict(turn) for turn in self.per_turn]
        data["views"] = [
            {"deleted_range": view.deleted_range, "altered": sorted(view.altered)}
            | ({"dropped": view.dropped} if view.dropped else {})
            for view in self.views
        ]
        for shown, view in zip(data["views"], self.views, strict=True):
            if view.order is not None:
                shown["added"] = sorted(
                    self.variants[number].index
                    for _, number in view.order
                    if number is not None and self.variants[number].added
                )
        data["totals"] = self.totals()
        data["cache"] = self.cost()
        return data

    def view_of(self, turn: ReplayTurn) -> ViewState:
        """The view state a turn was sent with."""
        return self.views[turn.view]


@dataclass(slots=True)
class TokenCounts:
    """Tokens of each history message and of each altered variant (``count_tokens``), and
    the part types of the history the daemon did not recognise, with how many parts of each."""

    messages: list[int]
    variants: list[int]
    unrecognised: dict[str, int] = field(default_factory=dict)


def unrecognised_line(found: Mapping[str, int]) -> str | None:
    """What the token counts made of the content parts ctxwin does not recognise (the
    daemon's ``count_tokens``), in a sentence; None when every part was recognised."""
    if not found:
        return None
    kinds = ", ".join(f"{kind} ({number:,})" for kind, number in sorted(found.items()))
    return (
        f"content parts of a type ctxwin does not recognise: {kinds}; each counted by the "
        "text it holds (its text, content or output, else its compact JSON)"
    )


def usage_line(report: ReplayReport) -> str:
    """Where the usage handed to each turn came from, in a sentence."""
    mode = f"--usage {report.usage_mode}"
    if not report.implausible:
        return _usage_line(report, mode)
    first = next(row for row in report.per_turn if row.turn == report.implausible[0])
    why = (
        f"far below the estimate of the same request (under {CALIBRATION_FLOOR:.0%} of it, "
        f"the calibration's floor; turn {first.turn}: {first.recorded:,} recorded, "
        f"{round(first.estimated / (first.calibration or 1.0)):,} estimated), so they are "
        "not the requests' usage"
    )
    recorded = [row.turn for row in report.per_turn if row.recorded is not None]
    if recorded == report.implausible:
        return (
            "usage: the daemon's estimate of ctxwin's own view on every turn: the file's "
            f"metrics.tokens are {why} ({mode})"
        )
    shown = ", ".join(map(str, report.implausible[:8])) + (
        ", ..." if len(report.implausible) > 8 else ""
    )
    return (
        f"{_usage_line(report, mode)}; but on {len(report.implausible)} turn(s) ({shown}) the "
        f"file's metrics.tokens are {why}: those turns use the daemon's estimate"
    )


def _usage_line(report: ReplayReport, mode: str) -> str:
    if report.usage_source == "count_tokens":
        if report.usage_mode == "estimated":
            return f"usage: the daemon's estimate of ctxwin's own view on every turn ({mode})"
        return f"usage: counted with count_tokens over the view ctxwin sent ({mode})"
    if report.usage_mode == "estimated":
        return (
            "usage: the daemon's estimate of ctxwin's own view on every turn, "
            f"not the file's metrics.tokens ({mode})"
        )
    if report.differs is None:
        return (
            "usage: recorded in the file (metrics.tokens); ctxwin sent the recorded "
            f"run's view on every turn ({mode})"
        )
    if report.usage_mode == "recorded":
        return (
            f"usage: recorded in the file (metrics.tokens) on every turn ({mode}); but "
            f"{report.differs}, so the figures from there on are of a view ctxwin did not send"
        )
    start = report.estimated_from or report.turns
    recorded = f"turns 1-{start - 1}" if start > 2 else "turn 1"
    return (
        f"usage: recorded in the file (metrics.tokens) for {recorded}, while ctxwin's view "
        f"was the recorded run's; {report.differs}, so from there on each turn's usage is "
        f"the daemon's estimate of ctxwin's own view, calibrated on the recorded turns only "
        f"({mode})"
    )
