"""A window's pure state: one entry per conversation (task), the request in flight, its report.

No daemon calls here: :class:`~ctxwin.client.integrations._window.Window` and
its asyncio twin make them and hand the answers to :class:`Conversations`.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ctxwin.proto import Model, PrepareRequestResult, Usage

from ._models import known_context_window

__all__ = [
    "MAX_CONVERSATIONS",
    "Conversation",
    "Conversations",
    "Request",
    "Turn",
    "derive_task_id",
]

log = logging.getLogger("ctxwin.integrations")

MAX_CONVERSATIONS = 64
"""Conversations (task handles) a window keeps when it derives task ids; the oldest go first."""


@dataclass(frozen=True)
class Turn:
    """What ctxwin did for one model request, for logging.

    Attributes:
        task: the ctxwin task id of the conversation.
        model: the model id of the request.
        messages: how many messages the caller's history held.
        sent: how many messages were sent instead (the view).
        deleted_range: the task's deleted range after this request (``[start, end]`` or None).
        range_updated: whether this request moved the range.
        estimated_tokens: the daemon's (calibrated) estimate of the view, when it made one.
        fits: whether the view fits the model's budget, when estimated.
        stalled: a compaction was due but could not make the view smaller.
        retried: the provider refused the first try as too long; ctxwin compacted
            and sent once more.
        usage: the usage the provider reported for the request (None when it
            reported none, e.g. a stream that was not read to its end).
        cache: the view's ``cached_tokens``, ``written_tokens``, ``cost`` and
            ``keep_all_cost`` under the provider's price sheet (docs/PRICING.md).
        summary: when a summary was due before this request: ``kind`` (``model``
            or ``basic``), ``range``, ``chars`` and ``fallback`` (why a model's
            summary was not used) of the summary stored, or ``reason`` when
            none was (docs/SUMMARIES.md).
        summary_usage: the usage of the request that asked the model for the
            summary (None when none was sent or it reported none).
        restarted: the task held a range or edits made on another history (the
            same conversation run again, or rewound): they were dropped and the
            task started over from this one.
    """

    task: str
    model: str
    messages: int
    sent: int
    deleted_range: list[int] | None
    range_updated: bool
    estimated_tokens: int | None
    fits: bool | None
    stalled: bool
    retried: bool = False
    usage: Usage | None = None
    cache: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    summary_usage: Usage | None = None
    restarted: bool = False


def derive_task_id(prefix: str, head: Sequence[Any]) -> str:
    """A stable task id for a conversation: ``<prefix>-`` and a digest of its head.

    The head is what an agent never changes once a conversation has started:
    its system prompt and the first user message (``head``, already as plain
    JSON values). The same conversation resumed later (a new process, the
    history loaded from disk) gets the same id; two conversations that start
    with the same words share one, so name the task explicitly when such
    conversations run side by side.

    Args:
        prefix: names the adapter (``openai-chat``, ``anthropic``, ...).
        head: the conversation's head.

    Returns:
        A valid task id of ``prefix`` plus 32 hex digits.
    """
    encoded = json.dumps(list(head), sort_keys=True, separators=(",", ":"), default=str)
    return f"{prefix}-{hashlib.blake2b(encoded.encode(), digest_size=16).hexdigest()}"


@dataclass
class Request:
    """One model request in flight: the view to send, and what is known of it so far."""

    task: str
    messages: Sequence[Any]
    view: list[Any]
    model: str
    ts: int
    turn: Turn
    conversation: Conversation
    retried: bool = False

    def took(self, view: Sequence[Any], deleted: Any, **noted: Any) -> None:
        """Take the view after a cut; the turn notes its size, the new range and ``noted``."""
        self.view = list(view)
        self.turn = replace(
            self.turn,
            sent=len(self.view),
            deleted_range=list(deleted) if deleted is not None else None,
            range_updated=True,
            **noted,
        )

    def compacted(self, view: Sequence[Any], deleted: Any) -> None:
        """Take the view after the compaction of a retry (the provider refused the first try)."""
        self.retried = True
        self.took(view, deleted, retried=True)


@dataclass
class Conversation:
    """One conversation of a window: its task handle, the last usage and turn."""

    handle: Any  # Task or AsyncTask
    previous: Usage | None = None
    last: Turn | None = None


@dataclass
class Conversations:
    """The pure state of a window: options, and one entry per conversation (task)."""

    task: str | None
    prefix: str
    dialect: str | None
    context_window: int | None
    on_turn: Callable[[Turn], None] | None
    ephemeral: bool = False
    open: Callable[[str], Any] = field(default=lambda task: None)
    entries: collections.OrderedDict[str, Conversation] = field(
        default_factory=collections.OrderedDict
    )

    def model(self, model_id: str) -> Model:
        window = self.context_window or known_context_window(model_id)
        model = Model(id=model_id)
        if window:
            model["context_window"] = window
        return model

    def entry(self, head: Sequence[Any]) -> tuple[str, Conversation]:
        task = self.task or derive_task_id(self.prefix, head)
        entry = self.entries.get(task)
        if entry is None:
            entry = Conversation(self.open(task))
            self.entries[task] = entry
            while len(self.entries) > MAX_CONVERSATIONS:
                self.entries.popitem(last=False)
        else:
            self.entries.move_to_end(task)
        return task, entry

    def request(
        self,
        task: str,
        entry: Conversation,
        messages: Sequence[Any],
        model: str,
        prepared: PrepareRequestResult,
        ts: int,
    ) -> Request:
        view = list(prepared["messages"])
        deleted = prepared["deleted_range"]
        turn = Turn(
            task=task,
            model=model,
            messages=len(messages),
            sent=len(view),
            deleted_range=list(deleted) if deleted is not None else None,
            range_updated=bool(prepared["range_updated"]),
            estimated_tokens=prepared.get("estimated_tokens"),
            fits=prepared.get("fits"),
            stalled=bool(prepared.get("stalled", False)),
            cache=prepared.get("cache"),
            restarted=bool(prepared.get("restarted", False)),
        )
        return Request(task, messages, view, model, ts, turn, entry)

    def finish(self, request: Request, usage: Usage | None) -> Turn:
        """Keep the request's usage for the conversation's next turn; report the turn."""
        if usage is not None:
            usage["ts"] = request.ts
        turn = replace(request.turn, usage=usage)
        if usage is not None:
            request.conversation.previous = usage
        request.conversation.last = turn
        log.debug(
            "ctxwin turn",
            extra={
                "ctxwin_task": turn.task,
                "ctxwin_sent": turn.sent,
                "ctxwin_messages": turn.messages,
                "ctxwin_range": turn.deleted_range,
                "ctxwin_retried": turn.retried,
            },
        )
        if self.on_turn is not None:
            self.on_turn(turn)
        return turn

    def last(self, task: str | None = None) -> Turn | None:
        """The latest turn of ``task`` (default: of the conversation used last)."""
        if task is None:
            if not self.entries:
                return None
            task = next(reversed(self.entries))
        entry = self.entries.get(task)
        return entry.last if entry is not None else None
