"""Decoding a large request in slices and within limits, so that others are answered meanwhile.

msgpack decodes a body in one C call that holds the interpreter lock (a
worker thread would not let the event loop run either): two million small
messages took the loop for tens of seconds, and 64 MiB of empty arrays under
any argument took the daemon from 84 MiB to 4.8 GiB resident before it
answered ``bad_request``. A body past :data:`SLICED_DECODE_BYTES` is decoded
here instead:

- the envelope first (``v``, ``id``, ``op``, then the arguments in the order
  sent): an unknown op or argument name is refused before its value is
  decoded, and once ``task`` is read the caller's check (a bound client's
  prefixes) runs before the arguments after it are (clients send ``task``
  first);
- ``messages`` and ``append`` message by message, handing the loop back every
  :data:`SLICE_S` seconds; their counts are read from the lists' headers, so
  a request of more than ``max_messages`` is refused before any message is
  decoded;
- every value within limits: no array or map past :data:`MAX_CONTAINER`
  items, no string past the body, and a budget of *values* (each array or
  map counts one plus its items: what Python objects cost, where a byte of
  msgpack can make a 56-byte list), :data:`ARG_VALUES` for an argument,
  :data:`MESSAGE_VALUES` for one message and :func:`request_values` for the
  whole request. Past a budget the request is ``too_large``, refused as
  soon as the budget is spent.

A body of at most :data:`SLICED_DECODE_BYTES` is decoded in one call (with
the same per-container caps): it holds at most that many values.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any, NoReturn

import msgpack

from ctxwin import proto

__all__ = [
    "ARG_VALUES",
    "MAX_CONTAINER",
    "MESSAGE_VALUES",
    "SLICED_DECODE_BYTES",
    "SLICE_S",
    "TooManyMessages",
    "decode_in_slices",
    "request_values",
]

SLICED_DECODE_BYTES = int(os.environ.get("CTXWIN_BENCH_SLICED_DECODE_BYTES", 64 * 1024))
"""Bodies larger than this are decoded here, in slices (smaller ones take well under 1 ms).

The variable is for bench/fairness.py alone, which sets it past any body to
measure the daemon decoding in one piece."""

SLICE_S = 0.005
"""Longest stretch of decoding between two hand-backs to the event loop."""

MAX_CONTAINER = 1 << 17
"""Most items in one array, or pairs in one map, anywhere in a request (131,072)."""

ARG_VALUES = 1 << 16
"""Most values (arrays and maps count one plus their items) in one argument other than
``messages`` and ``append``: 64 read tools take about 600."""

MESSAGE_VALUES = 1 << 18
"""Most values in one message (a tool input of 100,000 numbers takes 100,000)."""

_ENVELOPE_VALUES = 16
"""Most values in ``v``, ``id``, ``op`` or ``task`` (each a scalar)."""

_LISTS = ("messages", "append")
_MAX_ARGS = 64
_ENVELOPE = ("v", "id", "op", "args")
# First bytes of a msgpack str (fixstr, str 8/16/32) and of a map (fixmap, map 16/32).
_STR_TYPES = frozenset((*range(0xA0, 0xC0), 0xD9, 0xDA, 0xDB))
_MAP_TYPES = frozenset((*range(0x80, 0x90), 0xDE, 0xDF))
_NIL = 0xC0


def request_values(max_messages: int) -> int:
    """The budget of values of a whole request: 1,048,576 plus 32 per message allowed.

    At the default ``max_messages`` (100,000) that is 4.25 million values,
    a few hundred MB at most, where 64 MiB of empty arrays made 4.8 GB;
    a real history takes about 10 per message.
    """
    return (1 << 20) + 32 * max_messages


class TooManyMessages(Exception):
    """The request holds more messages than allowed; ``count`` says how many."""

    def __init__(self, field: str, count: int) -> None:
        super().__init__(field, count)
        self.field = field
        self.count = count


class _OverBudget(Exception):
    """A value holds more arrays and maps (with their items) than its budget."""


class _Values:
    """Counts the values msgpack builds, through its list and map hooks, against a budget."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = 0

    def list_hook(self, value: list[Any]) -> list[Any]:
        self.left -= 1 + len(value)
        if self.left < 0:
            raise _OverBudget
        return value

    def map_hook(self, value: dict[str, Any]) -> dict[str, Any]:
        self.left -= 1 + len(value)
        if self.left < 0:
            raise _OverBudget
        return value


Check = Callable[[int, str, object], None]
"""Called with ``(id, op, task)`` before any argument after ``task`` is decoded."""


class _Reader:
    """One request body, read value by value within its budgets."""

    def __init__(self, body: bytes, request_budget: int) -> None:
        self.body = body
        self.values = _Values()
        self.total_left = request_budget
        self.request_budget = request_budget
        self.unpacker = msgpack.Unpacker(
            raw=False,
            strict_map_key=True,
            max_buffer_size=max(len(body), 1),
            max_str_len=len(body),
            max_bin_len=len(body),
            max_ext_len=len(body),
            max_array_len=MAX_CONTAINER,
            max_map_len=MAX_CONTAINER,
            list_hook=self.values.list_hook,
            object_hook=self.values.map_hook,
        )
        self.unpacker.feed(body)
        self.request_id: int | None = None

    def next_byte(self) -> int | None:
        position = self.unpacker.tell()
        return self.body[position] if position < len(self.body) else None

    def fail(self, code: proto.ErrorCode, message: str) -> NoReturn:
        raise proto.ProtocolError(code, message, self.request_id)

    def value(self, budget: int, where: str) -> Any:
        """The next value, holding at most ``budget`` values (and what the request has left)."""
        left = min(budget, self.total_left)
        values = self.values
        values.left = left
        try:
            value = self.unpacker.unpack()
        except _OverBudget:
            if left == self.total_left:
                self.fail(
                    proto.ErrorCode.TOO_LARGE,
                    f"the request holds more than {self.request_budget} values (arrays and "
                    "maps count one plus their items); send less at once",
                )
            self.fail(
                proto.ErrorCode.TOO_LARGE,
                f"{where} holds more than {budget} values (arrays and maps count one "
                "plus their items)",
            )
        self.total_left -= left - values.left
        return value

    def key(self, where: str) -> str:
        """A map key: refused unless the next value is a string."""
        if self.next_byte() not in _STR_TYPES:
            self.fail(proto.ErrorCode.BAD_REQUEST, f"{where} keys must be strings")
        key = self.unpacker.unpack()
        assert isinstance(key, str)
        return key


async def _messages(
    reader: _Reader, field: str, max_messages: int, clock: Callable[[], float]
) -> list[Any]:
    unpacker = reader.unpacker
    try:
        count = unpacker.read_array_header()
    except msgpack.UnpackValueError:
        reader.fail(proto.ErrorCode.BAD_REQUEST, f"{field} must be a list of messages")
    if count > max_messages:
        raise TooManyMessages(field, count)
    items: list[Any] = []
    deadline = clock() + SLICE_S
    for index in range(count):
        items.append(reader.value(MESSAGE_VALUES, f"{field}[{index}]"))
        if clock() >= deadline:
            await asyncio.sleep(0)  # let the loop answer others
            deadline = clock() + SLICE_S
    return items


async def _args(
    reader: _Reader,
    envelope: dict[str, Any],
    max_messages: int,
    check: Check,
) -> dict[str, Any]:
    """The ``args`` map, the caller's check made as soon as ``task`` is read."""
    first = reader.next_byte()
    if first == _NIL:
        reader.unpacker.skip()
        return {}
    if first not in _MAP_TYPES:
        reader.fail(proto.ErrorCode.BAD_REQUEST, "request 'args' must be a map")
    count = reader.unpacker.read_map_header()
    if count > _MAX_ARGS:
        reader.fail(proto.ErrorCode.BAD_REQUEST, f"{count} arguments; at most {_MAX_ARGS}")
    op = envelope.get("op")
    # Known only when v, id and op came before args (as clients send them) and were right.
    spec = proto.OPS.get(op) if isinstance(op, str) and reader.request_id is not None else None
    checked = False
    args: dict[str, Any] = {}
    clock = time.monotonic
    for _ in range(count):
        key = reader.key("request 'args'")
        if spec is not None and key not in spec.fields:
            reader.fail(proto.ErrorCode.BAD_REQUEST, f"{op}: unknown argument(s) [{key!r}]")
        if key in _LISTS and reader.next_byte() != _NIL:
            args[key] = await _messages(reader, key, max_messages, clock)
        elif key == "task":
            args[key] = reader.value(_ENVELOPE_VALUES, "task")
        else:
            args[key] = reader.value(ARG_VALUES, f"argument {key!r}")
        if key == "task" and not checked and spec is not None:
            assert isinstance(op, str)
            assert reader.request_id is not None
            check(reader.request_id, op, args["task"])  # before what follows
            checked = True
    return args


def _envelope_value(reader: _Reader, key: str) -> Any:
    value = reader.value(_ENVELOPE_VALUES, f"request {key!r}")
    if key == "id" and type(value) is int:
        reader.request_id = value
    return value


async def decode_in_slices(
    body: bytes,
    limits: proto.Limits,
    max_messages: int,
    check: Check | None = None,
) -> tuple[int, str, dict[str, Any]]:
    """``(id, op, args)`` of a request, decoded within limits, message by message.

    Args:
        body: the request body.
        limits: the frame limits (a body past ``max_frame_bytes`` is ``too_large``).
        max_messages: most messages in ``messages`` and ``append`` each.
        check: called with ``(id, op, task)`` once the envelope and ``task``
            are read, before the arguments sent after ``task``; raises to refuse.

    Raises:
        TooManyMessages: ``messages`` or ``append`` holds more than
            ``max_messages`` (read from the list's header, nothing decoded).
        ProtocolError: as :func:`ctxwin.proto.decode_request`, and
            ``too_large`` past a budget of values.
    """
    if len(body) > limits.max_frame_bytes:
        raise proto.ProtocolError(
            proto.ErrorCode.TOO_LARGE,
            f"frame of {len(body)} bytes exceeds {limits.max_frame_bytes}",
        )
    reader = _Reader(body, request_values(max_messages))
    if reader.next_byte() not in _MAP_TYPES:
        reader.fail(proto.ErrorCode.BAD_REQUEST, "request body must be a map")
    envelope: dict[str, Any] = {}
    try:
        fields = reader.unpacker.read_map_header()
        if fields > len(_ENVELOPE):
            reader.fail(
                proto.ErrorCode.BAD_REQUEST,
                f"the request envelope has {fields} fields; it is {{v, id, op, args}}",
            )
        for _ in range(fields):
            key = reader.key("the request envelope's")
            if key not in _ENVELOPE:
                reader.fail(proto.ErrorCode.BAD_REQUEST, f"unknown envelope field(s): [{key!r}]")
            if key == "args":
                # What the envelope says so far is checked before the arguments are read.
                _checked(envelope)
                envelope["args"] = await _args(reader, envelope, max_messages, check or _none)
            else:
                envelope[key] = _envelope_value(reader, key)
        try:
            reader.unpacker.skip()
        except msgpack.OutOfData:
            pass
        else:
            reader.fail(proto.ErrorCode.BAD_REQUEST, "body is not valid msgpack: extra data")
    except (ValueError, msgpack.UnpackException, msgpack.OutOfData, RecursionError) as exc:
        reader.fail(proto.ErrorCode.BAD_REQUEST, f"body is not valid msgpack: {exc}")
    request = proto.request_from_value(envelope)
    if check is not None:
        check(request.id, request.op, request.args.get("task"))  # when no task was sent
    return request.id, request.op, request.args


def _checked(envelope: dict[str, Any]) -> None:
    """Refuse an envelope whose ``v``, ``id`` or ``op`` is wrong already (args not read)."""
    if {"v", "id", "op"} <= set(envelope):
        proto.request_from_value({**envelope, "args": {}})


def _none(request_id: int, op: str, task: object) -> None:
    return None
