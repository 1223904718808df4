"""A task's stored record: what every store keeps, and its bytes.

:class:`TaskRecord` is the whole stored state of a task (the engine's
overlay, range, summaries and basis, with the task's calibration, dialect,
read tools and price sheet); :func:`encode_task` makes the bytes of
``ctxwin.json`` (the authority, the form the Redis store keeps too) and of
``context_history.json`` (the export), :func:`decode_record` reads an
authority back. :func:`build_state`, :func:`extras_of` and :func:`record_of`
turn a record into the engine's state and the task's extras, and back.
The file layout is in ``_files.py``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from ctxwin import engine, proto

from ._base import TaskExtras

__all__ = [
    "FORMAT",
    "Encoded",
    "TaskRecord",
    "build_state",
    "decode_record",
    "encode_history",
    "encode_task",
    "extras_of",
    "record_of",
    "valid_range",
]

FORMAT = 2
"""Version of ``ctxwin.json`` (1: the deleted range alone, beside the history file)."""


@dataclass(frozen=True)
class TaskRecord:
    """A task's whole stored state, in the form every store keeps.

    Attributes:
        updates: the overlay in on-disk form (``dump_updates()``), or None for none.
        deleted_range: the deleted range, or None.
        calibration: ``(ratio, samples)`` of the task's calibration, or None when
            it has no sample.
        dialect: the task's message dialect, stored as given.
        read_tools: the task's own read tools in their wire form (``read_tools``).
        pricing: the task's price sheet in its wire form (docs/PRICING.md), or None.
        summaries: the task's summaries in their stored form, oldest first.
        basis: ``(length, digest)`` of the history prefix the range and the
            overlay were made on (``TaskState.basis``), or None.
        drops: the deleted set's steps in their stored form (``dump_drops()``),
            oldest first (``auto`` only; absent from older files).
    """

    updates: Any = None
    deleted_range: list[int] | None = None
    calibration: tuple[float, int] | None = None
    dialect: str = proto.DEFAULT_DIALECT
    read_tools: tuple[dict[str, Any], ...] = ()
    pricing: dict[str, Any] | None = None
    summaries: tuple[dict[str, Any], ...] = ()
    basis: tuple[int, bytes] | None = None
    drops: tuple[dict[str, Any], ...] = ()

    @property
    def empty(self) -> bool:
        """Whether the record holds nothing a new task would not."""
        return (
            self.updates is None
            and self.deleted_range is None
            and self.calibration is None
            and self.dialect == proto.DEFAULT_DIALECT
            and not self.read_tools
            and self.pricing is None
            and not self.summaries
            and not self.drops
        )


class Encoded(NamedTuple):
    """A record's bytes: the authority (``ctxwin.json``) and the export."""

    authority: bytes
    export: bytes


def encode_history(updates: object) -> bytes:
    """``context_history.json`` content for an overlay in on-disk form."""
    return json.dumps(updates).encode("utf-8")


def _calibration_map(calibration: tuple[float, int] | None) -> dict[str, Any] | None:
    if calibration is None:
        return None
    return {"ratio": calibration[0], "samples": calibration[1]}


def encode_task(record: TaskRecord, fence: int | None = None) -> Encoded:
    """The authority and export bytes of a record.

    The overlay is encoded once and spliced into the authority as its last
    member. ``fence`` (the Redis store's fencing token of the writer) is
    added to the authority when given.
    """
    export = encode_history(record.updates if record.updates is not None else [])
    head: dict[str, Any] = {
        "format": FORMAT,
        "dialect": record.dialect,
        "deleted_range": record.deleted_range,
        "calibration": _calibration_map(record.calibration),
    }
    if record.read_tools:
        head["read_tools"] = list(record.read_tools)
    if record.pricing is not None:
        head["pricing"] = record.pricing
    if record.summaries:
        head["summaries"] = list(record.summaries)
    if record.drops:
        head["dropped"] = list(record.drops)
    if record.basis is not None:
        head["basis"] = {"length": record.basis[0], "digest": record.basis[1].hex()}
    if fence is not None:
        head["fence"] = fence
    prefix = json.dumps(head).encode("utf-8")
    return Encoded(prefix[:-1] + b', "updates": ' + export + b"}", export)


def _valid_calibration(value: object) -> bool:
    if value is None:
        return True
    if not isinstance(value, dict) or set(value) != {"ratio", "samples"}:
        return False
    ratio, samples = value["ratio"], value["samples"]
    return (
        isinstance(ratio, int | float)
        and not isinstance(ratio, bool)
        and math.isfinite(ratio)
        and ratio > 0
        and isinstance(samples, int)
        and not isinstance(samples, bool)
        and samples >= 0
    )


def _basis_of(value: object) -> tuple[int, bytes] | None:
    """A stored basis; None for none.

    Raises:
        ValueError: a basis of another shape.
    """
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"length", "digest"}:
        raise ValueError("unexpected content")
    length, digest = value["length"], value["digest"]
    if not isinstance(length, int) or isinstance(length, bool) or length < 0:
        raise ValueError("unexpected content")
    if not isinstance(digest, str) or len(digest) != 2 * proto.DIGEST_SIZE:
        raise ValueError("unexpected content")
    return length, bytes.fromhex(digest)


def decode_record(value: object) -> tuple[TaskRecord, int | None]:
    """The record (and the fence, when stored) of a parsed format-2 authority.

    Raises:
        ValueError: not a format-2 authority (the message names no content).
    """
    if not isinstance(value, dict) or value.get("format") != FORMAT:
        raise ValueError("not a format 2 ctxwin.json")
    dialect = value.get("dialect", proto.DEFAULT_DIALECT)
    calibration = value.get("calibration")
    fence = value.get("fence")
    read_tools = value.get("read_tools", [])
    pricing = value.get("pricing")
    if pricing is not None:
        try:
            pricing = proto.sheet_from_wire(pricing).wire()
        except ValueError:
            raise ValueError("unexpected content") from None
    summaries = value.get("summaries", [])
    drops = value.get("dropped", [])
    if (
        not valid_range(value.get("deleted_range"))
        or not _valid_calibration(calibration)
        or not isinstance(dialect, str)
        or not dialect
        or "updates" not in value
        or not isinstance(read_tools, list)
        or not all(isinstance(tool, dict) for tool in read_tools)
        or not isinstance(summaries, list)
        or not all(isinstance(summary, dict) for summary in summaries)
        or not isinstance(drops, list)
        or not all(isinstance(drop, dict) for drop in drops)
        or not (fence is None or (isinstance(fence, int) and not isinstance(fence, bool)))
    ):
        raise ValueError("unexpected content")
    pair = None if calibration is None else (float(calibration["ratio"]), calibration["samples"])
    record = TaskRecord(
        value["updates"],
        value.get("deleted_range"),
        pair,
        dialect,
        tuple(read_tools),
        pricing,
        tuple(summaries),
        _basis_of(value.get("basis")),
        tuple(drops),
    )
    return record, fence


def valid_range(value: object) -> bool:
    """Whether ``value`` is a stored deleted range (None or a valid range)."""
    return proto.deleted_range_error(value) is None


def build_state(record: TaskRecord, notices: engine.Notices) -> engine.TaskState:
    """The engine state of a stored record.

    Raises:
        Exception: whatever the engine rejects the record's overlay with.
    """
    if (
        record.updates is None
        and record.deleted_range is None
        and not record.summaries
        and not record.drops
    ):
        state = engine.TaskState(notices, dialect=engine.get_dialect(record.dialect))
    else:
        state = engine.TaskState.load(
            record.updates,
            record.deleted_range,
            notices,
            dialect=engine.get_dialect(record.dialect),
            summaries=list(record.summaries),
            basis=record.basis,
            drops=list(record.drops),
        )
    if record.pricing is not None:
        state.load_pricing(proto.sheet_from_wire(record.pricing))
    return state


def extras_of(record: TaskRecord) -> TaskExtras:
    """The extras a stored record carries."""
    return TaskExtras(record.calibration, record.dialect, record.read_tools)


def record_of(state: engine.TaskState, extras: TaskExtras) -> TaskRecord:
    """The record that stores this state and these extras."""
    return TaskRecord(
        state.dump_updates(),
        state.deleted_range,
        extras.calibration,
        extras.dialect,
        extras.read_tools,
        None if state.pricing is None else state.pricing.wire(),
        tuple(state.dump_summaries()),
        state.basis,
        tuple(state.dump_drops()),
    )
