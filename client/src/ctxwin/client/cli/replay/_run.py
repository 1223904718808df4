"""Replay a saved conversation turn by turn through the daemon, as an agent would.

An ``api_conversation_history.json`` is the list of messages of one task. Each
user message is followed by a model request: the agent sends the messages so
far and the previous request's usage to ``prepare_request`` and sends what
comes back. The replay does the same and records every event that changed
what the model would see: a truncation (the deleted range grew) or an
optimisation (stale duplicate file reads replaced, SPEC.md §6).

The usage handed to each next turn is the one recorded in the file only while
it describes the request ctxwin would make: the recorded run sent its own view,
so once ctxwin's view differs (a cut, a replaced read, a repaired tool pair)
the usage of that turn is the daemon's calibrated estimate of ctxwin's view
instead (``usage="auto"``). An estimate fed back leaves the calibration where
it was, so only turns whose views agree calibrate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ctxwin.proto import CLINE, DeletedRange, Model, Usage, now_ms

from ..._sync import Client
from ..._sync_task import Task
from ..._usage import usage_from_metrics
from .._dialects import describe, message_chars, no_request, request_points
from ._events import count_text, count_tokens, counted, cut_from_view, optimisation
from ._report import (
    CALIBRATION_FLOOR,
    OverWindow,
    ReplayEvent,
    ReplayReport,
    ReplayTurn,
)
from ._views import (
    NativeViews,
    Overlay,
    Sources,
    ViewState,
    keeps_content,
    parse_sources,
    parse_updates,
    view_state,
    with_overlay,
)

Progress = Callable[[int, int, DeletedRange], None]
"""Called after each turn with (turns done, turns in all, current range)."""

UsageMode = Literal["recorded", "estimated", "auto"]
"""Where each turn's usage comes from: the file, the daemon's estimate, or the file while
ctxwin's view is the recorded run's and the estimate after."""

USAGE_MODES: tuple[UsageMode, ...] = ("auto", "recorded", "estimated")

_CUT_SIGN = 0.99
"""A recorded prompt under 99% of the one before, though the conversation only grew,
means the recorded run cut its own view (provider counts do not shrink otherwise)."""


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """How a replay runs.

    Attributes:
        task_id: the task to replay into.
        ephemeral: keep the task in memory only (the default).
        file: the file name, for the report.
        progress: called after each turn.
        usage: each turn's usage: ``recorded`` (the file's, else counted),
            ``estimated`` (the daemon's calibrated estimate of ctxwin's view),
            or ``auto``: recorded while ctxwin's view is the whole
            conversation, as the recorded run sent it, estimated from the
            first turn it is not.
        dialect: the history's dialect. In a dialect other than ``cline`` the
            range and the overlay count the engine's internal messages
            (docs/DIALECTS.md): a truncation event keeps the engine's range
            but names the history indices of the messages the cut removed
            from the view (the previous turn's view sent them, as they are
            or rebuilt, and this turn's neither sends nor rebuilds them) and
            counts their savings as that view sent them; an optimisation
            event names the history indices the daemon's ``inspect`` gives
            as the replaced blocks' sources and counts their savings from
            the texts it gives (a block without a source, its history no
            longer held by the daemon, is left out);
            each view is mapped back to the history by :class:`NativeViews`.
        summaries: ``basic``: cut by summary as an auto-condensing agent does
            (docs/SUMMARIES.md): each request asks ``use_auto_condense``, and
            when a summary is due the task is condensed with ctxwin's basic
            summary and its view sent; each attempt is listed in
            :attr:`ReplayReport.summaries` (turn, condensed, reason, range,
            chars, tokens of the summary, tokens before and after).
        strategy: the strategy of every request (docs/STRATEGIES.md).
        pricing: the price sheet (a name or multipliers), or None for the
            model's (docs/PRICING.md); each turn then records its cache figures.
    """

    task_id: str
    ephemeral: bool = True
    file: str = ""
    progress: Progress | None = None
    usage: UsageMode = "auto"
    dialect: str = CLINE
    summaries: str | None = None
    strategy: str = "default"
    pricing: Any = None

    def request_arguments(self) -> dict[str, Any]:
        """What every ``prepare_request`` of the replay asks besides the history and model."""
        arguments: dict[str, Any] = {"estimate": True}
        if self.summaries is not None:
            arguments.update(use_auto_condense=True, summaries=True)
        if self.strategy != "default":
            arguments["strategy"] = self.strategy
        if self.pricing is not None:
            arguments["pricing"] = self.pricing
        return arguments


def replay(
    client: Client,
    history: Sequence[Mapping[str, Any]],
    model: Model,
    options: ReplayOptions,
) -> ReplayReport:
    """Send ``history`` to the daemon turn by turn and record what changed.

    Args:
        client: a connected client.
        history: the whole conversation.
        model: the model the requests go to (its window decides when to cut).
        options: the task, the dialect, where usage comes from, ...

    Returns:
        The report.

    Raises:
        CtxwinError: from the daemon.
        ValueError: ``history`` holds no model request.
    """
    points = request_points(history, options.dialect)
    if not points:
        raise ValueError(no_request(options.dialect))
    # The whole file first: a message the dialect cannot carry is named by its index.
    unrecognised = counted(client, history, options.dialect)[1]
    run = _Run(client, history, model, options, points)
    run.report.unrecognised = unrecognised
    for turn, end in enumerate(points, start=1):
        run.turn(turn, end)
        if options.progress is not None:
            options.progress(turn, len(points), run.deleted_range)
    run.report.final_range = run.deleted_range
    return run.report


def _new_report(
    client: Client,
    history: Sequence[Mapping[str, Any]],
    model: Model,
    options: ReplayOptions,
    turns: int,
) -> ReplayReport:
    info = client.context_window_info(model)
    has_metrics = any(isinstance(m.get("metrics"), Mapping) for m in history)
    return ReplayReport(
        file=options.file,
        messages=len(history),
        turns=turns,
        model=dict(model),
        context_window=int(info["context_window"]),
        max_allowed_size=info["max_allowed_size"],
        usage_source="metrics.tokens" if has_metrics else "count_tokens",
        usage_mode=options.usage,
        dialect=options.dialect,
        strategy=options.strategy,
        pricing=options.pricing,
    )


class _Run:
    """A replay from turn to turn: its task and report, the range and overlay of the view
    the model last saw, the usage handed to the next request, and whether ctxwin's views
    are still the recorded run's.

    Each turn takes these steps, in order: the request (and a condense when a
    summary is due), the view mapped back to the history, its truncation and
    optimisation events, the turn's row, the usage handed on, the window.
    """

    def __init__(
        self,
        client: Client,
        history: Sequence[Mapping[str, Any]],
        model: Model,
        options: ReplayOptions,
        points: Sequence[int],
    ) -> None:
        self.client = client
        self.history = history
        self.model = model
        self.options = options
        self.points = points
        self.dialect = options.dialect
        self.native = options.dialect != CLINE
        self.arguments = options.request_arguments()
        self.report = _new_report(client, history, model, options, len(points))
        self.mapper = NativeViews(history, self.report.variants)
        self.task = Task(
            client,
            options.task_id,
            ephemeral=options.ephemeral,
            dialect=options.dialect if self.native else None,
        )
        start = self.task.inspect()
        self.deleted_range: DeletedRange = start["deleted_range"]
        self.dropped: list[list[int]] = start.get("dropped", [])
        self.overlay = parse_updates(start["updates"])
        self.last_state: ViewState | None = None
        self.clock = now_ms()
        self.previous: Usage | None = None
        self.agrees = True
        self.last_recorded = 0

    def turn(self, turn: int, end: int) -> None:
        """The model request of the history's first ``end`` messages, and what it changed."""
        sent = self._request(turn, end)
        view = sent["messages"]
        new_range = sent["deleted_range"]
        inspected = self.task.inspect()
        overlay = parse_updates(inspected["updates"])
        sources = parse_sources(inspected.get("sources", [])) if self.native else None
        dropped = inspected.get("dropped", [])
        state = self._state(view, end, new_range, overlay, sources, dropped)
        if _hidden_end(new_range) > _hidden_end(self.deleted_range) or _size(dropped) > _size(
            self.dropped
        ):
            self.report.events.append(self._truncation(turn, end, new_range, dropped, state))
        self.deleted_range = new_range
        self.dropped = dropped
        event = optimisation(
            self.client, self.history, self.overlay, overlay, turn, end, new_range, sources
        )
        if event is not None:
            self.report.events.append(event)
        self.overlay = overlay
        self.last_state = state
        row = self._row(turn, end, view, state, sent)
        self._usage(row, end, view)
        self._window(row, sent)
        self.report.per_turn.append(row)
        self.report.last_request_messages = len(view)

    def _request(self, turn: int, end: int) -> dict[str, Any]:
        sent: Any = self.task.prepare_request(
            self.history[:end], self.model, previous_request=self.previous, **self.arguments
        )
        if self.options.summaries is not None and sent.get("summary_due"):
            sent = _condensed(
                self.client, self.task, self.history[:end], self.model, sent, turn, self.report
            )
        return dict(sent)

    def _state(
        self,
        view: Sequence[Mapping[str, Any]],
        end: int,
        deleted_range: DeletedRange,
        overlay: Overlay,
        sources: Sources | None,
        dropped: list[list[int]],
    ) -> ViewState:
        """The view mapped back to the history by its origins (in the Cline dialect, by the
        range alone when a daemon without them sent no deleted set)."""
        origins = self.task.view_origins()
        if sources is None:
            if origins is None and dropped:
                # A view with gaps that came whole: the daemon names its messages' indices.
                origins = self.task.inspect(messages=self.history[:end]).get("origins")
            return view_state(
                self.history, view, deleted_range, overlay, self.report.variants, origins
            )
        if origins is None:  # a view holding no message of the history came whole
            origins = [None] * len(view)
        return self.mapper.state(view, origins, end, deleted_range, overlay, sources)

    def _truncation(
        self,
        turn: int,
        end: int,
        new_range: DeletedRange,
        dropped: list[list[int]],
        state: ViewState,
    ) -> ReplayEvent:
        """The event of a range or a deleted set that grew: the messages the cut removed, as
        the model last saw them (with the previous turn's overlay)."""
        if self.native:
            hidden, removed = cut_from_view(
                self.history, self.report.variants, self.last_state, state, end
            )
        else:
            last = self.last_state
            hidden = [
                index
                for index in range(2, end)
                if not state.sent(index, end) and (last is None or last.sent(index, end))
            ]
            removed = [with_overlay(self.history[index], index, self.overlay) for index in hidden]
        return ReplayEvent(
            turn=turn,
            message=end,
            kind="truncation",
            deleted_range=None if new_range is None else list(new_range),
            dropped=[list(pair) for pair in dropped],
            removed_messages=len(hidden),
            messages=hidden,
            chars_saved=sum(message_chars(message, self.dialect) for message in removed),
            tokens_saved=count_tokens(self.client, removed, self.dialect),
        )

    def _row(
        self,
        turn: int,
        end: int,
        view: Sequence[Mapping[str, Any]],
        state: ViewState,
        sent: Mapping[str, Any],
    ) -> ReplayTurn:
        """The turn's row, its view kept (once per distinct view); the first view that is
        not the recorded run's says so."""
        report = self.report
        if not report.views or report.views[-1] != state:
            report.views.append(state)
        if self.agrees and not self._whole(view, end, state):
            self.agrees = False
            report.differs = f"from turn {turn} ctxwin's view hides or edits messages"
        return ReplayTurn(
            turn=turn,
            sent=len(view),
            estimated=sent.get("estimated_tokens", 0),
            reported=None,
            calibration=sent.get("calibration", 1.0),
            agrees=self.agrees,
            view=len(report.views) - 1,
            messages=end,
            cache=sent.get("cache"),
        )

    def _whole(self, view: Sequence[Mapping[str, Any]], end: int, state: ViewState) -> bool:
        """Whether the view sends the whole conversation as the recorded run did: in another
        dialect every history message as it is, in its place; in Cline's, a repaired pair
        that keeps every recorded block still counts."""
        if len(view) != end:
            return False
        if state.order is not None:
            return state.order == [(index, None) for index in range(end)]
        variants = self.report.variants
        return all(
            keeps_content(self.history[index], variants[number].message)
            for index, number in state.altered.items()
        )

    def _usage(self, row: ReplayTurn, end: int, view: Sequence[Mapping[str, Any]]) -> None:
        """The usage of the request just made, handed to the next (see :class:`ReplayOptions`)."""
        answer = self.history[end] if end < len(self.history) else None
        previous, row.source = _usage_after(
            self.client, answer, view, self.clock + row.turn, self.dialect
        )
        self.previous = previous
        if previous is None:
            return
        usage, report = self.options.usage, self.report
        # A counted usage is of ctxwin's own view; a recorded one of the recorded run's.
        of_this_view = row.source == "counted" or self.agrees
        implausible = False
        if row.source == "recorded":
            row.recorded = input_tokens(previous)
            implausible = (of_this_view or usage == "recorded") and _implausible(
                row.recorded, row.estimated, row.calibration
            )
            if implausible:
                # No count of a request this long: neither reported nor fed back.
                report.implausible.append(row.turn)
                of_this_view = False
            elif self.agrees and 0 < row.recorded < self.last_recorded * _CUT_SIGN:
                # The conversation only grew: the recorded run's view lost messages.
                self.agrees = row.agrees = of_this_view = False
                report.differs = (
                    f"from turn {row.turn} the recorded run sent less: its prompt fell "
                    f"from {self.last_recorded:,} to {row.recorded:,} tokens"
                )
            if not implausible:
                self.last_recorded = row.recorded or self.last_recorded
        if of_this_view:
            row.reported = input_tokens(previous)
        if implausible or usage == "estimated" or (usage == "auto" and not of_this_view):
            previous = self.previous = _estimated_usage(
                self.client, answer, previous, row.estimated, row.calibration, self.dialect
            )
            row.source = "estimated"
            if report.estimated_from is None and not implausible:
                report.estimated_from = row.turn
        row.usage = input_tokens(previous)

    def _window(self, row: ReplayTurn, sent: Mapping[str, Any]) -> None:
        """The peak so far, and whether the request went over the window (and why, first)."""
        report = self.report
        tokens = row.reported if row.reported is not None else row.estimated
        report.peak_tokens = max(report.peak_tokens, tokens)
        if tokens > report.context_window:
            report.over_window.append(row.turn)
            if report.over_window_cause is None:  # the first: what the later ones follow
                report.over_window_cause = _over_window_cause(
                    self.history, sent.get("largest"), row.turn, self.points, tokens, report
                )


def _size(dropped: list[list[int]]) -> int:
    """How many messages a deleted set's inclusive ranges hold."""
    return sum(last - first + 1 for first, last in dropped)


def _hidden_end(deleted_range: DeletedRange) -> int:
    """The last message a range hides (1 for none: ``[2, 1]`` is the empty range)."""
    return deleted_range[1] if deleted_range else 1


def _condensed(
    client: Client,
    task: Task,
    history: Sequence[Mapping[str, Any]],
    model: Model,
    sent: dict[str, Any],
    turn: int,
    report: ReplayReport,
) -> dict[str, Any]:
    """The request after a basic condense (``sent`` itself when it was refused), recorded."""
    done: Any = task.condense(history, model)
    stored = done["summary"]
    report.summaries.append(
        {
            "turn": turn,
            "condensed": done["condensed"],
            "reason": done["reason"],
            "range": None if stored is None else stored["range"],
            "chars": None if stored is None else stored["chars"],
            "tokens": None if stored is None else count_text(client, stored["text"]),
            "tokens_before": done["tokens_before"],
            "tokens_after": done["tokens_after"],
        }
    )
    if not done["condensed"]:
        return sent
    return {
        **sent,
        "messages": done["messages"],
        "deleted_range": done["deleted_range"],
        "estimated_tokens": done["tokens_after"],
    }


def _over_window_cause(
    history: Sequence[Mapping[str, Any]],
    largest: object,
    turn: int,
    points: Sequence[int],
    tokens: int,
    report: ReplayReport,
) -> OverWindow | None:
    """What made a request go over the window: its largest message (the daemon's
    ``largest``), and what would have prevented it."""
    if not isinstance(largest, list) or not largest or not isinstance(largest[0], list):
        return None
    index, size = largest[0][0], largest[0][1]
    if not isinstance(index, int) or not isinstance(size, int) or not 0 <= index < len(history):
        return None
    new = turn == 1 or index >= points[turn - 2]
    over = tokens - report.context_window
    if new and size > over:
        prevent = (
            f"no cut removes the newest messages, and the cline strategy cuts only after a "
            f"request reports its usage: keeping that message under {size - over:,} tokens "
            f"(capping the tool's output), a window of at least {tokens:,} tokens, or "
            'strategy "auto" (which shortens a message too large for the budget) would have '
            "prevented it"
        )
    else:
        prevent = (
            'the cut kept more than the window holds: a deeper cut (strategy "fit" or '
            f'"auto", cutting to the estimate) or a window of at least {tokens:,} tokens '
            "would have prevented it"
        )
    return OverWindow(
        turn, tokens, index, describe(history[index], report.dialect), size, new, prevent
    )


def _implausible(recorded: int, estimated: int, calibration: float) -> bool:
    """Whether a recorded prompt is far below the uncalibrated estimate of its request (see
    :data:`CALIBRATION_FLOOR`)."""
    raw = estimated / calibration if calibration > 0 else estimated
    return recorded < raw * CALIBRATION_FLOOR


def _estimated_usage(
    client: Client,
    answer: Mapping[str, Any] | None,
    recorded: Usage,
    estimated: int,
    calibration: float,
    dialect: str = CLINE,
) -> Usage:
    """The usage the request of ctxwin's own view would have had, by the daemon's estimate."""
    out = count_tokens(client, [answer], dialect) if answer is not None else 0
    return Usage(ts=recorded["ts"], tokens_in=estimated, tokens_out=round(out * calibration))


def _usage_after(
    client: Client,
    answer: Mapping[str, Any] | None,
    sent: Sequence[Mapping[str, Any]],
    fallback_ts: int,
    dialect: str = CLINE,
) -> tuple[Usage | None, str]:
    """The usage of the request just made and its source.

    From the answer's metrics (``recorded``), else counted over the view sent
    (``counted``); ``none`` when no answer follows.
    """
    if answer is None or (dialect == CLINE and answer.get("role") != "assistant"):
        return None, "none"
    ts = answer.get("ts")
    ts = ts if isinstance(ts, int) and not isinstance(ts, bool) and ts >= 0 else fallback_ts
    metrics = answer.get("metrics")
    tokens = metrics.get("tokens") if isinstance(metrics, Mapping) else None
    if isinstance(tokens, Mapping):
        return usage_from_metrics(tokens, ts=ts), "recorded"
    counted = Usage(
        ts=ts,
        tokens_in=count_tokens(client, sent, dialect),
        tokens_out=count_tokens(client, [answer], dialect),
    )
    return counted, "counted"


def input_tokens(usage: Usage) -> int:
    """The prompt side of a usage: what an estimate of the view is compared with."""
    return (
        (usage.get("tokens_in") or 0)
        + (usage.get("cache_writes") or 0)
        + (usage.get("cache_reads") or 0)
    )
