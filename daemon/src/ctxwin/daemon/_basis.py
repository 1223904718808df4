"""Whether a history is the one a task's range and edits were made on: the task's basis.

The task's range, deleted set and overlay refer to messages by index; they
hold for the history they were made on and for that history grown, not for
another one sent under the same task id (a restarted or rewound
conversation). The basis, ``(length, digest)`` of the history prefix they
were made on, is part of the task's state (:attr:`ctxwin.engine.TaskState.basis`),
stored with it and loaded back after a restart: a history op checks its
history against it before the engine runs (:func:`engine_target`, the task
starts over when it does not match) and records it afterwards
(:func:`record_basis`); ``inspect`` given messages checks them the same way
on a copy (:func:`inspected_view`).
"""

from __future__ import annotations

from typing import Any

from ctxwin import engine, proto

from ._kept import overlay_sources
from ._ops import dialect_refused

__all__ = ["engine_target", "inspected_view", "record_basis"]


def inspected_view(state: engine.TaskState, messages: list[Any]) -> dict[str, Any]:
    """What a request with ``messages`` would now be answered with (``inspect`` given them),
    worked out on a copy of the task: nothing of the task, its kept history or its
    calibration changes.

    Returns:
        ``view``: the view, in the task's dialect; in a native dialect
        ``origins`` (the history index of each view message, None for one the
        view added) and ``sources`` (as :meth:`~._kept.KeptHistory.sources`, of these
        messages); ``restarted``: true when these are not the history the
        task's range and edits were made on (the view is then built afresh, as
        the next history op would build it).

    Raises:
        ProtocolError: ``bad_request`` naming a message the dialect cannot carry.
    """
    dialect = state.dialect
    copy = state.clone()
    mapped: engine.MappedHistory | None = None
    if dialect.native:
        mapped = engine.MappedHistory(dialect)
        try:
            mapped.sync(messages)
        except engine.DialectError as exc:
            raise dialect_refused("inspect", dialect, exc) from None
    result: dict[str, Any] = {}
    if _restarted(copy, None, mapped, {"messages": messages}):
        copy.start_over()
        result["restarted"] = True
    if mapped is None:
        result["view"] = copy.truncated_messages(messages)
        return result
    view = copy.truncated_messages(mapped.internal)
    missing = copy.notices.missing_result
    result["view"], result["origins"] = mapped.view_with_origins(view, copy.deleted_range, missing)
    result["sources"] = overlay_sources(mapped, copy.overlay)
    return result


def engine_target(
    state: engine.TaskState,
    op: str,
    args: dict[str, Any],
    history: engine.History | None,
    mapped: engine.MappedHistory | None,
) -> tuple[engine.TaskState, bool]:
    """The state an op runs on, and whether the task starts over on it: when the history
    is not the one its range and edits were made on (and the caller sets no range), the
    task starts over (``plan`` on a copy: it says what would happen, changing nothing)."""
    if "deleted_range" in args or not _restarted(state, history, mapped, args):
        return state, False
    target = state.clone() if op == "plan" else state
    target.start_over()
    return target, True


def _restarted(
    state: engine.TaskState,
    history: engine.History | None,
    mapped: engine.MappedHistory | None,
    args: dict[str, Any],
) -> bool:
    """Whether the history is not the one the task's range and overlay were made on.

    It is not when it is shorter than the prefix they were made on, or when
    that prefix has another digest: the caller restarted or rewound the
    conversation under the same task id.
    """
    basis = state.basis
    messages: list[Any] = history.messages if history is not None else args["messages"]
    if basis is None:
        # Stored before bases were kept: only a range reaching the history's end shows it.
        deleted = state.deleted_range
        count = len(mapped.internal) if mapped is not None else len(messages)
        return deleted is not None and deleted[1] + 1 >= count
    length, digest = basis
    if len(messages) < length:
        return True
    return _prefix_digest(history, messages, length) != digest


def record_basis(
    state: engine.TaskState,
    revision: tuple[int, int],
    explicit: bool,
    history: engine.History | None,
    mapped: engine.MappedHistory | None,
    args: dict[str, Any],
) -> None:
    """Note the history prefix the task's range and overlay now refer to, when they changed
    (or the caller set the range: it vouches for this history)."""
    extent = state.extent
    if extent == 0:
        state.basis = None
        return
    unchanged = (state.revision, state.overlay.version) == revision
    if state.basis is not None and unchanged and not explicit:
        return  # checked against this history before the op, and unchanged by it
    messages: list[Any] = history.messages if history is not None else args["messages"]
    length = mapped.history_length(extent) if mapped is not None else min(extent, len(messages))
    state.basis = (length, _prefix_digest(history, messages, length))


def _prefix_digest(history: engine.History | None, messages: list[Any], length: int) -> bytes:
    """The digest of the first ``length`` messages: from the kept history's chain, or
    hashed from the list the request sent when no history is kept."""
    if history is not None:
        return history.digest_of(length)
    return proto.DigestChain(messages[:length]).digest(length)
