"""Decoding a large request in slices, so that other clients are answered meanwhile.

msgpack decodes a body in one C call that holds the interpreter lock (a
worker thread would not let the event loop run either): two million small
messages took the loop for tens of seconds. A body past
:data:`SLICED_DECODE_BYTES` is decoded here instead, message by message,
handing the loop back every :data:`SLICE_S` seconds. The message count is
read first, so a request of more than ``max_messages`` is refused before
any of its messages is decoded.

Anything that is not a well-formed map with string keys in the expected
places is decoded again in one piece by :func:`ctxwin.proto.decode_request`,
which gives the exact error: what this module accepts, that function
accepts the same way.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import msgpack

from ctxwin import proto

__all__ = ["SLICED_DECODE_BYTES", "SLICE_S", "decode_in_slices"]

SLICED_DECODE_BYTES = int(os.environ.get("CTXWIN_BENCH_SLICED_DECODE_BYTES", 1 << 20))
"""Bodies larger than this are decoded in slices (smaller ones take well under 10 ms).

The variable is for bench/fairness.py alone, which sets it past any body to
measure the daemon decoding in one piece."""

SLICE_S = 0.005
"""Longest stretch of decoding between two hand-backs to the event loop."""

_LISTS = ("messages", "append")


class _Irregular(Exception):
    """Not the shape decoded in slices: decode in one piece for the exact outcome."""


class TooManyMessages(Exception):
    """The request holds more messages than allowed; ``count`` says how many."""

    def __init__(self, field: str, count: int) -> None:
        super().__init__(field, count)
        self.field = field
        self.count = count


def _key(unpacker: msgpack.Unpacker) -> str:
    key = unpacker.unpack()
    if not isinstance(key, str):
        raise _Irregular
    return key


async def _list(unpacker: msgpack.Unpacker, field: str, max_messages: int) -> list[Any]:
    count = unpacker.read_array_header()
    if count > max_messages:
        raise TooManyMessages(field, count)
    items: list[Any] = []
    clock = time.monotonic
    deadline = clock() + SLICE_S
    for _ in range(count):
        items.append(unpacker.unpack())
        if clock() >= deadline:
            await asyncio.sleep(0)  # let the loop answer others
            deadline = clock() + SLICE_S
    return items


async def _args(unpacker: msgpack.Unpacker, max_messages: int) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for _ in range(unpacker.read_map_header()):
        key = _key(unpacker)
        if key in _LISTS:
            args[key] = await _list(unpacker, key, max_messages)
        else:
            args[key] = unpacker.unpack()
    return args


async def decode_in_slices(
    body: bytes, limits: proto.Limits, max_messages: int
) -> tuple[int, str, dict[str, Any]]:
    """``(id, op, args)`` of a request, decoded message by message.

    Raises:
        TooManyMessages: ``messages`` or ``append`` holds more than
            ``max_messages`` (read from the list's header, nothing decoded).
        ProtocolError: as :func:`ctxwin.proto.decode_request`.
    """
    try:
        if len(body) > limits.max_frame_bytes:
            raise _Irregular
        unpacker = msgpack.Unpacker(
            raw=False, strict_map_key=True, max_buffer_size=max(len(body), 1)
        )
        unpacker.feed(body)
        value: dict[str, Any] = {}
        for _ in range(unpacker.read_map_header()):
            key = _key(unpacker)
            if key == "args":
                value[key] = await _args(unpacker, max_messages)
            else:
                value[key] = unpacker.unpack()
        try:
            unpacker.unpack()
        except msgpack.OutOfData:
            pass
        else:
            raise _Irregular  # extra data after the body
    except TooManyMessages:
        raise
    except Exception:  # _Irregular, or whatever msgpack refuses: the exact error below
        request = proto.decode_request(body, limits)
    else:
        request = proto.request_from_value(value)
    return request.id, request.op, request.args
