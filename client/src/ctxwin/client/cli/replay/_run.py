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
from typing import Any, Literal

from ctxwin.proto import CLINE, DeletedRange, Model, Usage, now_ms

from ..._sync import Client
from ..._task import Task
from ..._usage import usage_from_metrics
from .._dialects import describe, message_chars, no_request, request_points
from ._report import (
    CALIBRATION_FLOOR,
    OverWindow,
    ReplayEvent,
    ReplayReport,
    ReplayTurn,
    TokenCounts,
)
from ._views import (
    NOTICE_EDIT,
    NativeViews,
    Overlay,
    Sources,
    Variant,
    ViewState,
    keeps_content,
    original_text,
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


def _tokens(client: Client, messages: Sequence[Mapping[str, Any]], dialect: str = CLINE) -> int:
    if not messages:
        return 0
    if dialect == CLINE:
        return client.count_tokens(list(messages))["tokens"]
    return client.count_tokens(list(messages), dialect=dialect)["tokens"]


def _cut_from_view(
    history: Sequence[Mapping[str, Any]],
    variants: Sequence[Variant],
    before: ViewState | None,
    after: ViewState,
    end: int,
) -> tuple[list[int], list[Mapping[str, Any]]]:
    """What a native view's cut removed: the history indices of the messages the view
    ``before`` sent (as they are or rebuilt) that the view ``after``, of the history's
    first ``end`` messages, neither sends nor rebuilds, and those messages as ``before``
    sent them, in its order.

    A message only rebuilt by ``after`` (the notice put in it, a repaired pair) is still
    sent and not named; a message ``before`` added (a filled-in result) stands for no
    history message and is not counted. Before the first view (``before`` None) nothing
    was sent.
    """
    if before is None or before.order is None:
        return [], []
    gone = set(after.removed(end))
    removed: list[Mapping[str, Any]] = []
    named: set[int] = set()
    for index, number in before.order:
        if index not in gone:
            continue
        if number is None:
            removed.append(history[index])
        elif not variants[number].added:
            removed.append(variants[number].message)
        else:
            continue
        named.add(index)
    return sorted(named), removed


def _text_tokens(client: Client, text: str) -> int:
    return client.count_tokens(text=text)["tokens"] if text else 0


def replay(
    client: Client,
    history: Sequence[Mapping[str, Any]],
    model: Model,
    *,
    task_id: str,
    ephemeral: bool = True,
    file: str = "",
    progress: Progress | None = None,
    usage: UsageMode = "auto",
    dialect: str = CLINE,
    summaries: str | None = None,
    strategy: str = "default",
    pricing: Any = None,
) -> ReplayReport:
    """Send ``history`` to the daemon turn by turn and record what changed.

    Args:
        client: a connected client.
        history: the whole conversation.
        model: the model the requests go to (its window decides when to cut).
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

    Returns:
        The report.

    Raises:
        CtxwinError: from the daemon.
        ValueError: ``history`` holds no model request.
    """
    points = request_points(history, dialect)
    if not points:
        raise ValueError(no_request(dialect))
    if history:
        # The whole file first: a message the dialect cannot carry is named by its index.
        _tokens(client, history, dialect)
    info = client.context_window_info(model)
    has_metrics = any(isinstance(m.get("metrics"), Mapping) for m in history)
    report = ReplayReport(
        file=file,
        messages=len(history),
        turns=len(points),
        model=dict(model),
        context_window=int(info["context_window"]),
        max_allowed_size=info["max_allowed_size"],
        usage_source="metrics.tokens" if has_metrics else "count_tokens",
        usage_mode=usage,
        dialect=dialect,
        strategy=strategy,
        pricing=pricing,
    )
    native = dialect != CLINE
    mapper = NativeViews(history, report.variants)
    task = Task(client, task_id, ephemeral=ephemeral, dialect=dialect if native else None)
    last_state: ViewState | None = None
    start = task.inspect()
    deleted_range: DeletedRange = start["deleted_range"]
    overlay = parse_updates(start["updates"])
    clock = now_ms()
    previous: Usage | None = None
    agrees = True
    last_recorded = 0
    options: dict[str, Any] = {"estimate": True}
    if strategy != "default":
        options["strategy"] = strategy
    if pricing is not None:
        options["pricing"] = pricing
    for turn, end in enumerate(points, start=1):
        sent: Any = task.prepare_request(
            history[:end],
            model,
            previous_request=previous,
            use_auto_condense=True if summaries is not None else None,
            summaries=True if summaries is not None else None,
            **options,
        )
        if summaries is not None and sent.get("summary_due"):
            sent = _condensed(client, task, history[:end], model, sent, turn, report, dialect)
        view = sent["messages"]
        new_range = sent["deleted_range"]
        inspected = task.inspect()
        now = parse_updates(inspected["updates"])
        sources = parse_sources(inspected.get("sources", [])) if native else None
        if sources is not None:
            origins = task.view_origins()
            if origins is None:  # a view holding no message of the history came whole
                origins = [None] * len(view)
            state = mapper.state(view, origins, end, new_range, now, sources)
        else:
            state = view_state(history, view, new_range, now, report.variants)
        if new_range != deleted_range and new_range is not None:
            # As the model last saw them: with the overlay of the previous turn.
            if native:
                hidden, removed = _cut_from_view(history, report.variants, last_state, state, end)
            else:
                first = deleted_range[1] + 1 if deleted_range else 2
                hidden = list(range(first, new_range[1] + 1))
                removed = [with_overlay(history[index], index, overlay) for index in hidden]
            report.events.append(
                ReplayEvent(
                    turn=turn,
                    message=end,
                    kind="truncation",
                    deleted_range=list(new_range),
                    removed_messages=len(hidden),
                    messages=hidden,
                    chars_saved=sum(message_chars(message, dialect) for message in removed),
                    tokens_saved=_tokens(client, removed, dialect),
                )
            )
        deleted_range = new_range
        event = _optimisation(client, history, overlay, now, turn, end, deleted_range, sources)
        if event is not None:
            report.events.append(event)
        overlay = now
        last_state = state
        if sources is not None:
            same = len(view) == end and all(
                sent_message is original or sent_message == original
                for sent_message, original in zip(view, history, strict=False)
            )
        else:
            same = len(view) == end and all(
                keeps_content(history[index], report.variants[number].message)
                for index, number in state.altered.items()
            )
        if not report.views or report.views[-1] != state:
            report.views.append(state)
        if agrees and not same:
            agrees = False
            report.differs = f"from turn {turn} ctxwin's view hides or edits messages"
        estimated = sent.get("estimated_tokens", 0)
        calibration = sent.get("calibration", 1.0)
        row = ReplayTurn(
            turn=turn,
            sent=len(view),
            estimated=estimated,
            reported=None,
            calibration=calibration,
            agrees=agrees,
            view=len(report.views) - 1,
            messages=end,
            cache=sent.get("cache"),
        )
        answer = history[end] if end < len(history) else None
        previous, row.source = _usage_after(client, answer, view, clock + turn, dialect)
        if previous is not None:
            # A counted usage is of ctxwin's own view; a recorded one of the recorded run's.
            of_this_view = row.source == "counted" or agrees
            implausible = False
            if row.source == "recorded":
                row.recorded = input_tokens(previous)
                implausible = (of_this_view or usage == "recorded") and _implausible(
                    row.recorded, estimated, calibration
                )
                if implausible:
                    # No count of a request this long: neither reported nor fed back.
                    report.implausible.append(turn)
                    of_this_view = False
                elif agrees and 0 < row.recorded < last_recorded * _CUT_SIGN:
                    # The conversation only grew: the recorded run's view lost messages.
                    agrees = row.agrees = of_this_view = False
                    report.differs = (
                        f"from turn {turn} the recorded run sent less: its prompt fell "
                        f"from {last_recorded:,} to {row.recorded:,} tokens"
                    )
                if not implausible:
                    last_recorded = row.recorded or last_recorded
            if of_this_view:
                row.reported = input_tokens(previous)
            if implausible or usage == "estimated" or (usage == "auto" and not of_this_view):
                previous = _estimated_usage(
                    client, answer, previous, estimated, calibration, dialect
                )
                row.source = "estimated"
                if report.estimated_from is None and not implausible:
                    report.estimated_from = turn
            row.usage = input_tokens(previous)
        view_tokens = row.reported if row.reported is not None else estimated
        report.peak_tokens = max(report.peak_tokens, view_tokens)
        if view_tokens > report.context_window:
            report.over_window.append(turn)
            if report.over_window_cause is None:  # the first: what the later ones follow
                report.over_window_cause = _over_window_cause(
                    history, sent.get("largest"), turn, points, view_tokens, report, dialect
                )
        report.per_turn.append(row)
        report.last_request_messages = len(view)
        if progress is not None:
            progress(turn, len(points), deleted_range)
    report.final_range = deleted_range
    return report


def _condensed(
    client: Client,
    task: Task,
    history: Sequence[Mapping[str, Any]],
    model: Model,
    sent: dict[str, Any],
    turn: int,
    report: ReplayReport,
    dialect: str,
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
            "tokens": None if stored is None else _text_tokens(client, stored["text"]),
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
    dialect: str,
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
    return OverWindow(turn, tokens, index, describe(history[index], dialect), size, new, prevent)


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
    out = _tokens(client, [answer], dialect) if answer is not None else 0
    return Usage(ts=recorded["ts"], tokens_in=estimated, tokens_out=round(out * calibration))


def _optimisation(
    client: Client,
    history: Sequence[Mapping[str, Any]],
    before: Overlay,
    after: Overlay,
    turn: int,
    end: int,
    deleted_range: DeletedRange,
    sources: Sources | None = None,
) -> ReplayEvent | None:
    """The optimisation event of a turn: blocks whose latest update is new (notices excluded).

    ``sources``: for a dialect other than ``cline``, where each overlay key
    (internal indices) came from in the history, and its text before any edit.
    """
    old_texts: list[str] = []
    new_texts: list[str] = []
    touched: set[int] = set()
    visible_from = deleted_range[1] + 1 if deleted_range else 2
    for (index, block), (edit_type, texts) in after.items():
        known = before.get((index, block), (edit_type, []))[1]
        if edit_type == NOTICE_EDIT or len(texts) <= len(known) or not texts:
            continue
        if 2 <= index < visible_from:
            continue  # hidden by this turn's range: its truncation event counts it
        at, original = index, None
        if sources is not None:
            if (index, block) not in sources:
                continue  # the daemon holds no history to name it by
            at, original = sources[index, block]
        if known:
            previous_text = known[-1]
        elif original is not None:
            previous_text = original
        else:
            previous_text = original_text(history, index, block) or ""
        old_texts.append(previous_text)
        new_texts.append(texts[-1])
        touched.add(at)
    if not touched:
        return None
    old, new = "\n".join(old_texts), "\n".join(new_texts)
    return ReplayEvent(
        turn=turn,
        message=end,
        kind="optimisation",
        deleted_range=deleted_range,
        removed_messages=0,
        messages=sorted(touched),
        chars_saved=len(old) - len(new),
        tokens_saved=_text_tokens(client, old) - _text_tokens(client, new),
    )


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
        tokens_in=_tokens(client, sent, dialect),
        tokens_out=_tokens(client, [answer], dialect),
    )
    return counted, "counted"


def input_tokens(usage: Usage) -> int:
    """The prompt side of a usage: what an estimate of the view is compared with."""
    return (
        (usage.get("tokens_in") or 0)
        + (usage.get("cache_writes") or 0)
        + (usage.get("cache_reads") or 0)
    )


def message_tokens(
    client: Client,
    history: Sequence[Mapping[str, Any]],
    variants: Sequence[Variant],
    dialect: str = CLINE,
) -> TokenCounts:
    """Count every message of ``history`` and every variant, one message at a time."""
    return TokenCounts(
        [_tokens(client, [message], dialect) for message in history],
        [_tokens(client, [variant.message], dialect) for variant in variants],
    )
