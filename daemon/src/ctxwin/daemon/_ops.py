"""Wire ops to engine calls (DESIGN.md "Wire protocol", ops table).

Arguments reach these functions already checked by :func:`ctxwin.proto.validate_args`.
Task-free ops run inline on the event loop; task ops run in the task's actor
on its :class:`~ctxwin.engine.TaskState`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from ctxwin import engine, proto

from ._tokens import TokenCounter

__all__ = [
    "HISTORY_OPS",
    "TASK_OPS",
    "asks_estimates",
    "dialect_refused",
    "route_problems",
    "run_free_op",
    "run_task_op",
]

Args = Mapping[str, Any]
Result = dict[str, Any]


# Task-free ops --------------------------------------------------------------


def _context_window_info(args: Args, tokens: TokenCounter) -> Result:
    return engine.context_window_info(args["model"]).wire()


_TASK_ONLY = ("messages", "dialect", "read_tools", "ephemeral")
"""``should_compact`` arguments that act on a task only: without one they would do nothing
(``messages`` counts what follows the task's deleted range)."""


def _should_compact(args: Args, tokens: TokenCounter) -> Result:
    """``should_compact`` without a task.

    Raises:
        ProtocolError: ``bad_request`` for an argument that needs ``task``.
    """
    for name in _TASK_ONLY:
        if name in args:
            raise proto.ProtocolError(
                proto.ErrorCode.BAD_REQUEST,
                f"should_compact: {name!r} needs 'task' (without a task it has no effect)",
            )
    return engine.should_compact(args["usage"], args["model"], args.get("threshold")).wire()


def _next_truncation_range(args: Args, tokens: TokenCounter) -> Result:
    return {
        "deleted_range": engine.next_truncation_range(
            args["messages"], args["deleted_range"], args["keep"]
        )
    }


def _count_tokens(args: Args, tokens: TokenCounter) -> Result:
    if "text" in args:
        return {"tokens": tokens.count_text(args["text"])}
    dialect = engine.get_dialect(args.get("dialect", engine.CLINE))
    if not dialect.native:
        messages = args["messages"]
        return _with_unrecognised({"tokens": tokens.count_messages(messages)}, tokens, messages)
    # What the engine sees of each message, plus the text of kept-out ones (docs/DIALECTS.md).
    mapped = engine.MappedHistory(dialect)
    try:
        mapped.sync(args["messages"])
    except engine.DialectError as exc:
        raise dialect_refused("count_tokens", dialect, exc) from None
    total = sum(tokens.count_message(message) for message in mapped.internal)
    total += sum(
        tokens.count_text(engine.kept_out_text(mapped.source[index])) for index in mapped.systems
    )
    return _with_unrecognised({"tokens": total}, tokens, mapped.internal)


def _with_unrecognised(result: Result, tokens: TokenCounter, internal: Any) -> Result:
    """``result`` with the part types ctxwin did not recognise in ``internal`` (counted by the
    text they hold, docs/DIALECTS.md), when there are any."""
    found = tokens.unrecognised(internal)
    if found:
        result["unrecognised"] = dict(sorted(found.items()))
    return result


_FREE_OPS: dict[str, Callable[[Args, TokenCounter], Result]] = {
    "context_window_info": _context_window_info,
    "should_compact": _should_compact,
    "next_truncation_range": _next_truncation_range,
    "count_tokens": _count_tokens,
}


def run_free_op(op: str, args: Args, tokens: TokenCounter) -> Result:
    """Answer a task-free engine op (``ping`` and ``stats`` are the server's).

    Args:
        op: one of context_window_info, should_compact (no task),
            next_truncation_range, count_tokens.
        args: its validated arguments.
        tokens: the token counter for ``count_tokens``.

    Returns:
        The wire result map.
    """
    return _FREE_OPS[op](args, tokens)


# Task ops -------------------------------------------------------------------


def asks_estimates(args: Args) -> bool:
    """Whether a ``prepare_request`` asks for estimates (``summaries`` measures without)."""
    return (
        bool(args.get("estimate"))
        or bool(args.get("proactive"))
        or "strategy" in args
        or "pricing" in args
    )


def _prepare_request(
    state: engine.TaskState, args: Args, budgeting: engine.Budgeting | None
) -> Result:
    estimating = budgeting if asks_estimates(args) else None
    # Before the view is built: the duplicate-read step it runs may change the view.
    due = _summary_due(state, args)
    if args.get("summaries") and budgeting is not None:
        # A message larger than the window: no cut or summary can fit it.
        engine.fit_oversized(state, args["messages"], args["model"], budgeting, proto.now_ms())
    result: Result = {
        **state.prepare_request(
            args["messages"],
            args.get("previous_request"),
            args["model"],
            bool(args.get("use_auto_condense", False)),
            estimating,
            proto.now_ms(),
        )
    }
    if estimating is not None:
        result["calibration"] = estimating.ratio
    if due:
        result["summary_due"] = True
        result["summary_prompt"] = engine.summary_prompt(state.summary)
    return result


def _summary_due(state: engine.TaskState, args: Args) -> bool:
    """Whether an auto-condensing caller should have a summary written (SPEC.md §8).

    Only when asked (``summaries``): the check runs the duplicate-read step,
    which SPEC.md leaves to the caller of a plain ``use_auto_condense`` request.
    """
    return bool(args.get("use_auto_condense") and args.get("summaries")) and engine.summary_due(
        state,
        args["messages"],
        args.get("previous_request"),
        args["model"],
        args.get("threshold") or engine.AUTO_CONDENSE_FRACTION,
    )


def _plan(state: engine.TaskState, args: Args, budgeting: engine.Budgeting | None) -> Result:
    assert budgeting is not None  # plan always estimates
    return {
        **engine.plan(
            state,
            args["messages"],
            args.get("previous_request"),
            args["model"],
            budgeting,
            bool(args.get("use_auto_condense", False)),
            proto.now_ms(),
        )
    }


def _truncated_messages(
    state: engine.TaskState, args: Args, budgeting: engine.Budgeting | None
) -> Result:
    return {"messages": state.truncated_messages(args["messages"])}


def _optimize_file_reads(
    state: engine.TaskState, args: Args, budgeting: engine.Budgeting | None
) -> Result:
    return {**state.optimize_file_reads(args["messages"], args["ts"])}


def _optimize_file_reads_in_memory(
    state: engine.TaskState, args: Args, budgeting: engine.Budgeting | None
) -> Result:
    return {**state.optimize_file_reads_in_memory(args["messages"], args["ts"])}


def _compact_subagent(
    state: engine.TaskState, args: Args, budgeting: engine.Budgeting | None
) -> Result:
    return {**engine.compact_subagent(state, args["messages"], proto.now_ms())}


def _apply_truncation_notice(
    state: engine.TaskState, args: Args, budgeting: engine.Budgeting | None
) -> Result:
    keep_task = bool(args.get("keep_task", False))
    return {
        "changed": engine.apply_truncation_notice(state, args["ts"], args["messages"], keep_task)
    }


def _compact(state: engine.TaskState, args: Args, budgeting: engine.Budgeting | None) -> Result:
    keep_task = bool(args.get("keep_task", False))
    return {**engine.compact(state, args["messages"], args["keep"], args["ts"], keep_task)}


def _condensed(state: engine.TaskState, args: Args, budgeting: engine.Budgeting | None) -> Result:
    return {"deleted_range": engine.condensed(state, args["messages"])}


def _condense(state: engine.TaskState, args: Args, budgeting: engine.Budgeting | None) -> Result:
    assert budgeting is not None  # condense always measures
    return {
        **engine.condense(
            state,
            args["messages"],
            args["model"],
            args["ts"],
            budgeting,
            args.get("summary"),
            args.get("threshold") or engine.AUTO_CONDENSE_FRACTION,
            args.get("usage"),
        )
    }


def _rollback(state: engine.TaskState, args: Args, budgeting: engine.Budgeting | None) -> Result:
    # A checkpoint restore: the caller sets the task back to an earlier history, which the
    # next history op is taken to be (unless the range reaches past it).
    state.basis = None
    removed = state.rollback(args["ts"])
    if "deleted_range" in args:
        # The checkpoint's range, when the caller gives it, wins over the one a
        # rolled-back condense replaced (SPEC.md §9).
        state.deleted_range = args["deleted_range"]
    return {"removed": removed}


def _should_compact_task(
    state: engine.TaskState, args: Args, budgeting: engine.Budgeting | None
) -> Result:
    messages = args.get("messages")
    dialect = state.dialect
    if dialect.native and messages is not None:
        messages = _internal(dialect, messages, "should_compact")
    return engine.should_compact(
        args["usage"],
        args["model"],
        args.get("threshold"),
        state.deleted_range,
        messages,
    ).wire()


def _internal(dialect: engine.Dialect, messages: Any, op: str) -> list[Any]:
    """``messages`` of ``dialect`` in the internal form.

    Raises:
        ProtocolError: ``bad_request`` naming a message the dialect cannot carry.
    """
    try:
        return list(engine.MappedHistory(dialect, messages).internal)
    except engine.DialectError as exc:
        raise dialect_refused(op, dialect, exc) from None


def dialect_refused(
    op: str, dialect: engine.Dialect, exc: engine.DialectError
) -> proto.ProtocolError:
    """The ``bad_request`` for a message ``dialect`` cannot carry, naming the op and dialect."""
    return proto.ProtocolError(proto.ErrorCode.BAD_REQUEST, f"{op}: {exc} ({dialect.name} dialect)")


TaskOp = Callable[[engine.TaskState, Args, engine.Budgeting | None], Result]

TASK_OPS: dict[str, TaskOp] = {
    "prepare_request": _prepare_request,
    "plan": _plan,
    "truncated_messages": _truncated_messages,
    "optimize_file_reads": _optimize_file_reads,
    "optimize_file_reads_in_memory": _optimize_file_reads_in_memory,
    "compact_subagent": _compact_subagent,
    "apply_truncation_notice": _apply_truncation_notice,
    "compact": _compact,
    "condensed": _condensed,
    "condense": _condense,
    "rollback": _rollback,
    "should_compact": _should_compact_task,
}
"""Task ops that are engine calls; ``inspect``, ``flush`` and ``close`` are the session's
(``_session._OWN_OPS``)."""

HISTORY_OPS = frozenset(op for op, spec in proto.OPS.items() if spec.over_history)
"""Ops over a task's history: they take ``messages`` or a delta, and may answer with a patch."""


def run_task_op(
    state: engine.TaskState, op: str, args: Args, budgeting: engine.Budgeting | None = None
) -> Result:
    """Run one engine op on a task's state.

    A ``deleted_range`` present in ``args`` (even nil) replaces the stored
    range before the call (DESIGN.md: a range given by the caller wins).

    Args:
        state: the task's state, changed in place (never by ``plan``).
        op: a key of :data:`TASK_OPS`.
        args: its validated arguments, with ``messages`` resolved from a delta.
        budgeting: how to estimate, for a request that asks for estimates (``plan`` and
            ``condense`` always do; see :meth:`~._session.TaskSession.handle`).

    Returns:
        The wire result map.
    """
    if "deleted_range" in args:
        state.deleted_range = args["deleted_range"]
    return TASK_OPS[op](state, args, budgeting)


def route_problems(server: Collection[str], session: Collection[str]) -> list[str]:
    """Where the daemon's op tables disagree with the ops ``proto.OPS`` declares.

    A task op runs in the task's actor: an engine call (:data:`TASK_OPS`) or
    the session's own (``session``); a task-free one is an engine call here
    (``_FREE_OPS``); the server answers ``server`` itself (an op whose task
    is optional needs one of those: it is routed by whether it names one).

    Args:
        server: the ops the server answers itself (``_server.SERVER_OPS``).
        session: the task ops the session answers itself (``_session._OWN_OPS``).

    Returns:
        One sentence a problem: an op no table answers, or a table's entry for
        an op that is not declared; empty when they agree.
    """
    tables = {
        "the server's own ops": server,
        "the session's own ops": session,
        "TASK_OPS": TASK_OPS,
        "_FREE_OPS": _FREE_OPS,
    }
    problems = [
        f"{table} answer {op!r}, which proto.OPS does not declare"
        for table, ops in tables.items()
        for op in ops
        if op not in proto.OPS
    ]
    for op, spec in proto.OPS.items():
        if op in server:
            continue
        if spec.needs_task:
            if op not in TASK_OPS and op not in session:
                problems.append(f"task op {op!r} is in neither TASK_OPS nor the session's own ops")
        elif spec.takes_task:
            problems.append(f"{op!r} takes an optional task: the server must route it itself")
        elif op not in _FREE_OPS:
            problems.append(f"task-free op {op!r} is not in _FREE_OPS")
    return problems
