"""Typed shapes of the ``result`` map of each op (DESIGN.md "Wire protocol").

Every type here is exported from ``ctxwin.proto`` (by ``__all__``), and each op's
declaration (``_ops.py``) names its result type. Keys beyond the ones listed may
appear (the daemon may add fields in a later minor version); readers must ignore
what they do not know.

The annotations are evaluated (no ``from __future__ import annotations``): on
Python 3.11 a TypedDict tells its required keys apart only then.
"""

from typing import Any, Literal, NotRequired, TypedDict

from ._schema import DeletedRange, Message

__all__ = [
    "ApplyTruncationNoticeResult",
    "CloseResult",
    "CompactResult",
    "CompactSubagentResult",
    "CondenseResult",
    "CondensedResult",
    "ContextWindowInfoResult",
    "CountTokensResult",
    "FlushResult",
    "InspectResult",
    "NextTruncationRangeResult",
    "OptimizeFileReadsInMemoryResult",
    "OptimizeFileReadsResult",
    "PingResult",
    "PlanResult",
    "PrepareRequestResult",
    "RollbackResult",
    "ShouldCompactResult",
    "StatsResult",
    "SummaryInfo",
    "SummaryKind",
    "TruncatedMessagesResult",
]


class PingResult(TypedDict):
    """``ping``: the daemon is alive."""

    pong: bool
    version: str
    proto: int
    features: NotRequired[list[str]]
    dialects: NotRequired[list[str]]


class StatsResult(TypedDict):
    """``stats``: counters of the running daemon.

    ``tasks``: the task ids used since the daemon started (closed ones too);
    ``actors``: the tasks loaded now, which ``--max-tasks`` caps;
    ``requests``: the requests received since the start; ``flushes`` and
    ``write_failures``: the task writes that were made durable and that failed;
    ``uptime_s``: seconds since the start.

    ``histories`` and ``history_bytes``: the histories kept for delta sync and
    the memory they are counted as holding (their estimated resident size,
    which ``--history-cache-mb`` caps), not their encoded size.

    ``calibrated_tasks``: the running tasks whose estimates have been
    calibrated, and ``calibration_median`` the median of their ratios
    (reported/estimated). ``store``: the state store, ``kind`` (file or redis)
    and what it shows of itself. ``cache``: the cache ledgers of the running
    tasks that have one, summed (docs/PRICING.md): ``tasks``, ``requests``,
    ``cached_tokens``, ``written_tokens``, ``cost``, ``keep_all_cost``.

    ``clients``: by client (the name the daemon gives a connection:
    ``key:NAME`` for an allowed CURVE key, ``uid:N`` for an ipc peer,
    ``tcp:ADDRESS`` for loopback TCP without keys), the ``tasks`` it holds,
    its ``requests`` in flight and its kept ``history_bytes``.
    """

    tasks: int
    actors: int
    requests: int
    flushes: int
    write_failures: int
    uptime_s: float
    histories: NotRequired[int]
    history_bytes: NotRequired[int]
    calibrated_tasks: NotRequired[int]
    calibration_median: NotRequired[float | None]
    store: NotRequired[dict[str, Any]]
    cache: NotRequired[dict[str, Any] | None]
    clients: NotRequired[dict[str, dict[str, int]] | None]


class ContextWindowInfoResult(TypedDict):
    """``context_window_info`` (SPEC.md §2)."""

    context_window: int
    max_allowed_size: int | float


class ShouldCompactResult(TypedDict):
    """``should_compact`` (SPEC.md §2, §8)."""

    compact: bool
    total_tokens: int
    threshold_tokens: int


class NextTruncationRangeResult(TypedDict):
    """``next_truncation_range`` (SPEC.md §3)."""

    deleted_range: DeletedRange


class PrepareRequestResult(TypedDict):
    """``prepare_request`` (SPEC.md §7): the messages to send to the model.

    ``stalled``: a compaction was due but could not make the view smaller.
    With estimates asked for (``estimate``, ``proactive`` or ``strategy``):
    ``estimated_tokens`` of the view (calibrated), whether it ``fits`` the
    model's budget, the ``largest`` view messages as ``[index, tokens]`` when
    it does not, and the task's ``calibration`` ratio. With a price sheet
    known (``pricing``, the task's, or its model's): ``cache``, the view's
    ``cached_tokens``, ``written_tokens``, ``cost`` and ``keep_all_cost``
    (docs/PRICING.md); ``receipts`` of the edits this request made.
    ``restarted`` (only when true): the history was not the one the task's
    range and edits were made on (a restart or a rewind under the same task
    id), so they were dropped and the task started over from this history.
    """

    deleted_range: DeletedRange
    range_updated: bool
    messages: list[Message]
    stalled: NotRequired[bool]
    restarted: NotRequired[bool]
    estimated_tokens: NotRequired[int]
    fits: NotRequired[bool]
    largest: NotRequired[list[list[int]]]
    calibration: NotRequired[float]
    cache: NotRequired[dict[str, Any]]
    receipts: NotRequired[list[dict[str, Any]]]
    summary_due: NotRequired[bool]
    summary_prompt: NotRequired[str]


class PlanResult(TypedDict):
    """``plan``: what ``prepare_request`` would do now; nothing is changed.

    ``file_reads`` lists the duplicate reads it would replace
    (``{index, block, edit_type, paths}``); ``tokens_before``/``tokens_after`` estimate the
    view now and after; ``budget`` is the model's ``max_allowed_size``.
    """

    deleted_range: DeletedRange
    range_updated: bool
    file_reads: list[dict[str, Any]]
    tokens_before: int
    tokens_after: int
    budget: float
    fits: bool
    stalled: bool
    largest: list[list[int]] | None
    calibration: float
    restarted: NotRequired[bool]


class TruncatedMessagesResult(TypedDict):
    """``truncated_messages`` (SPEC.md §4)."""

    messages: list[Message]
    restarted: NotRequired[bool]


class OptimizeFileReadsResult(TypedDict):
    """``optimize_file_reads`` (SPEC.md §6)."""

    changed: bool
    need_to_truncate: bool
    percent_saved: float
    restarted: NotRequired[bool]


class OptimizeFileReadsInMemoryResult(TypedDict):
    """``optimize_file_reads_in_memory`` (SPEC.md §8)."""

    changed: bool
    need_to_truncate: bool
    messages: list[Message]
    restarted: NotRequired[bool]


class CompactSubagentResult(TypedDict):
    """``compact_subagent`` (SPEC.md §8)."""

    compacted: bool
    deleted_range: DeletedRange
    messages: list[Message]
    restarted: NotRequired[bool]


class ApplyTruncationNoticeResult(TypedDict):
    """``apply_truncation_notice`` (SPEC.md §5)."""

    changed: bool
    restarted: NotRequired[bool]


class CompactResult(TypedDict):
    """``compact`` (SPEC.md §8)."""

    deleted_range: DeletedRange
    changed: bool
    restarted: NotRequired[bool]


class CondensedResult(TypedDict):
    """``condensed`` (SPEC.md §8)."""

    deleted_range: DeletedRange
    restarted: NotRequired[bool]


SummaryKind = Literal["basic", "model"]
"""How a summary was written: ``basic`` by the daemon from the removed turns, ``model`` by
the agent's model (docs/SUMMARIES.md)."""


class SummaryInfo(TypedDict):
    """A stored summary: when, what kind, the range it stands for, its text and length."""

    ts: int
    kind: SummaryKind
    range: list[int]
    text: str
    chars: int


class CondenseResult(TypedDict):
    """``condense``: the summary stored and the view after it, or why nothing was stored.

    ``fallback`` says why a model's summary was replaced by the basic one;
    ``tokens_before``/``tokens_after`` estimate the view before and after;
    ``trigger`` is the auto-condense threshold the view is kept under half of.
    """

    condensed: bool
    reason: str | None
    deleted_range: DeletedRange
    summary: SummaryInfo | None
    fallback: str | None
    tokens_before: int
    tokens_after: int
    trigger: int | float
    messages: list[Message]


class RollbackResult(TypedDict):
    """``rollback`` (SPEC.md §9): how many updates were dropped."""

    removed: int


class InspectResult(TypedDict):
    """``inspect``: the task's overlay in its on-disk form (SPEC.md §1).

    ``sources`` (a task of a native dialect whose history the daemon holds):
    for each (internal message, block) the overlay edits, ``[message, block,
    history index, text]``: the index in the caller's history of the message
    the block came from and the block's text before any edit
    (docs/DIALECTS.md). ``read_tools_unused``: stored read tools that no
    longer build (a pattern RE2 refuses), ``[position, reason]``, kept and
    not used. ``exists`` is false (and present only then) for a task
    the daemon neither had loaded nor holds anything of: inspecting it creates nothing.
    ``dropped`` (the ``auto`` strategy's deleted set, when it holds ranges): the
    inclusive internal ranges after ``deleted_range`` that are not sent either,
    ascending (docs/STRATEGIES.md).
    Given ``messages``: ``view``, the view a request with them would now get
    (worked out on a copy: nothing changes), with ``origins`` (each view
    message's history index, None for one the view added; in the Cline
    dialect the indices the range and the deleted set leave), ``sources`` of
    those messages in a native dialect, and ``restarted`` (true, present only
    then) when they are not the history the task's range and edits were made on.
    """

    updates: list[Any]
    deleted_range: DeletedRange
    dropped: NotRequired[list[list[int]]]
    dirty: bool
    exists: NotRequired[bool]
    calibration: NotRequired[dict[str, float]]
    history: NotRequired[int | None]
    read_tools: NotRequired[list[dict[str, Any]]]
    read_tools_unused: NotRequired[list[list[Any]]]
    store: NotRequired[str]
    owner: NotRequired[str]
    fence: NotRequired[int | None]
    sources: NotRequired[list[list[Any]]]
    cache: NotRequired[dict[str, Any]]
    pricing: NotRequired[dict[str, Any]]
    summaries: NotRequired[list[SummaryInfo]]
    summary: NotRequired[SummaryInfo | None]
    view: NotRequired[list[Message]]
    origins: NotRequired[list[int | None]]
    restarted: NotRequired[bool]


class FlushResult(TypedDict):
    """``flush``: answered once the data is durable.

    ``loaded`` (with a task): whether the daemon had the task loaded; false
    means there was nothing to write (a task never opened, or already unloaded).
    """

    flushed: int
    loaded: NotRequired[bool]


class CloseResult(TypedDict):
    """``close``: the task's actor is stopped (its state flushed first).

    ``closed``: whether this call stopped the task's actor. ``loaded``: whether the
    daemon held the task; when it did not (a task never opened, or already closed
    or unloaded) there was nothing to close, and ``closed`` is false too.
    """

    closed: bool
    loaded: NotRequired[bool]


class CountTokensResult(TypedDict):
    """``count_tokens``: the tokens, and the part types ctxwin did not recognise (counted by
    the text they hold) with how many parts of each, when there were any."""

    tokens: int
    unrecognised: NotRequired[dict[str, int]]
