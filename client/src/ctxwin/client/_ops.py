"""One builder per wire op: the one place each op's arguments are written.

Each builder checks its arguments against proto's schema and returns the
:class:`~ctxwin.client._core.Call` to send. The clients' and the task handles'
methods are made from these builders (:func:`blocking`, :func:`awaiting` here,
the handles' own in ``_task.py``), so a method takes exactly its builder's
arguments: adding an argument to an op means editing its builder, nothing else.
"""

from __future__ import annotations

import copy
import functools
import inspect as _inspect
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

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
    Strategy,
    build,
    copy_messages,
    copy_pricing,
)

__all__ = [
    "AsyncCaller",
    "Caller",
    "apply_truncation_notice",
    "as_method",
    "awaiting",
    "blocking",
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


def should_compact(
    usage: Usage | None,
    model: Model,
    *,
    threshold: float | None = None,
    task: str | None = None,
    messages: Messages | None = None,
    ephemeral: bool | None = None,
    dialect: str | None = None,
    read_tools: ReadTools | None = None,
    timeout: float | None = None,
) -> Call[ShouldCompactResult]:
    """``should_compact``: whether the last request's usage calls for compaction.

    ``messages``, ``ephemeral``, ``dialect`` and ``read_tools`` act on a task:
    without ``task`` the daemon refuses them (``bad_request``).
    """
    return build(
        "should_compact",
        {"usage": None if usage is None else dict(usage), "model": dict(model)},
        timeout,
        threshold=threshold,
        task=task,
        messages=None if messages is None else copy_messages(messages),
        ephemeral=ephemeral,
        dialect=dialect,
        read_tools=copy_read_tools(read_tools),
    )


def task_should_compact(
    task: str,
    usage: Usage | None,
    model: Model,
    *,
    threshold: float | None = None,
    messages: Messages | None = None,
    ephemeral: bool | None = None,
    dialect: str | None = None,
    read_tools: ReadTools | None = None,
    timeout: float | None = None,
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
        ephemeral=ephemeral,
        dialect=dialect,
        read_tools=read_tools,
        timeout=timeout,
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
    ephemeral: bool | None = None,
    dialect: str | None = None,
    read_tools: ReadTools | None = None,
    strategy: Strategy | None = None,
    proactive: bool | None = None,
    estimate: bool | None = None,
    pricing: Pricing | None = None,
    timeout: float | None = None,
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
    return build(
        "prepare_request",
        {"task": task, "messages": copy_messages(messages), "model": dict(model)},
        timeout,
        previous_request=None if previous_request is None else dict(previous_request),
        use_auto_condense=use_auto_condense,
        summaries=summaries,
        threshold=threshold,
        deleted_range=deleted_range,
        ephemeral=ephemeral,
        dialect=dialect,
        read_tools=copy_read_tools(read_tools),
        strategy=strategy,
        proactive=proactive,
        estimate=estimate,
        pricing=copy_pricing(pricing),
    )


def plan(
    task: str,
    messages: Messages,
    model: Model,
    *,
    previous_request: Usage | None = None,
    use_auto_condense: bool | None = None,
    ephemeral: bool | None = None,
    dialect: str | None = None,
    read_tools: ReadTools | None = None,
    strategy: Strategy | None = None,
    proactive: bool | None = None,
    pricing: Pricing | None = None,
    timeout: float | None = None,
) -> Call[PlanResult]:
    """``plan``: what ``prepare_request`` with these arguments would do now, changing nothing."""
    return build(
        "plan",
        {"task": task, "messages": copy_messages(messages), "model": dict(model)},
        timeout,
        previous_request=None if previous_request is None else dict(previous_request),
        use_auto_condense=use_auto_condense,
        ephemeral=ephemeral,
        dialect=dialect,
        read_tools=copy_read_tools(read_tools),
        strategy=strategy,
        proactive=proactive,
        pricing=copy_pricing(pricing),
    )


def truncated_messages(
    task: str,
    messages: Messages,
    *,
    deleted_range: RangeArg = UNSET,
    ephemeral: bool | None = None,
    dialect: str | None = None,
    read_tools: ReadTools | None = None,
    timeout: float | None = None,
) -> Call[TruncatedMessagesResult]:
    """``truncated_messages``: the view under the task's range and overlay (SPEC.md §4)."""
    return build(
        "truncated_messages",
        {"task": task, "messages": copy_messages(messages)},
        timeout,
        deleted_range=deleted_range,
        ephemeral=ephemeral,
        dialect=dialect,
        read_tools=copy_read_tools(read_tools),
    )


def optimize_file_reads(
    task: str,
    messages: Messages,
    *,
    ts: int | None = None,
    deleted_range: RangeArg = UNSET,
    ephemeral: bool | None = None,
    dialect: str | None = None,
    read_tools: ReadTools | None = None,
    timeout: float | None = None,
) -> Call[OptimizeFileReadsResult]:
    """``optimize_file_reads``: replace stale duplicate file reads (SPEC.md §6; ``ts``: now)."""
    return build(
        "optimize_file_reads",
        {"task": task, "messages": copy_messages(messages), "ts": _ts(ts)},
        timeout,
        deleted_range=deleted_range,
        ephemeral=ephemeral,
        dialect=dialect,
        read_tools=copy_read_tools(read_tools),
    )


def optimize_file_reads_in_memory(
    task: str,
    messages: Messages,
    *,
    ts: int | None = None,
    deleted_range: RangeArg = UNSET,
    ephemeral: bool | None = None,
    dialect: str | None = None,
    read_tools: ReadTools | None = None,
    timeout: float | None = None,
) -> Call[OptimizeFileReadsInMemoryResult]:
    """``optimize_file_reads_in_memory`` (SPEC.md §8; ``ts`` defaults to now)."""
    return build(
        "optimize_file_reads_in_memory",
        {"task": task, "messages": copy_messages(messages), "ts": _ts(ts)},
        timeout,
        deleted_range=deleted_range,
        ephemeral=ephemeral,
        dialect=dialect,
        read_tools=copy_read_tools(read_tools),
    )


def compact_subagent(
    task: str,
    messages: Messages,
    *,
    deleted_range: RangeArg = UNSET,
    ephemeral: bool | None = None,
    dialect: str | None = None,
    read_tools: ReadTools | None = None,
    timeout: float | None = None,
) -> Call[CompactSubagentResult]:
    """``compact_subagent``: compact a subagent's conversation (SPEC.md §8)."""
    return build(
        "compact_subagent",
        {"task": task, "messages": copy_messages(messages)},
        timeout,
        deleted_range=deleted_range,
        ephemeral=ephemeral,
        dialect=dialect,
        read_tools=copy_read_tools(read_tools),
    )


def apply_truncation_notice(
    task: str,
    messages: Messages,
    *,
    ts: int | None = None,
    keep_task: bool | None = None,
    ephemeral: bool | None = None,
    dialect: str | None = None,
    read_tools: ReadTools | None = None,
    timeout: float | None = None,
) -> Call[ApplyTruncationNoticeResult]:
    """``apply_truncation_notice`` (SPEC.md §5; ``ts`` defaults to now).

    ``keep_task=True`` adds only the notice in message 1 and leaves the task,
    the first user message, as it is (by default it is replaced too).
    """
    return build(
        "apply_truncation_notice",
        {"task": task, "messages": copy_messages(messages), "ts": _ts(ts)},
        timeout,
        keep_task=keep_task,
        ephemeral=ephemeral,
        dialect=dialect,
        read_tools=copy_read_tools(read_tools),
    )


def compact(
    task: str,
    messages: Messages,
    keep: CompactKeep = "quarter",
    *,
    ts: int | None = None,
    keep_task: bool | None = None,
    ephemeral: bool | None = None,
    dialect: str | None = None,
    read_tools: ReadTools | None = None,
    timeout: float | None = None,
) -> Call[CompactResult]:
    """``compact``: force a cut (``quarter`` after a context-window error) (SPEC.md §8).

    ``keep_task=True`` leaves the task, the first user message, as it is; by
    default (SPEC.md §5) it is replaced by a notice asking the model to carry on.
    """
    return build(
        "compact",
        {"task": task, "messages": copy_messages(messages), "keep": keep, "ts": _ts(ts)},
        timeout,
        keep_task=keep_task,
        ephemeral=ephemeral,
        dialect=dialect,
        read_tools=copy_read_tools(read_tools),
    )


def condense(
    task: str,
    messages: Messages,
    model: Model,
    *,
    summary: str | None = None,
    threshold: float | None = None,
    usage: Usage | None = None,
    ts: int | None = None,
    ephemeral: bool | None = None,
    dialect: str | None = None,
    read_tools: ReadTools | None = None,
    timeout: float | None = None,
) -> Call[CondenseResult]:
    """``condense``: store a summary for the turns a new range removes (docs/SUMMARIES.md).

    Without ``summary`` ctxwin writes a basic one from the removed turns; a
    model's summary that is blank or would not make the view smaller is
    replaced by it (``fallback`` says why). The result says ``condensed:
    false`` with a ``reason`` when nothing was stored. ``usage``: what the
    request that asked the model for ``summary`` reported; its cost is added
    to the task's cache ledger (docs/PRICING.md).
    """
    return build(
        "condense",
        {"task": task, "messages": copy_messages(messages), "model": dict(model), "ts": _ts(ts)},
        timeout,
        summary=summary,
        threshold=threshold,
        usage=None if usage is None else dict(usage),
        ephemeral=ephemeral,
        dialect=dialect,
        read_tools=copy_read_tools(read_tools),
    )


def condensed(
    task: str,
    messages: Messages,
    *,
    ephemeral: bool | None = None,
    dialect: str | None = None,
    read_tools: ReadTools | None = None,
    timeout: float | None = None,
) -> Call[CondensedResult]:
    """``condensed``: hide the summary request and its turn (SPEC.md §8)."""
    return build(
        "condensed",
        {"task": task, "messages": copy_messages(messages)},
        timeout,
        ephemeral=ephemeral,
        dialect=dialect,
        read_tools=copy_read_tools(read_tools),
    )


def rollback(
    task: str,
    ts: int,
    *,
    deleted_range: RangeArg = UNSET,
    ephemeral: bool | None = None,
    dialect: str | None = None,
    read_tools: ReadTools | None = None,
    timeout: float | None = None,
) -> Call[RollbackResult]:
    """``rollback``: drop overlay updates newer than ``ts`` (SPEC.md §9)."""
    return build(
        "rollback",
        {"task": task, "ts": ts},
        timeout,
        deleted_range=deleted_range,
        ephemeral=ephemeral,
        dialect=dialect,
        read_tools=copy_read_tools(read_tools),
    )


def inspect(
    task: str,
    *,
    ephemeral: bool | None = None,
    dialect: str | None = None,
    read_tools: ReadTools | None = None,
    timeout: float | None = None,
) -> Call[InspectResult]:
    """``inspect``: the task's overlay, range and dirty flag."""
    return build(
        "inspect",
        {"task": task},
        timeout,
        ephemeral=ephemeral,
        dialect=dialect,
        read_tools=copy_read_tools(read_tools),
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


# Methods made from builders: what a client needs to send a Call.


class Caller(Protocol):
    """What a blocking client offers to the methods made from builders and to task handles."""

    endpoint: str
    timeout: float

    def call(self, call: Call[T], *, timeout: float | None = None) -> T:
        """Send ``call``; return its typed result."""
        ...

    def _features(self, deadline: float) -> frozenset[str]:
        """What the daemon on this connection supports (ping's ``features``), asked once."""
        ...


class AsyncCaller(Protocol):
    """What an asyncio client offers to the methods made from builders and to task handles."""

    endpoint: str
    timeout: float

    async def call(self, call: Call[T], *, timeout: float | None = None) -> T:  # noqa: ASYNC109
        """Send ``call``; return its typed result."""
        ...

    async def _features(self, deadline: float) -> frozenset[str]:
        """What the daemon on this connection supports (ping's ``features``), asked once."""
        ...


def as_method(method: Callable[..., Any], build_call: Callable[..., Any], drop: int = 0) -> None:
    """Give ``method`` the name, docstring and signature of ``build_call`` (``self`` first).

    Args:
        method: the method made from the builder.
        build_call: the builder.
        drop: how many of the builder's leading arguments the method fills in
            itself (a task handle's id).
    """
    functools.update_wrapper(method, build_call)
    signature = _inspect.signature(build_call)
    this = _inspect.Parameter("self", _inspect.Parameter.POSITIONAL_ONLY)
    kept = list(signature.parameters.values())[drop:]
    method.__signature__ = signature.replace(parameters=[this, *kept])  # type: ignore[attr-defined]


def blocking(build_call: Callable[P, Call[T]]) -> Callable[Concatenate[Caller, P], T]:
    """A blocking client method taking exactly ``build_call``'s arguments."""

    def method(self: Caller, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.call(build_call(*args, **kwargs))

    as_method(method, build_call)
    return method


def awaiting(
    build_call: Callable[P, Call[T]],
) -> Callable[Concatenate[AsyncCaller, P], Coroutine[Any, Any, T]]:
    """An asyncio client method taking exactly ``build_call``'s arguments."""

    async def method(self: AsyncCaller, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.call(build_call(*args, **kwargs))

    as_method(method, build_call)
    return method
