"""One builder per wire op: the one place each op's arguments are written.

Each builder checks its arguments against proto's schema and returns the
:class:`~ctxwin.client._core.Call` to send. The clients' and the task handles'
methods are made from these builders (``_methods.py`` for the clients,
``_task.py`` for the handles), so a method takes exactly its builder's
arguments: adding an argument to an op means editing its builder, nothing else.
What every task op takes besides its own (``ephemeral``, ``dialect``,
``read_tools``, ``timeout``) is written once, as :class:`TaskOptions`.
"""

from __future__ import annotations

import copy
import inspect as _inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypedDict, TypeVar, Unpack

from ctxwin import proto
from ctxwin.proto import (
    ApplyTruncationNoticeResult,
    CloseResult,
    CompactResult,
    CompactSubagentResult,
    CondensedResult,
    CondenseResult,
    ContextWindowInfoResult,
    CountTokensResult,
    DeletedRange,
    FlushResult,
    InspectResult,
    Keep,
    Model,
    NextTruncationRangeResult,
    OptimizeFileReadsInMemoryResult,
    OptimizeFileReadsResult,
    PingResult,
    PlanResult,
    PrepareRequestResult,
    RollbackResult,
    ShouldCompactResult,
    StatsResult,
    Strategy,
    TruncatedMessagesResult,
    Usage,
)

from ._core import (
    UNSET,
    Call,
    CompactKeep,
    Messages,
    Pricing,
    RangeArg,
    build,
    copy_messages,
    copy_pricing,
)

__all__ = [
    "TaskOptions",
    "apply_truncation_notice",
    "close",
    "compact",
    "compact_subagent",
    "condense",
    "condensed",
    "context_window_info",
    "copy_read_tools",
    "count_tokens",
    "flush",
    "inspect",
    "next_truncation_range",
    "optimize_file_reads",
    "optimize_file_reads_in_memory",
    "ping",
    "plan",
    "prepare_request",
    "rollback",
    "should_compact",
    "stats",
    "takes_options",
    "task_should_compact",
    "truncated_messages",
]

P = ParamSpec("P")
T = TypeVar("T")


ReadTools = Sequence[Mapping[str, Any]]
"""A task's own read tools: ``{"name", "arg", "when"?, "pattern"?}`` maps (docs/DIALECTS.md)."""


def copy_read_tools(tools: ReadTools | None) -> list[dict[str, Any]] | None:
    """A call's own copy of ``read_tools`` (None stays None)."""
    # Copied, so that the caller's later edits do not reach a call in flight; what
    # is not a list of maps goes as it is, for the daemon to refuse it by name.
    if tools is None or isinstance(tools, str | bytes | Mapping):
        return tools  # type: ignore[return-value]
    return [copy.deepcopy(dict(tool)) if isinstance(tool, Mapping) else tool for tool in tools]


def _ts(ts: int | None) -> int:
    return proto.now_ms() if ts is None else ts


class TaskOptions(TypedDict, total=False):
    """What every task op takes besides its own arguments (a task handle fills in its own).

    Attributes:
        ephemeral: keep the task in the daemon's memory only.
        dialect: the task's message dialect (fixed at its first use).
        read_tools: the task's own read tools, besides the daemon's table.
        timeout: seconds for the call (the client's default when None).
    """

    ephemeral: bool | None
    dialect: str | None
    read_tools: ReadTools | None
    timeout: float | None


_OPTIONS = [
    _inspect.Parameter(
        name,
        _inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=getattr(hint, "__forward_arg__", hint),
    )
    for name, hint in TaskOptions.__annotations__.items()
]


def takes_options(build_call: Callable[P, Call[T]]) -> Callable[P, Call[T]]:
    """Show a builder's ``**options`` as the keyword arguments of :class:`TaskOptions`.

    ``help()``, the methods made from the builder and the handles' defaults
    (``_task.py``) read the signature, so they see ``ephemeral=None, ...,
    timeout=None`` as if written out.
    """
    signature = _inspect.signature(build_call)
    kept = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    build_call.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*kept, *_OPTIONS]
    )
    return build_call


def _task_call(op: str, args: dict[str, Any], options: TaskOptions, **optional: Any) -> Call[Any]:
    """``build`` for a task op: its own optional arguments, then ``options``.

    Raises:
        TypeError: ``options`` holds a name :class:`TaskOptions` does not know
            (as for a misspelt keyword argument).
    """
    unknown = options.keys() - TaskOptions.__optional_keys__
    if unknown:
        raise TypeError(f"{op}() got unexpected keyword argument(s) {', '.join(sorted(unknown))}")
    return build(
        op,
        args,
        options.get("timeout"),
        **optional,
        ephemeral=options.get("ephemeral"),
        dialect=options.get("dialect"),
        read_tools=copy_read_tools(options.get("read_tools")),
    )


def ping(*, timeout: float | None = None) -> Call[PingResult]:
    """``ping``: whether the daemon answers, its version and protocol."""
    return build("ping", {}, timeout)


def stats(*, timeout: float | None = None) -> Call[StatsResult]:
    """``stats``: the daemon's counters."""
    return build("stats", {}, timeout)


def context_window_info(
    model: Model, *, timeout: float | None = None
) -> Call[ContextWindowInfoResult]:
    """``context_window_info``: the window and the largest allowed size (SPEC.md §2)."""
    return build("context_window_info", {"model": dict(model)}, timeout)


@takes_options
def should_compact(
    usage: Usage | None,
    model: Model,
    *,
    threshold: float | None = None,
    task: str | None = None,
    messages: Messages | None = None,
    **options: Unpack[TaskOptions],
) -> Call[ShouldCompactResult]:
    """``should_compact``: whether the last request's usage calls for compaction.

    ``messages``, ``ephemeral``, ``dialect`` and ``read_tools`` act on a task:
    without ``task`` the daemon refuses them (``bad_request``).
    """
    return _task_call(
        "should_compact",
        {"usage": None if usage is None else dict(usage), "model": dict(model)},
        options,
        threshold=threshold,
        task=task,
        messages=None if messages is None else copy_messages(messages),
    )


@takes_options
def task_should_compact(
    task: str,
    usage: Usage | None,
    model: Model,
    *,
    threshold: float | None = None,
    messages: Messages | None = None,
    **options: Unpack[TaskOptions],
) -> Call[ShouldCompactResult]:
    """``should_compact`` for a task: whether the last request's usage calls for compaction.

    The one op whose task is not its first argument; a test keeps the two
    builders' arguments the same.
    """
    return should_compact(
        usage,
        model,
        threshold=threshold,
        task=task,
        messages=messages,
        **options,
    )


def next_truncation_range(
    messages: Messages,
    deleted_range: DeletedRange,
    keep: Keep,
    *,
    timeout: float | None = None,
) -> Call[NextTruncationRangeResult]:
    """``next_truncation_range`` (SPEC.md §3)."""
    return build(
        "next_truncation_range",
        {
            "messages": copy_messages(messages),
            "deleted_range": None if deleted_range is None else list(deleted_range),
            "keep": keep,
        },
        timeout,
    )


@takes_options
def prepare_request(
    task: str,
    messages: Messages,
    model: Model,
    *,
    previous_request: Usage | None = None,
    use_auto_condense: bool | None = None,
    summaries: bool | None = None,
    threshold: float | None = None,
    deleted_range: RangeArg = UNSET,
    strategy: Strategy | None = None,
    proactive: bool | None = None,
    estimate: bool | None = None,
    pricing: Pricing | None = None,
    **options: Unpack[TaskOptions],
) -> Call[PrepareRequestResult]:
    """``prepare_request``: the messages to send to the model this turn (SPEC.md §7).

    ``strategy`` (``"fit"``, ``"auto"``), ``proactive=True``, ``estimate=True``
    and ``pricing`` (a price sheet's name or ``{input, cache_write, cache_read}``,
    docs/PRICING.md) opt into token estimates and the cache ledger (see
    :class:`~ctxwin.proto.PrepareRequestResult`); without them the daemon
    follows SPEC.md exactly. With ``use_auto_condense=True`` nothing
    is cut here; adding ``summaries=True``, when the last request crossed
    ``threshold`` of the window (0.75 by default) the daemon runs the
    duplicate-read step and, when that is not enough, the result says
    ``summary_due`` and carries the ``summary_prompt`` to send (then call
    :func:`condense`).
    """
    return _task_call(
        "prepare_request",
        {"task": task, "messages": copy_messages(messages), "model": dict(model)},
        options,
        previous_request=None if previous_request is None else dict(previous_request),
        use_auto_condense=use_auto_condense,
        summaries=summaries,
        threshold=threshold,
        deleted_range=deleted_range,
        strategy=strategy,
        proactive=proactive,
        estimate=estimate,
        pricing=copy_pricing(pricing),
    )


@takes_options
def plan(
    task: str,
    messages: Messages,
    model: Model,
    *,
    previous_request: Usage | None = None,
    use_auto_condense: bool | None = None,
    strategy: Strategy | None = None,
    proactive: bool | None = None,
    pricing: Pricing | None = None,
    **options: Unpack[TaskOptions],
) -> Call[PlanResult]:
    """``plan``: what ``prepare_request`` with these arguments would do now, changing nothing."""
    return _task_call(
        "plan",
        {"task": task, "messages": copy_messages(messages), "model": dict(model)},
        options,
        previous_request=None if previous_request is None else dict(previous_request),
        use_auto_condense=use_auto_condense,
        strategy=strategy,
        proactive=proactive,
        pricing=copy_pricing(pricing),
    )


@takes_options
def truncated_messages(
    task: str,
    messages: Messages,
    *,
    deleted_range: RangeArg = UNSET,
    **options: Unpack[TaskOptions],
) -> Call[TruncatedMessagesResult]:
    """``truncated_messages``: the view under the task's range and overlay (SPEC.md §4)."""
    return _task_call(
        "truncated_messages",
        {"task": task, "messages": copy_messages(messages)},
        options,
        deleted_range=deleted_range,
    )


@takes_options
def optimize_file_reads(
    task: str,
    messages: Messages,
    *,
    ts: int | None = None,
    deleted_range: RangeArg = UNSET,
    **options: Unpack[TaskOptions],
) -> Call[OptimizeFileReadsResult]:
    """``optimize_file_reads``: replace stale duplicate file reads (SPEC.md §6; ``ts``: now)."""
    return _task_call(
        "optimize_file_reads",
        {"task": task, "messages": copy_messages(messages), "ts": _ts(ts)},
        options,
        deleted_range=deleted_range,
    )


@takes_options
def optimize_file_reads_in_memory(
    task: str,
    messages: Messages,
    *,
    ts: int | None = None,
    deleted_range: RangeArg = UNSET,
    **options: Unpack[TaskOptions],
) -> Call[OptimizeFileReadsInMemoryResult]:
    """``optimize_file_reads_in_memory`` (SPEC.md §8; ``ts`` defaults to now)."""
    return _task_call(
        "optimize_file_reads_in_memory",
        {"task": task, "messages": copy_messages(messages), "ts": _ts(ts)},
        options,
        deleted_range=deleted_range,
    )


@takes_options
def compact_subagent(
    task: str,
    messages: Messages,
    *,
    deleted_range: RangeArg = UNSET,
    **options: Unpack[TaskOptions],
) -> Call[CompactSubagentResult]:
    """``compact_subagent``: compact a subagent's conversation (SPEC.md §8)."""
    return _task_call(
        "compact_subagent",
        {"task": task, "messages": copy_messages(messages)},
        options,
        deleted_range=deleted_range,
    )


@takes_options
def apply_truncation_notice(
    task: str,
    messages: Messages,
    *,
    ts: int | None = None,
    keep_task: bool | None = None,
    **options: Unpack[TaskOptions],
) -> Call[ApplyTruncationNoticeResult]:
    """``apply_truncation_notice`` (SPEC.md §5; ``ts`` defaults to now).

    ``keep_task=True`` adds only the notice in message 1 and leaves the task,
    the first user message, as it is (by default it is replaced too).
    """
    return _task_call(
        "apply_truncation_notice",
        {"task": task, "messages": copy_messages(messages), "ts": _ts(ts)},
        options,
        keep_task=keep_task,
    )


@takes_options
def compact(
    task: str,
    messages: Messages,
    keep: CompactKeep = "quarter",
    *,
    ts: int | None = None,
    keep_task: bool | None = None,
    **options: Unpack[TaskOptions],
) -> Call[CompactResult]:
    """``compact``: force a cut (``quarter`` after a context-window error) (SPEC.md §8).

    ``keep_task=True`` leaves the task, the first user message, as it is; by
    default (SPEC.md §5) it is replaced by a notice asking the model to carry on.
    """
    return _task_call(
        "compact",
        {"task": task, "messages": copy_messages(messages), "keep": keep, "ts": _ts(ts)},
        options,
        keep_task=keep_task,
    )


@takes_options
def condense(
    task: str,
    messages: Messages,
    model: Model,
    *,
    summary: str | None = None,
    threshold: float | None = None,
    usage: Usage | None = None,
    ts: int | None = None,
    **options: Unpack[TaskOptions],
) -> Call[CondenseResult]:
    """``condense``: store a summary for the turns a new range removes (docs/SUMMARIES.md).

    Without ``summary`` ctxwin writes a basic one from the removed turns; a
    model's summary that is blank or would not make the view smaller is
    replaced by it (``fallback`` says why). The result says ``condensed:
    false`` with a ``reason`` when nothing was stored. ``usage``: what the
    request that asked the model for ``summary`` reported; its cost is added
    to the task's cache ledger (docs/PRICING.md).
    """
    return _task_call(
        "condense",
        {"task": task, "messages": copy_messages(messages), "model": dict(model), "ts": _ts(ts)},
        options,
        summary=summary,
        threshold=threshold,
        usage=None if usage is None else dict(usage),
    )


@takes_options
def condensed(
    task: str,
    messages: Messages,
    **options: Unpack[TaskOptions],
) -> Call[CondensedResult]:
    """``condensed``: hide the summary request and its turn (SPEC.md §8)."""
    return _task_call(
        "condensed",
        {"task": task, "messages": copy_messages(messages)},
        options,
    )


@takes_options
def rollback(
    task: str,
    ts: int,
    *,
    deleted_range: RangeArg = UNSET,
    **options: Unpack[TaskOptions],
) -> Call[RollbackResult]:
    """``rollback``: drop overlay updates newer than ``ts`` (SPEC.md §9)."""
    return _task_call(
        "rollback",
        {"task": task, "ts": ts},
        options,
        deleted_range=deleted_range,
    )


@takes_options
def inspect(
    task: str,
    **options: Unpack[TaskOptions],
) -> Call[InspectResult]:
    """``inspect``: the task's overlay, range and dirty flag."""
    return _task_call(
        "inspect",
        {"task": task},
        options,
    )


def flush(task: str | None = None, *, timeout: float | None = None) -> Call[FlushResult]:
    """``flush``: returns once the task (or every task, when None) is durable on disk."""
    return build("flush", {}, timeout, task=task)


def close(task: str, *, timeout: float | None = None) -> Call[CloseResult]:
    """``close``: flush the task and stop its actor."""
    return build("close", {"task": task}, timeout)


def count_tokens(
    messages: Messages | None = None,
    *,
    text: str | None = None,
    dialect: str | None = None,
    timeout: float | None = None,
) -> Call[CountTokensResult]:
    """``count_tokens``: tokens of either ``messages`` (of ``dialect``) or ``text``."""
    return build(
        "count_tokens",
        {},
        timeout,
        messages=None if messages is None else copy_messages(messages),
        text=text,
        dialect=dialect,
    )
