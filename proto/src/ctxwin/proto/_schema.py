"""The arguments of wire protocol version 1 and their checks.

DESIGN.md "Wire protocol" is the contract; this module and ``_ops.py`` (the
ops, declared once) are its executable form. The daemon validates every
request with :func:`~._ops.validate_args` before any work; the client library
uses the same tables, so both sides agree on shapes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any, Literal, NotRequired, TypedDict, get_args

from ._delta import DIGEST_SIZE
from ._errors import ErrorCode, ProtocolError
from ._pricing import pricing_error

TASK_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""Task ids (DESIGN.md): anything else is refused before it can touch a path."""

KEEP_VALUES = ("none", "lastTwo", "half", "quarter")
COMPACT_KEEP_VALUES = ("quarter", "none")
USAGE_FIELDS = ("tokens_in", "tokens_out", "cache_writes", "cache_reads")
VIEW_VALUES = ("list", "patch", "patch_prepend")
Strategy = Literal["default", "fit", "auto"]
"""How ``prepare_request`` makes a view (docs/STRATEGIES.md): its strategies' names, once."""
STRATEGY_VALUES: tuple[Strategy, ...] = get_args(Strategy)
CLINE = "cline"
"""The identity dialect: messages in the shape SPEC.md describes (the only place it is spelled)."""
DIALECTS = (CLINE, "openai-chat", "anthropic", "openai-responses", "gemini")
"""A task's message dialects (docs/DIALECTS.md); ``cline`` (SPEC.md) is the default."""
DEFAULT_DIALECT = CLINE
SUMMARY_MARK = "[ctxwin summary]"
"""Opens every summary a view carries (docs/SUMMARIES.md), so readers and pages can tell it."""
DELTA_FIELDS = ("base", "base_digest", "append")
"""Sent instead of ``messages`` by a caller that syncs by delta (DESIGN.md, delta sync)."""

Keep = Literal["none", "lastTwo", "half", "quarter"]
DeletedRange = list[int] | None


class Message(TypedDict):
    """A conversation message (SPEC.md §1); other keys pass through."""

    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class Model(TypedDict):
    """The model a request goes to (SPEC.md §2)."""

    id: str
    context_window: NotRequired[int | float | None]
    provider: NotRequired[str | None]


class Usage(TypedDict, total=False):
    """Token usage of a model request (SPEC.md §2); missing fields count 0."""

    ts: int
    tokens_in: int
    tokens_out: int
    cache_writes: int
    cache_reads: int


def is_valid_task_id(task: object) -> bool:
    """Whether ``task`` is a task id the daemon accepts."""
    return isinstance(task, str) and TASK_ID_PATTERN.fullmatch(task) is not None


class _Invalid(Exception):
    """An argument failed its check; converted to a ProtocolError by validate_args.

    ``placed``: the message already names where (``messages[3].role``), not
    only what is wrong with the argument.
    """

    def __init__(self, message: str, placed: str = "") -> None:
        super().__init__(message)
        self.placed = placed


INT_MIN, INT_MAX = -(2**63), 2**64 - 1
"""The integers msgpack encodes; anything outside is refused before encoding."""


MAX_COUNT = 2**53 - 1
"""Largest token count, context window or range end taken (no history is this long);
sums of them still fit what msgpack encodes."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and INT_MIN <= value <= INT_MAX


def _check_task(value: object) -> None:
    if not is_valid_task_id(value):
        raise ProtocolError(
            ErrorCode.INVALID_TASK_ID,
            f"task id must match ^{TASK_ID_PATTERN.pattern}$",
        )


def _check_int(value: object) -> None:
    if not _is_int(value):
        raise _Invalid("must be an integer")


def _check_ts(value: object) -> None:
    if not _is_int(value) or not 0 <= value <= MAX_COUNT:  # type: ignore[operator]
        raise _Invalid(f"must be an integer from 0 to {MAX_COUNT} (milliseconds since the epoch)")


def _check_bool(value: object) -> None:
    if not isinstance(value, bool):
        raise _Invalid("must be a boolean")


def _check_str(value: object) -> None:
    if not isinstance(value, str):
        raise _Invalid("must be a string")


def _check_messages(value: object, first: int = 0, cline: bool = True) -> None:
    """Messages of the Cline dialect, or, for another dialect, maps (its own checks follow).

    ``first`` is the history index of ``value[0]`` (a delta's ``base``): errors
    name the absolute index, ``messages[312].role``.
    """
    if not isinstance(value, list):
        raise _Invalid("must be a list of messages")
    # One C call for the whole list is quickest, but holds the interpreter lock
    # throughout: a long list (checked in a worker thread) is checked message by message.
    whole = len(value) <= _WHOLE_JSON_CHECK
    json_problem = _json_problem(value) if whole else "?"
    for offset, message in enumerate(value):
        where = f"messages[{first + offset}]"
        if not isinstance(message, dict):
            raise _Invalid(f"{where} must be a map", where)
        if json_problem is not None:
            problem = _json_problem(message)
            if problem is not None:
                raise _Invalid(f"{where} {problem}", where)
        if not cline:
            continue
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise _Invalid(
                f"{where}.role must be 'user' or 'assistant' (the cline dialect; "
                "give 'dialect' for another)",
                where,
            )
        content = message.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise _Invalid(f"{where}.content must be a string or a list of blocks", where)
        for block_index, block in enumerate(content):
            if not isinstance(block, dict):
                raise _Invalid(f"{where}.content[{block_index}] must be a map", where)
    if json_problem is not None and whole:
        raise _Invalid(json_problem)  # the list as a whole (no one message alone)


_WHOLE_JSON_CHECK = 4096
"""Lists of at most this many messages are checked for a JSON form in one call."""


def _any_value(value: object) -> None:
    return None  # a value JSON has no form for (bytes): not this check's business


def _json_problem(value: object) -> str | None:
    """Why ``value`` has no JSON form a provider could be sent: a map key that is not a string.

    Every dialect's messages are JSON objects; the engine writes a call's
    arguments and a result as JSON. Checked at C speed by encoding it once.
    """
    try:
        json.dumps(value, default=_any_value, check_circular=False)
    except TypeError:
        return "has a map key that is not a string (messages are JSON objects)"
    except (ValueError, RecursionError):
        return "is nested too deep"
    return None


def _check_model(value: object) -> None:
    if not isinstance(value, dict):
        raise _Invalid("must be a map {id, context_window, provider?}")
    if not isinstance(value.get("id"), str):
        raise _Invalid(".id must be a string")
    window = value.get("context_window")
    if window is not None and (
        isinstance(window, bool)
        or not isinstance(window, int | float)
        or not math.isfinite(window)
        or not 0 <= window <= MAX_COUNT
    ):
        raise _Invalid(f".context_window must be a number from 0 to {MAX_COUNT} or nil")
    provider = value.get("provider")
    if provider is not None and not isinstance(provider, str):
        raise _Invalid(".provider must be a string or nil")


def _check_usage(value: object) -> None:
    if not isinstance(value, dict):
        raise _Invalid("must be a map {ts, tokens_in, tokens_out, cache_writes, cache_reads}")
    for field in USAGE_FIELDS:
        if field in value and value[field] is not None:
            token_count = value[field]
            if not _is_int(token_count) or not 0 <= token_count <= MAX_COUNT:
                raise _Invalid(f".{field} must be an integer from 0 to {MAX_COUNT}")
    if "ts" in value and value["ts"] is not None:
        try:
            _check_ts(value["ts"])
        except _Invalid as exc:
            raise _Invalid(f".ts {exc}") from None


def _check_optional_usage(value: object) -> None:
    if value is not None:
        _check_usage(value)


def _check_base(value: object) -> None:
    if not _is_int(value) or value < 0:  # type: ignore[operator]
        raise _Invalid("must be a non-negative integer (a prefix length)")


def _check_digest(value: object) -> None:
    if not isinstance(value, bytes) or len(value) != DIGEST_SIZE:
        raise _Invalid(f"must be {DIGEST_SIZE} bytes (the prefix digest)")


def _check_token(value: object) -> None:
    if not isinstance(value, bytes) or not 0 < len(value) <= 32:
        raise _Invalid("must be the token of a previous patch (1 to 32 bytes)")


def deleted_range_error(value: object) -> str | None:
    """Why ``value`` is not a deleted range (nil or ``[2, end]``); None when it is one.

    The one rule for the wire, the stored ``ctxwin.json`` and the engine.
    """
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2 or not all(_is_int(bound) for bound in value):
        return "must be nil or a pair of integers [start, end]"
    if value[0] != 2:
        return "must start at 2 (messages 0 and 1 are never removed)"
    if not 1 <= value[1] <= MAX_COUNT:
        return f"must end at 1 ([2, 1] is the empty range) to {MAX_COUNT}"
    return None


def _check_range(value: object) -> None:
    problem = deleted_range_error(value)
    if problem is not None:
        raise _Invalid(problem)


def _check_threshold(value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Invalid("must be a number or nil")
    if not 0 <= value <= 1:
        raise _Invalid("must be a fraction of the context window, from 0 to 1, or nil")


MAX_READ_TOOLS = 64
"""Read tools one task may name (``read_tools``) besides the daemon's table."""

MAX_READ_PATTERNS = 16
"""Of a task's read tools, those with a ``pattern`` (each compiled by RE2, at a cost)."""


def _check_read_tools(value: object) -> None:
    """A list of read-tool maps; what each must hold is checked where tools are built."""
    if not isinstance(value, list):
        raise _Invalid("must be a list of maps ({name, arg, when?, pattern?})")
    if len(value) > MAX_READ_TOOLS:
        raise _Invalid(f"holds {len(value)} tools; at most {MAX_READ_TOOLS}")
    for position, item in enumerate(value):
        if not isinstance(item, dict) or not all(isinstance(key, str) for key in item):
            raise _Invalid(
                f"read_tools[{position}] must be a map with string keys",
                placed=f"read_tools[{position}]",
            )
    patterns = sum(1 for item in value if item.get("pattern") is not None)
    if patterns > MAX_READ_PATTERNS:
        raise _Invalid(f"holds {patterns} tools with a pattern; at most {MAX_READ_PATTERNS}")


def _one_of(values: tuple[str, ...]) -> Callable[[object], None]:
    def check(value: object) -> None:
        if value not in values:
            raise _Invalid("must be one of " + ", ".join(values))

    return check


def _check_pricing(value: object) -> None:
    problem = pricing_error(value)
    if problem is not None:
        raise _Invalid(problem)


CHECKS: dict[str, Callable[[object], None]] = {
    "task": _check_task,
    "messages": _check_messages,
    "model": _check_model,
    "usage": _check_optional_usage,
    "previous_request": _check_optional_usage,
    "deleted_range": _check_range,
    "keep": _one_of(KEEP_VALUES),
    "ts": _check_ts,
    "threshold": _check_threshold,
    "use_auto_condense": _check_bool,
    "summaries": _check_bool,
    "text": _check_str,
    "ephemeral": _check_bool,
    "dialect": _one_of(DIALECTS),
    "read_tools": _check_read_tools,
    "append": _check_messages,
    "base": _check_base,
    "base_digest": _check_digest,
    "view": _one_of(VIEW_VALUES),
    "patch_base": _check_token,
    "patch_skip": _check_bool,
    "strategy": _one_of(STRATEGY_VALUES),
    "proactive": _check_bool,
    "estimate": _check_bool,
    "keep_task": _check_bool,
    "pricing": _check_pricing,
    "summary": _check_str,
}
