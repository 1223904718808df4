"""Replay a saved conversation turn by turn through the daemon, as an agent would.

An ``api_conversation_history.json`` is the list of messages of one task. Each
user message is followed by a model request: the agent sends the messages so
far and the previous request's usage to ``prepare_request`` and sends what
comes back. The replay does the same and records every event that changed
what the model would see: a truncation (the deleted range grew) or an
optimisation (stale duplicate file reads replaced, SPEC.md §6).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ctxwin.proto import (
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
from ._usage import total_tokens, usage_from_metrics

Progress = Callable[[int, int, DeletedRange], None]
"""Called after each turn with (turns done, turns in all, current range)."""

_NOTICE_EDIT = 0


@dataclass(slots=True)
class ReplayEvent:
    """One change of what the model sees.

    Attributes:
        turn: 1-based number of the model request it happened before.
        message: how many messages the request held.
        kind: ``truncation`` or ``optimisation``.
        deleted_range: the range after the event (truncations).
        removed_messages: messages newly hidden by the range.
        messages: history indices of the messages concerned.
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
        reported: the request's reported input tokens (from the answer's
            metrics, else counted), or None for the last turn with no answer.
        calibration: the task's ratio of reported to estimated tokens then.
    """

    turn: int
    sent: int
    estimated: int
    reported: int | None
    calibration: float


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
        """The report as plain JSON-able data."""
        data = asdict(self)
        data["totals"] = self.totals()
        return data


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
    """Characters of every string inside a message's content (keys excluded)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(chars_of(item) for key, item in value.items() if key != "type")
    if isinstance(value, list):
        return sum(chars_of(item) for item in value)
    return 0


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
    for (at, block), (_, texts) in overlay.items():
        if at == index and texts and block < len(blocks) and isinstance(blocks[block], Mapping):
            blocks[block] = set_text(blocks[block], texts[-1])
    copy["content"] = blocks
    return copy


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


def _removed_from_view(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """Messages of the view ``before`` that the view ``after`` no longer sends."""
    kept = {json.dumps(message, sort_keys=True, default=repr) for message in after}
    return [m for m in before if json.dumps(m, sort_keys=True, default=repr) not in kept]


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
    dialect: str = "cline",
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
        dialect: the history's dialect. In a dialect other than ``cline`` the
            range and the overlay count the engine's internal messages
            (docs/DIALECTS.md); a truncation's savings are those of the
            messages the view stopped sending, and an optimisation event names
            internal indices and counts no savings.

    Returns:
        The report.

    Raises:
        CtxwinError: from the daemon.
    """
    info = client.context_window_info(model)
    points = request_points(history, dialect)
    has_metrics = any(isinstance(m.get("metrics"), Mapping) for m in history)
    report = ReplayReport(
        file=file,
        messages=len(history),
        turns=len(points),
        model=dict(model),
        context_window=int(info["context_window"]),
        max_allowed_size=info["max_allowed_size"],
        usage_source="metrics.tokens" if has_metrics else "count_tokens",
    )
    native = dialect != "cline"
    task = Task(client, task_id, ephemeral=ephemeral, dialect=dialect if native else None)
    last_view: list[Any] = []
    start = task.inspect()
    deleted_range: DeletedRange = start["deleted_range"]
    overlay = parse_updates(start["updates"])
    clock = now_ms()
    previous: Usage | None = None
    for turn, end in enumerate(points, start=1):
        sent = task.prepare_request(history[:end], model, previous_request=previous, estimate=True)
        new_range = sent["deleted_range"]
        if new_range != deleted_range and new_range is not None:
            first = deleted_range[1] + 1 if deleted_range else 2
            hidden = list(range(first, new_range[1] + 1))
            # As the model last saw them: with the overlay of the previous turn.
            if native:
                removed = _removed_from_view(last_view, sent["messages"])
            else:
                removed = [with_overlay(history[index], index, overlay) for index in hidden]
            report.events.append(
                ReplayEvent(
                    turn=turn,
                    message=end,
                    kind="truncation",
                    deleted_range=list(new_range),
                    removed_messages=len(hidden),
                    messages=hidden,
                    chars_saved=sum(chars_of(message.get("content")) for message in removed),
                    tokens_saved=_tokens(client, removed, dialect),
                )
            )
        deleted_range = new_range
        now = parse_updates(task.inspect()["updates"])
        event = _optimisation(client, history, overlay, now, turn, end, deleted_range, native)
        if event is not None:
            report.events.append(event)
        overlay = now
        answer = history[end] if end < len(history) else None
        previous = _usage_after(client, answer, sent["messages"], clock + turn, dialect)
        last_view = sent["messages"]
        if previous is not None:
            report.peak_tokens = max(report.peak_tokens, total_tokens(previous))
        report.per_turn.append(
            ReplayTurn(
                turn=turn,
                sent=len(sent["messages"]),
                estimated=sent.get("estimated_tokens", 0),
                reported=None if previous is None else input_tokens(previous),
                calibration=sent.get("calibration", 1.0),
            )
        )
        report.last_request_messages = len(sent["messages"])
        if progress is not None:
            progress(turn, len(points), deleted_range)
    report.final_range = deleted_range
    return report


def _optimisation(
    client: Client,
    history: Sequence[Mapping[str, Any]],
    before: Overlay,
    after: Overlay,
    turn: int,
    end: int,
    deleted_range: DeletedRange,
    native: bool = False,
) -> ReplayEvent | None:
    """The optimisation event of a turn: blocks whose latest update is new (notices excluded)."""
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
        if known:
            previous_text = known[-1]
        else:
            content = history[index].get("content") if index < len(history) else None
            blocks = content if isinstance(content, list) else []
            previous_text = (text_of(blocks[block]) if block < len(blocks) else None) or ""
        old_texts.append(previous_text)
        new_texts.append(texts[-1])
        touched.add(index)
    if not touched:
        return None
    if native:  # internal indices: the history's texts are not at them
        return ReplayEvent(turn, end, "optimisation", deleted_range, 0, sorted(touched), 0, 0)
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
) -> Usage | None:
    """The usage of the request just made: from the answer's metrics, else counted."""
    if answer is None or (dialect == "cline" and answer.get("role") != "assistant"):
        return None
    ts = answer.get("ts")
    ts = ts if isinstance(ts, int) and not isinstance(ts, bool) and ts >= 0 else fallback_ts
    metrics = answer.get("metrics")
    tokens = metrics.get("tokens") if isinstance(metrics, Mapping) else None
    if isinstance(tokens, Mapping):
        return usage_from_metrics(tokens, ts=ts)
    return Usage(
        ts=ts,
        tokens_in=_tokens(client, sent, dialect),
        tokens_out=_tokens(client, [answer], dialect),
    )


def input_tokens(usage: Usage) -> int:
    """The prompt side of a usage: what an estimate of the view is compared with."""
    return (
        (usage.get("tokens_in") or 0)
        + (usage.get("cache_writes") or 0)
        + (usage.get("cache_reads") or 0)
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
