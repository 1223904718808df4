"""Every op of protocol version 1, declared once, and what is derived from the declarations.

An op's declaration (:class:`OpSpec`) says its arguments, its result type,
the feature ``ping`` names for it, whether a resend is safe and which result
fields name history indices. From the table :data:`OPS` come the result
fields a reply must carry (:data:`RESULT_FIELDS`), the features
(:data:`FEATURES`), the ops a client sends again (:data:`SAFE_TO_REPEAT`),
the clients' methods (generated, ``client/scripts/generate.py``) and the
daemon's check that it routes every op (``ctxwin.daemon._ops.route_problems``).
docs/ARCHITECTURE.md lists what else a new op needs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import _results as results
from ._errors import ErrorCode, ProtocolError
from ._schema import (
    CHECKS,
    COMPACT_KEEP_VALUES,
    DEFAULT_DIALECT,
    _check_messages,
    _check_task,
    _Invalid,
    _is_int,
    _one_of,
)

__all__ = [
    "FEATURES",
    "OPS",
    "PROTOCOL_FEATURES",
    "RESULT_FIELDS",
    "SAFE_TO_REPEAT",
    "OpSpec",
    "validate_args",
]

HISTORY = ("messages", "append")
"""The ``one_of`` group of an op over a task's history: its messages, or a delta."""


@dataclass(frozen=True, slots=True)
class OpSpec:
    """One op of the wire table, declared once.

    Attributes:
        name: the op as sent in ``op``.
        required: arguments that must be present.
        optional: arguments that may be present.
        one_of: groups of which exactly one argument must be present.
        checks: argument checks of this op that replace the common ones.
        result: the TypedDict of its ``result`` map (its required keys are
            what every reply carries, :data:`RESULT_FIELDS`).
        feature: the name ``ping`` lists for a daemon that has this op, when
            it is not part of every daemon of the protocol version.
        safe_to_repeat: sending it twice gives the same state and answer as
            once, so a client resends it when the connection drops with it in
            flight (:data:`SAFE_TO_REPEAT`).
        history_indices: fields of its result that name messages by their
            index, each a list of ``[index, ...]`` entries: in a native
            dialect the daemon maps each entry's index back from the internal
            form to the caller's history (``ctxwin.daemon._kept``, which reads
            this and nothing else).
        doc: its row of docs/PROTOCOL.md's op table, (arguments, result), as the
            table reads: ``?`` after each optional argument (the delta parts and
            the open arguments every task op takes left out), the fields its result
            always has, notes in parentheses. ``client/scripts/generate.py``
            writes the table from these.
    """

    name: str
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    one_of: tuple[tuple[str, ...], ...] = ()
    checks: Mapping[str, Callable[[object], None]] | None = None
    result: type = dataclasses.field(kw_only=True)
    feature: str | None = dataclasses.field(default=None, kw_only=True)
    safe_to_repeat: bool = dataclasses.field(default=False, kw_only=True)
    history_indices: tuple[str, ...] = dataclasses.field(default=(), kw_only=True)
    doc: tuple[str, str] = dataclasses.field(default=("", ""), kw_only=True)
    # Every argument name, worked out once: validate_args asks for each argument
    # of every request (it was 8 set builds a request, about 1 us each).
    _fields: frozenset[str] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = set(self.required) | set(self.optional)
        for group in self.one_of:
            names.update(group)
        object.__setattr__(self, "_fields", frozenset(names))

    @property
    def needs_task(self) -> bool:
        """The op runs in a task's actor (``task`` is required)."""
        return "task" in self.required

    @property
    def takes_task(self) -> bool:
        """The op may name a task (a task handle has a method for it)."""
        return "task" in self._fields

    @property
    def over_history(self) -> bool:
        """The op takes a task's history: ``messages``, or a delta on the history sent before."""
        return HISTORY in self.one_of

    @property
    def fields(self) -> frozenset[str]:
        """Every argument it takes."""
        return self._fields

    @property
    def result_fields(self) -> tuple[str, ...]:
        """The fields its result always carries (the result type's required keys, in order)."""
        required: frozenset[str] = self.result.__required_keys__  # type: ignore[attr-defined]
        return tuple(key for key in self.result.__annotations__ if key in required)


_OPEN = ("ephemeral", "dialect", "read_tools")
_DELTA = ("base", "base_digest", "view", "patch_base", "patch_skip")
_BUDGETING = ("strategy", "proactive", "estimate", "pricing")


def _history_op(
    name: str,
    required: tuple[str, ...],
    optional: tuple[str, ...] = (),
    checks: Mapping[str, Callable[[object], None]] | None = None,
    **declared: Any,
) -> OpSpec:
    """An op over a task's history: ``messages``, or a delta on the history sent before."""
    return OpSpec(name, required, (*optional, *_DELTA, *_OPEN), (HISTORY,), checks, **declared)


OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        OpSpec(
            "ping",
            result=results.PingResult,
            doc=("-", "pong, version, proto, features, dialects"),
            safe_to_repeat=True,
        ),
        OpSpec(
            "stats",
            result=results.StatsResult,
            doc=(
                "-",
                (
                    "tasks (ids used since start), actors (tasks loaded now), requests, flushes, "
                    "write_failures, uptime_s, store, ..."
                ),
            ),
            safe_to_repeat=True,
        ),
        OpSpec(
            "context_window_info",
            ("model",),
            result=results.ContextWindowInfoResult,
            doc=("model", "context_window, max_allowed_size"),
            safe_to_repeat=True,
        ),
        OpSpec(
            "should_compact",
            ("usage", "model"),
            ("threshold", "task", "messages", *_OPEN),
            result=results.ShouldCompactResult,
            doc=(
                "usage, model, threshold?, task?, messages?",
                "compact, total_tokens, threshold_tokens",
            ),
            safe_to_repeat=True,
        ),
        OpSpec(
            "next_truncation_range",
            ("messages", "deleted_range", "keep"),
            result=results.NextTruncationRangeResult,
            doc=("messages, deleted_range, keep", "deleted_range"),
            safe_to_repeat=True,
        ),
        _history_op(
            "prepare_request",
            ("task", "model"),
            (
                "previous_request",
                "use_auto_condense",
                "summaries",
                "threshold",
                "deleted_range",
                *_BUDGETING,
            ),
            result=results.PrepareRequestResult,
            doc=(
                (
                    "task, messages, model, previous_request?, use_auto_condense?, summaries?, "
                    "threshold?, deleted_range?, strategy?, proactive?, estimate?, pricing?"
                ),
                (
                    "deleted_range, range_updated, messages, stalled, (estimated_tokens, fits, "
                    "largest, calibration, cache, receipts), (summary_due, summary_prompt), "
                    "(restarted)"
                ),
            ),
            history_indices=("largest",),
        ),
        _history_op(
            "plan",
            ("task", "model"),
            ("previous_request", "use_auto_condense", "strategy", "proactive", "pricing"),
            result=results.PlanResult,
            doc=(
                (
                    "task, messages, model, previous_request?, use_auto_condense?, strategy?, "
                    "proactive?, pricing?"
                ),
                (
                    "deleted_range, range_updated, file_reads, tokens_before, tokens_after, "
                    "budget, "
                    "fits, stalled, largest, calibration"
                ),
            ),
            feature="plan",
            safe_to_repeat=True,
            history_indices=("largest",),
        ),
        _history_op(
            "truncated_messages",
            ("task",),
            ("deleted_range",),
            result=results.TruncatedMessagesResult,
            doc=("task, messages, deleted_range?", "messages"),
            # It sets the range it is given, if any: the same twice.
            safe_to_repeat=True,
        ),
        _history_op(
            "optimize_file_reads",
            ("task", "ts"),
            ("deleted_range",),
            result=results.OptimizeFileReadsResult,
            doc=("task, messages, ts, deleted_range?", "changed, need_to_truncate, percent_saved"),
        ),
        _history_op(
            "optimize_file_reads_in_memory",
            ("task", "ts"),
            ("deleted_range",),
            result=results.OptimizeFileReadsInMemoryResult,
            doc=("task, messages, ts, deleted_range?", "changed, need_to_truncate, messages"),
        ),
        _history_op(
            "compact_subagent",
            ("task",),
            ("deleted_range",),
            result=results.CompactSubagentResult,
            doc=("task, messages, deleted_range?", "compacted, deleted_range, messages"),
        ),
        _history_op(
            "apply_truncation_notice",
            ("task", "ts"),
            ("keep_task",),
            result=results.ApplyTruncationNoticeResult,
            doc=("task, ts, messages, keep_task?", "changed"),
        ),
        _history_op(
            "compact",
            ("task", "keep", "ts"),
            ("keep_task",),
            checks={"keep": _one_of(COMPACT_KEEP_VALUES)},
            result=results.CompactResult,
            doc=(
                "task, messages, keep (quarter or none), ts, keep_task?",
                "deleted_range, changed",
            ),
        ),
        _history_op(
            "condensed",
            ("task",),
            result=results.CondensedResult,
            doc=("task, messages", "deleted_range"),
        ),
        _history_op(
            "condense",
            ("task", "model", "ts"),
            ("summary", "threshold", "usage"),
            result=results.CondenseResult,
            doc=(
                "task, messages, model, ts, summary?, threshold?, usage?",
                (
                    "condensed, reason, deleted_range, summary, fallback, tokens_before, "
                    "tokens_after, trigger, messages"
                ),
            ),
            feature="summaries",
        ),
        OpSpec(
            "rollback",
            ("task", "ts"),
            ("deleted_range", *_OPEN),
            result=results.RollbackResult,
            doc=(
                "task, ts, deleted_range?",
                (
                    "removed (refused for a task that does not exist, without a range; and for a "
                    "range past the history the task was last sent)"
                ),
            ),
        ),
        OpSpec(
            "inspect",
            ("task",),
            ("messages", *_OPEN),
            result=results.InspectResult,
            doc=(
                "task, messages?",
                (
                    "updates (on-disk form), deleted_range, dirty, calibration, history, "
                    "read_tools, "
                    "store, owner, fence, (sources), (summaries, summary), (dropped: auto's "
                    "deleted "
                    "set), (exists: false for a task neither loaded nor stored, which inspecting "
                    "does"
                    " not create), (view, origins, restarted: given messages)"
                ),
            ),
            safe_to_repeat=True,
        ),
        OpSpec(
            "flush",
            (),
            ("task",),
            result=results.FlushResult,
            doc=("task?", "flushed, loaded (with a task)"),
            safe_to_repeat=True,
        ),
        OpSpec(
            "close",
            ("task",),
            result=results.CloseResult,
            doc=("task", "closed, loaded"),
            safe_to_repeat=True,
        ),
        OpSpec(
            "count_tokens",
            optional=("dialect",),
            one_of=(("messages", "text"),),
            result=results.CountTokensResult,
            doc=("messages or text, dialect?", "tokens, (unrecognised)"),
            safe_to_repeat=True,
        ),
    )
}
"""Every op of protocol version 1, by name."""

RESULT_FIELDS: dict[str, tuple[str, ...]] = {op: spec.result_fields for op, spec in OPS.items()}
"""The fields each op's result always carries (its type's required keys, in order)."""

SAFE_TO_REPEAT = frozenset(op for op, spec in OPS.items() if spec.safe_to_repeat)
"""Ops a client sends again when the connection drops with them in flight.

A request in flight when the daemon went away may or may not have been applied
(and a daemon killed with SIGKILL loses what it had not written yet). These ops
give the same state and the same answer whether or not the first one was
applied: the reads, and ``flush`` and ``close``, whose effect is the same
however often it happens. The others (``prepare_request``, ``compact``,
``rollback``, the file read optimisations, ...) change the task, and their
answer says what they changed: a second sending would cut again or report
nothing changed, so they fail instead.
"""

PROTOCOL_FEATURES = (
    "delta",
    "view_patch",
    "view_patch_prepend",
    "view_patch_skip",
    "budgeting",
    "dialects",
    "read_tools",
    "auto",
)
"""The features of protocol version 1 that are parts of ops rather than ops of their own.

``delta``: ops that take ``messages`` also take ``base``/``base_digest``/``append``;
``view_patch``: ``view: "patch"`` returns views as patches; ``view_patch_prepend``:
``view: "patch_prepend"`` returns them with ``prepend`` entries too; ``view_patch_skip``:
a caller that asks for a patch with ``patch_skip: true`` gets the view of a history with
gaps (``auto``'s deleted set) as a patch with ``skip`` runs, not whole; ``budgeting``:
``prepare_request`` takes ``strategy``/``proactive``/``estimate`` and tasks
calibrate estimates; ``dialects``: task ops and ``count_tokens`` take
``dialect`` (``ping`` lists them, docs/DIALECTS.md); ``read_tools``: task ops
take ``read_tools``, the tools whose calls read a file in that task, besides
the daemon's table; ``auto``: ``strategy: "auto"``, ``pricing`` and the cache
ledger (docs/STRATEGIES.md, docs/PRICING.md).
"""

FEATURES = (*PROTOCOL_FEATURES, *dict.fromkeys(s.feature for s in OPS.values() if s.feature))
"""Optional parts of protocol version 1 this version implements, named in ``ping``:
:data:`PROTOCOL_FEATURES` and those the ops declare (``plan``: the ``plan`` op;
``summaries``: the ``condense`` op, summaries kept as task state, and
``prepare_request``'s ``summary_due``, docs/SUMMARIES.md).

A daemon's ``ping`` names these and those of its state store: ``fleet`` for
the Redis store (a task is served by one daemon at a time, and another answers
``owned_elsewhere`` naming its ``owner``).
"""


def validate_args(op: str, args: Mapping[str, Any]) -> OpSpec:
    """Check ``args`` against the op's spec.

    Args:
        op: the op name from the request.
        args: the request's args map.

    Returns:
        The op's spec.

    Raises:
        ProtocolError: ``unknown_op`` for an op not in :data:`OPS`,
            ``invalid_task_id`` for a bad task id, ``bad_request`` for a
            missing, unknown or ill-typed argument.
    """
    spec = OPS.get(op)
    if spec is None:
        raise ProtocolError(ErrorCode.UNKNOWN_OP, f"unknown op {op!r}")
    for name in spec.required:
        if name not in args:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"{op}: missing argument {name!r}")
    for group in spec.one_of:
        present = [name for name in group if name in args]
        if len(present) != 1:
            raise ProtocolError(
                ErrorCode.BAD_REQUEST, f"{op}: give exactly one of {', '.join(group)}"
            )
    fields = spec.fields
    unknown = [name for name in args if name not in fields]
    if unknown:
        raise ProtocolError(
            ErrorCode.BAD_REQUEST, f"{op}: unknown argument(s) {sorted(map(str, unknown))}"
        )
    if ("append" in args) != ("base" in args and "base_digest" in args) or (
        "messages" in args and ("base" in args or "base_digest" in args)
    ):
        raise ProtocolError(
            ErrorCode.BAD_REQUEST,
            f"{op}: give either messages, or base, base_digest and append together",
        )
    # The task id first: a bad one must be refused as such, whatever else is wrong.
    if "task" in args:
        _check_task(args["task"])
    dialect = args.get("dialect", DEFAULT_DIALECT)
    for name, value in args.items():
        if name == "task":
            continue
        try:
            if name in ("messages", "append"):
                base = args.get("base") if name == "append" else 0
                first = base if isinstance(base, int) and _is_int(base) and base >= 0 else 0
                _check_messages(value, first, dialect == DEFAULT_DIALECT)
                continue
            check = (spec.checks or {}).get(name) or CHECKS[name]
            check(value)
        except _Invalid as exc:
            where = f"{op}: {exc}" if exc.placed else f"{op}: {name} {exc}"
            raise ProtocolError(ErrorCode.BAD_REQUEST, where) from None
    return spec
