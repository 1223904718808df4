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

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ctxwin.proto import (
    SUMMARY_MARK,
    DeletedRange,
    Model,
    OverlayFormatError,
    Update,
    Usage,
    now_ms,
    read_overlay,
    update_text,
)

from ._corpus import user_side
from ._errors import BadReplyError
from ._sync import Client
from ._task import Task
from ._usage import usage_from_metrics
from .integrations._models import known_context_window

Progress = Callable[[int, int, DeletedRange], None]
"""Called after each turn with (turns done, turns in all, current range)."""

UsageMode = Literal["recorded", "estimated", "auto"]
"""Where each turn's usage comes from: the file, the daemon's estimate, or the file while
ctxwin's view is the recorded run's and the estimate after."""

USAGE_MODES: tuple[UsageMode, ...] = ("auto", "recorded", "estimated")

_NOTICE_EDIT = 0
CALIBRATION_FLOOR = 0.25
"""The lowest ratio of reported to estimated tokens the daemon's calibration takes: a
recorded prompt under this share of the uncalibrated estimate of the same request counts
something else (a file whose ``metrics.tokens`` are not the request's usage)."""
_CUT_SIGN = 0.99
"""A recorded prompt under 99% of the one before, though the conversation only grew,
means the recorded run cut its own view (provider counts do not shrink otherwise)."""

NOTICE = "notice"
FILE_READ = "file read replaced"
REPAIRED = "tool pair repaired"
SUMMARY = "summary"
"""A message the view carries a summary of removed turns in (docs/SUMMARIES.md)."""


@dataclass(slots=True)
class ReplayEvent:
    """One change of what the model sees.

    Attributes:
        turn: 1-based number of the model request it happened before.
        message: how many messages the request held.
        kind: ``truncation`` or ``optimisation``.
        deleted_range: the range after the event (truncations); in a dialect
            other than ``cline`` it counts the engine's internal messages.
        removed_messages: messages newly hidden by the range (truncations):
            in a dialect other than ``cline``, the history messages the cut
            removed from the view.
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
class ViewState:
    """What a turn's view does to the history: its range and the messages it alters.

    Attributes:
        deleted_range: the range in effect.
        altered: history index -> index into :attr:`ReplayReport.variants` of
            the message as the view holds it, for each message the view changed.
        order: a native dialect's view in its own order, one ``(history index,
            variant)`` per message sent: variant None for the history message
            as it is, else the index into :attr:`ReplayReport.variants` of a
            message the view rebuilt or added; None in the Cline dialect, whose
            view follows from the range.
    """

    deleted_range: DeletedRange
    altered: dict[int, int] = field(default_factory=dict)
    order: list[tuple[int, int | None]] | None = None

    def removed(self, end: int) -> list[int]:
        """The history indices below ``end`` a native view neither sends nor rebuilds."""
        order = self.order or []
        sent = {index for index, variant in order if variant is None} | set(self.altered)
        return [index for index in range(end) if index not in sent]


@dataclass(slots=True)
class Variant:
    """A message as a view altered it.

    Attributes:
        index: its history index (a message the view added: the index of the
            call it answers, else of the history message it stands before).
        kinds: what changed it (:data:`NOTICE`, :data:`FILE_READ`, :data:`REPAIRED`).
        message: the message as sent.
        added: the view added it; it stands for no history message.
    """

    index: int
    kinds: list[str]
    message: dict[str, Any]
    added: bool = False


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
    dialect: str = "cline"
    window_source: str = ""
    summaries: list[dict[str, Any]] = field(default_factory=list)
    strategy: str = "default"
    pricing: Any = None

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


def load_history(path: Path) -> list[dict[str, Any]]:
    """The messages of an ``api_conversation_history.json``.

    Raises:
        ValueError: the file is not a JSON list of ``{role, content}`` maps.
    """
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list) or not all(
        isinstance(message, dict) and message.get("role") in ("user", "assistant")
        for message in data
    ):
        raise ValueError(f"{path} is not a list of {{role, content}} messages")
    return data


def chars_of(value: Any) -> int:
    """Characters of every string inside a message's content (keys excluded; the values
    of ``type`` left out). Walked with a stack: any depth the file's JSON had."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, Mapping):
            stack.extend(inner for key, inner in item.items() if key != "type")
        elif isinstance(item, list):
            stack.extend(item)
    return total


def text_of(block: Any) -> str | None:
    """The text the overlay edits in a block (SPEC.md §1), or None."""
    if not isinstance(block, Mapping):
        return None
    if block.get("type") == "text" and isinstance(block.get("text"), str):
        return str(block["text"])
    inner = block.get("content")
    if block.get("type") == "tool_result" and isinstance(inner, list) and inner:
        first = inner[0]
        if isinstance(first, Mapping) and first.get("type") == "text":
            text = first.get("text")
            return text if isinstance(text, str) else None
    return None


Overlay = dict[tuple[int, int], tuple[int, list[str]]]
"""(message, block) -> (edit type, texts of its updates in order)."""


def set_text(block: Mapping[str, Any], text: str) -> dict[str, Any]:
    """A copy of ``block`` with its text (as :func:`text_of` reads it) replaced."""
    copy = dict(block)
    if copy.get("type") == "text":
        copy["text"] = text
    elif text_of(block) is not None:
        inner = list(copy["content"])
        inner[0] = {**inner[0], "text": text}
        copy["content"] = inner
    return copy


def with_overlay(message: Mapping[str, Any], index: int, overlay: Overlay) -> dict[str, Any]:
    """A copy of message ``index`` with the latest overlay text of each block (SPEC.md §4)."""
    copy = dict(message)
    content = message.get("content")
    if not isinstance(content, list):
        return copy
    blocks = list(content)
    added = None
    for (at, block), (_, texts) in overlay.items():
        if at == index and texts and block < 0:
            added = {"type": "text", "text": texts[-1]}  # a notice the view puts in a new block
        elif at == index and texts and block < len(blocks) and isinstance(blocks[block], Mapping):
            blocks[block] = set_text(blocks[block], texts[-1])
    if added is not None:
        place = 0
        while place < len(blocks) and blocks[place].get("type") in (
            "thinking",
            "redacted_thinking",
        ):
            place += 1
        blocks.insert(place, added)
    copy["content"] = blocks
    return copy


Sources = dict[tuple[int, int], tuple[int, str]]
"""(internal message, block) -> (history index, the block's text before any edit)."""


def parse_sources(sources: Any) -> Sources:
    """``inspect``'s ``sources`` (a task of a native dialect) by overlay key.

    Raises:
        BadReplyError: ``sources`` is not a list of ``[message, block,
            history index, text]``.
    """
    if not isinstance(sources, list):
        raise BadReplyError("inspect: sources must be a list")
    found: Sources = {}
    for position, item in enumerate(sources):
        if not (
            isinstance(item, list)
            and len(item) == 4
            and all(isinstance(n, int) and not isinstance(n, bool) for n in item[:3])
            and isinstance(item[3], str)
        ):
            raise BadReplyError(
                f"inspect: sources[{position}] must be [message, block, history index, text]"
            )
        found[item[0], item[1]] = (item[2], item[3])
    return found


def parse_updates(updates: Any) -> Overlay:
    """The on-disk overlay (SPEC.md §1) as (message, block) -> (edit type, texts).

    Raises:
        BadReplyError: ``updates`` does not have the on-disk shape.
    """
    try:
        edits = read_overlay(updates)
    except OverlayFormatError as exc:
        raise BadReplyError(f"inspect: unreadable overlay: {exc}") from None

    def texts(updates: list[Update]) -> list[str]:
        return [text for text in map(update_text, updates) if text is not None]

    return {
        (message.message, block): (message.edit_type, texts(updates))
        for message in edits
        for block, updates in message.blocks.items()
    }


def request_points(history: Sequence[Mapping[str, Any]], dialect: str = "cline") -> list[int]:
    """Where the agent calls the model (exclusive end indices).

    After every user message; in another dialect, after the last message of
    each run of the user's side (a user message, tool results).
    """
    if dialect == "cline":
        return [i for i in range(1, len(history) + 1) if history[i - 1].get("role") == "user"]
    return [
        i
        for i in range(1, len(history) + 1)
        if user_side(history[i - 1], dialect)
        and (i == len(history) or not user_side(history[i], dialect))
    ]


def _tokens(client: Client, messages: Sequence[Mapping[str, Any]], dialect: str = "cline") -> int:
    if not messages:
        return 0
    if dialect == "cline":
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
    dialect: str = "cline",
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
    native = dialect != "cline"
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
                _keeps_content(history[index], report.variants[number].message)
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


def no_request(dialect: str) -> str:
    """Why a history without a model request cannot be replayed."""
    return (
        f"no model request in it: no message of the {dialect} dialect's user side "
        "(a user message, tool results)"
    )


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


def view_state(
    history: Sequence[Mapping[str, Any]],
    view: Sequence[Mapping[str, Any]],
    deleted_range: DeletedRange,
    overlay: Overlay,
    variants: list[Variant],
) -> ViewState:
    """How ``view`` (a view of ``history``, SPEC.md §4) differs from the history.

    Messages the view changed are added to ``variants`` once each (an equal
    variant of the same message is reused).
    """
    state = ViewState(None if deleted_range is None else list(deleted_range))
    keep = deleted_range[1] + 1 if deleted_range and len(view) >= 2 else 2
    for position, message in enumerate(view):
        index = position if position < 2 else keep + position - 2
        original = history[index] if index < len(history) else None
        if message is original or message == original or original is None:
            continue
        kinds: list[str] = []
        edits = {edit for (at, _), (edit, texts) in overlay.items() if at == index and texts}
        if edits:
            kinds.append(NOTICE if _NOTICE_EDIT in edits else FILE_READ)
        bare = _without_summary(message)
        if bare is not message:
            kinds.append(SUMMARY)
        if (not edits and bare is message) or with_overlay(original, index, overlay) != bare:
            kinds.append(REPAIRED)
        for number, variant in enumerate(variants):
            if variant.index == index and variant.message == message:
                state.altered[index] = number
                break
        else:
            variants.append(Variant(index, kinds, dict(message)))
            state.altered[index] = len(variants) - 1
    return state


_ID_KEYS = frozenset({"id", "tool_use_id", "tool_call_id", "call_id"})
"""Keys whose string values name a call, a result's call, or an item (kept by a rebuild)."""
_PLAIN_KEYS = _ID_KEYS | {"role", "type", "name", "status"}
"""Keys whose string values say nothing of what a message holds (left out of its texts)."""
_HIDDEN_KEYS = _ID_KEYS | {"role", "status", "signature", "thoughtSignature", "encrypted_content"}
"""Keys whose string values are not content a person reads (left out of its characters)."""


def message_chars(message: Mapping[str, Any], dialect: str = "cline") -> int:
    """Characters of a message's content: every string of it in a dialect other than ``cline``
    (texts, calls, results, parts), roles, ids and signatures left out."""
    if dialect == "cline":
        return chars_of(message.get("content"))
    return sum(chars_of(value) for key, value in message.items() if key not in _HIDDEN_KEYS)


def _leaves(value: Any, ids: set[str], texts: set[str], key: str = "") -> None:
    """Collect the ids (:data:`_ID_KEYS`) and the other content strings inside ``value``
    (walked with a stack: any depth)."""
    stack: list[tuple[Any, str]] = [(value, key)]
    while stack:
        item, name = stack.pop()
        if isinstance(item, str):
            if name in _ID_KEYS:
                ids.add(item)
            elif name not in _PLAIN_KEYS and item:
                texts.add(item)
        elif isinstance(item, Mapping):
            stack.extend((inner, str(field)) for field, inner in item.items())
        elif isinstance(item, list):
            stack.extend((inner, name) for inner in item)


class NativeViews:
    """Views of a native dialect's history mapped back to it, turn by turn.

    Each view message comes with its origin, as the daemon's patch gives it
    (:meth:`ctxwin.client.Task.view_origins`): the history index it stands for,
    or None for a message the view added. A message that is its history
    message (the same object, or equal) is sent as it is; another with an
    origin is a variant of that message, rebuilt by the view, whose kind
    (a notice, a replaced read, a repaired pair) follows from the overlay
    texts it holds; one without is a message the view added (a missing
    result, a notice of its own), standing for the message holding the call
    it answers, else for the next history message sent. History messages
    neither sent nor rebuilt are the ones the view removed.

    Args:
        history: the whole conversation, in its dialect.
        variants: where new variants go (shared by every view mapped).
    """

    def __init__(self, history: Sequence[Mapping[str, Any]], variants: list[Variant]) -> None:
        self.history = history
        self.variants = variants
        self._leaf_cache: dict[int, tuple[set[str], set[str]]] = {}
        self._by_call: dict[str, list[int]] | None = None

    def _leaves_of(self, index: int) -> tuple[set[str], set[str]]:
        found = self._leaf_cache.get(index)
        if found is None:
            found = self._leaf_cache[index] = _leaves_pair(self.history[index])
        return found

    def _holding(self, call: str) -> list[int]:
        if self._by_call is None:
            self._by_call = {}
            for index in range(len(self.history)):
                for name in self._leaves_of(index)[0]:
                    self._by_call.setdefault(name, []).append(index)
        return self._by_call.get(call, [])

    def state(
        self,
        view: Sequence[Mapping[str, Any]],
        origins: Sequence[int | None],
        end: int,
        deleted_range: DeletedRange,
        overlay: Overlay,
        sources: Sources,
    ) -> ViewState:
        """The view of the history's first ``end`` messages, mapped back to them.

        Args:
            view: the messages sent.
            origins: the history index each of them stands for (None: added by the view).
            end: how many history messages the view was made of.
            deleted_range: the range in effect (internal indices).
            overlay: the task's overlay now (:func:`parse_updates`).
            sources: where each overlay block came from (:func:`parse_sources`).

        Raises:
            ValueError: ``origins`` do not fit ``view`` and ``end``.
        """
        if len(origins) != len(view) or any(at is not None and not 0 <= at < end for at in origins):
            raise ValueError("view origins do not fit the view or the history")
        # The notices and replaced texts of the overlay, by the history index they stand in
        # (None: a notice block of its own, from no history message).
        marks: dict[int | None, list[tuple[str, str]]] = {}
        for key, (edit_type, updates) in overlay.items():
            if updates:
                kind = NOTICE if edit_type == _NOTICE_EDIT else FILE_READ
                marks.setdefault(sources[key][0] if key in sources else None, []).append(
                    (updates[-1], kind)
                )
        state = ViewState(None if deleted_range is None else list(deleted_range), order=[])
        assert state.order is not None
        for position, (message, at) in enumerate(zip(view, origins, strict=True)):
            if at is not None and (message is self.history[at] or message == self.history[at]):
                state.order.append((at, None))
                continue
            ids, texts = _leaves_pair(message)
            if at is not None:
                original_ids, original_texts = self._leaves_of(at)
                kinds = _marked(texts - original_texts, marks, at) + _summary_kind(texts)
                if not kinds or ids != original_ids:
                    kinds.append(REPAIRED)
                number = self._variant(at, kinds, message, added=False)
                state.altered[at] = number
                state.order.append((at, number))
                continue
            calls = sorted(i for name in ids for i in self._holding(name) if i < end)
            stands = calls[0] if calls else _next_origin(origins, position)
            kinds = _marked(texts, marks, None) + _summary_kind(texts) or [REPAIRED]
            state.order.append((stands, self._variant(stands, kinds, message, added=True)))
        return state

    def _variant(
        self, index: int, kinds: list[str], message: Mapping[str, Any], added: bool
    ) -> int:
        """The number of this variant, added to the list unless an equal one is there."""
        for number, variant in enumerate(self.variants):
            if variant.index == index and variant.added == added and variant.message == message:
                return number
        self.variants.append(Variant(index, kinds, dict(message), added))
        return len(self.variants) - 1


def _next_origin(origins: Sequence[int | None], position: int) -> int:
    """The history index of the first message after ``position`` that has one, else of
    the last before it (0 when none has)."""
    after = (at for at in origins[position + 1 :] if at is not None)
    before = (at for at in reversed(origins[:position]) if at is not None)
    return next(after, next(before, 0))


def _leaves_pair(message: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    ids: set[str] = set()
    texts: set[str] = set()
    _leaves(message, ids, texts)
    return ids, texts


def _without_summary(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """``message`` without the summary a view put into it (``message`` itself when none)."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    kept = [block for block in content if not _is_summary(block)]
    if len(kept) == len(content):
        return message
    return {**message, "content": kept}


def _is_summary(block: Any) -> bool:
    text = block.get("text") if isinstance(block, Mapping) else None
    return isinstance(text, str) and text.startswith(SUMMARY_MARK)


def _summary_kind(texts: set[str]) -> list[str]:
    return [SUMMARY] if any(text.startswith(SUMMARY_MARK) for text in texts) else []


def _marked(
    texts: set[str], marks: Mapping[int | None, list[tuple[str, str]]], index: int | None
) -> list[str]:
    """The kinds of the overlay texts (of history message ``index``, or of none) among ``texts``."""
    found = {kind for at in {index, None} for text, kind in marks.get(at, ()) if text in texts}
    return [kind for kind in (NOTICE, FILE_READ) if kind in found]


def _keeps_content(original: Mapping[str, Any], sent: Mapping[str, Any]) -> bool:
    """Whether ``sent`` holds every block of ``original`` (a repair that only added or moved).

    A tool pair repair that adds a missing-result stub, or puts results first,
    leaves the recorded run's content in the request: its usage still
    describes ctxwin's view, give or take the stub's few tokens.
    """
    before, after = original.get("content"), sent.get("content")
    if not isinstance(before, list) or not isinstance(after, list):
        return before == after
    return all(block in after for block in before)


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


def describe(message: Mapping[str, Any], dialect: str = "cline") -> str:
    """What a message is, for people: its role (or item type) and the kinds of its content
    (a Cline result sent back as text named as such, with its head)."""
    role = str(message.get("role") or message.get("type") or "message")
    content = message.get("parts" if dialect == "gemini" else "content")
    if isinstance(content, str) or content is None:
        kinds = ["text"] if isinstance(content, str) else []
        head = content or ""
    else:
        kinds, head = [], ""
        for block in content if isinstance(content, list) else []:
            kind = (
                str(block.get("type") or next(iter(block), "part"))
                if isinstance(block, Mapping)
                else "part"
            )
            text = block.get("text") if isinstance(block, Mapping) else None
            if isinstance(text, str) and text.startswith("[") and "] Result:" in text[:300]:
                kind, head = "tool result as text", head or text[: text.index("] Result:") + 1]
            if kind not in kinds:
                kinds.append(kind)
    described = f"{role} message" + (f": {', '.join(kinds)}" if kinds else "")
    return described + (f" ({head})" if head and len(head) <= 120 else "")


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
    dialect: str = "cline",
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
        if edit_type == _NOTICE_EDIT or len(texts) <= len(known) or not texts:
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
            content = history[index].get("content") if index < len(history) else None
            blocks = content if isinstance(content, list) else []
            previous_text = (text_of(blocks[block]) if block < len(blocks) else None) or ""
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
    dialect: str = "cline",
) -> tuple[Usage | None, str]:
    """The usage of the request just made and its source.

    From the answer's metrics (``recorded``), else counted over the view sent
    (``counted``); ``none`` when no answer follows.
    """
    if answer is None or (dialect == "cline" and answer.get("role") != "assistant"):
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


def default_model(history: Sequence[Mapping[str, Any]], window: int | None) -> Model:
    """The model of the history's first assistant ``modelInfo``, with the given window."""
    model = Model(id="unknown")
    for message in history:
        info = message.get("modelInfo")
        if isinstance(info, Mapping) and isinstance(info.get("modelId"), str):
            model["id"] = str(info["modelId"])
            if isinstance(info.get("providerId"), str):
                model["provider"] = str(info["providerId"])
            break
    if window is not None:
        model["context_window"] = window
    return model


def model_for(
    history: Sequence[Mapping[str, Any]],
    window: int | None,
    named: str | None = None,
    model_id: str | None = None,
) -> tuple[Model, str]:
    """The model a replay asks for, and where its window came from.

    Args:
        history: the conversation (a Cline message's ``modelInfo`` names its model).
        window: the window given (``--model-window``): it wins.
        named: the model the file names otherwise (:class:`~ctxwin.client._corpus.About`).
        model_id: the model id given (``--model``), over the file's.

    Returns:
        The model (with ``context_window`` unless the daemon's default applies) and a
        phrase saying where the window came from.
    """
    model = default_model(history, window)
    if model_id:
        model["id"] = model_id
    elif model["id"] == "unknown" and named:
        model["id"] = named
    if window is not None:
        return model, "given with --model-window"
    known = known_context_window(model["id"])
    if known is not None:
        model["context_window"] = known
        return model, f"published for {model['id']}; --model-window to change"
    return model, "the daemon's default: the model is not a known one; --model-window to change"


@dataclass(slots=True)
class TokenCounts:
    """Tokens of each history message and of each altered variant (``count_tokens``)."""

    messages: list[int]
    variants: list[int]


def message_tokens(
    client: Client,
    history: Sequence[Mapping[str, Any]],
    variants: Sequence[Variant],
    dialect: str = "cline",
) -> TokenCounts:
    """Count every message of ``history`` and every variant, one message at a time."""
    return TokenCounts(
        [_tokens(client, [message], dialect) for message in history],
        [_tokens(client, [variant.message], dialect) for variant in variants],
    )
