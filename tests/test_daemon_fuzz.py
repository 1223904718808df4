"""Bad input, generated: every message gets an error reply or a clean disconnect, never a crash."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxwin import proto
from tests._daemon import DaemonProcess, WirePeer
from tests._strategies import msgpack_values

CI = bool(os.environ.get("CI") or os.environ.get("CTXWIN_CI"))
MAX_BYTES = 65536
CODES = {code.value for code in proto.ErrorCode}
FIELDS = sorted({name for spec in proto.OPS.values() for name in spec.fields})
BAD_TASK_IDS = ["../x", "..", ".", "", "a/b", "/etc/passwd", "x" * 129, "-x", "a\x00b", "Ω", "a b"]

values = msgpack_values(text=12, items=4, leaves=16)
task_ids = st.sampled_from(BAD_TASK_IDS) | st.from_regex(
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,8}", fullmatch=True
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system"]), "content": values}
    ),
    max_size=4,
)
args = st.dictionaries(
    st.sampled_from(FIELDS) | st.text(max_size=6),
    values | task_ids | messages,
    max_size=6,
)


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


envelopes = st.fixed_dictionaries(
    {
        "v": st.sampled_from([1, 1, 1, 0, 2, "1", None, 1.0, True]),
        "id": st.integers(min_value=-(2**63), max_value=2**63 - 1) | values,
        "op": st.sampled_from(sorted(proto.OPS)) | st.text(max_size=12),
        "args": args | values,
    },
    optional={"extra": values},
)
deep_requests = st.integers(min_value=1, max_value=1010).map(
    lambda depth: proto.encode_request(
        7, "count_tokens", {"messages": [{"role": "user", "content": _nested(depth)}]}
    )
)
bodies = st.one_of(
    st.binary(max_size=64),
    envelopes.map(lambda envelope: msgpack.packb(envelope, use_bin_type=True)),
    values.map(lambda value: msgpack.packb(value, use_bin_type=True)),
    deep_requests,
    st.integers(min_value=1, max_value=1100).map(lambda depth: b"\x91" * depth + b"\xc0"),
    st.integers(min_value=MAX_BYTES // 2, max_value=MAX_BYTES).map(lambda n: b"\x00" * n),
)
# Frames past MAXMSGSIZE only alone: libzmq (the sender's, not the daemon's) can abort
# when a connection drops in the middle of a multipart message it is still sending.
oversize = st.integers(min_value=MAX_BYTES + 1, max_value=MAX_BYTES + 64).map(
    lambda n: [b"\x00" * n]
)
frame_lists = st.one_of(
    bodies.map(lambda body: [body]),
    bodies.map(lambda body: [b"", body]),
    st.lists(bodies, min_size=2, max_size=10),
    oversize,
)


@pytest.fixture(scope="module")
def fuzz_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """A daemon with a 64 KiB frame limit, so oversize frames are cheap to make."""
    process = DaemonProcess(
        tmp_path_factory.mktemp("fuzz"), "--max-bytes", str(MAX_BYTES), "--max-frames", "6"
    )
    process.start()
    try:
        yield process
    finally:
        assert process.stop() == 0
        root = process.root
        assert sorted(os.listdir(root)) == ["ctxwind.log", "run", "state"]
        assert sorted(os.listdir(root / "state")) == ["ctxwind.lock", "tasks"]
        for name in os.listdir(root / "state" / "tasks"):
            assert proto.is_valid_task_id(name), name


@settings(
    max_examples=1000 if CI else 200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(frames=frame_lists)
def test_any_input_gets_an_error_reply_or_a_disconnect(
    fuzz_daemon: DaemonProcess, frames: list[bytes]
) -> None:
    """Each message gets a well-formed reply (none past the frame limit); ping still works."""
    oversize = any(len(frame) > MAX_BYTES for frame in frames)
    with WirePeer(fuzz_daemon.endpoint) as peer:
        peer.send_frames(frames)
        if peer.sock.poll(0 if oversize else 5000):
            reply = peer.recv()
            assert reply.ok or reply.code in CODES
        else:
            assert oversize, "no reply to a message within the limits"
    assert fuzz_daemon.call("ping", timeout=5).ok


_MODEL = {"id": "claude-sonnet-4", "context_window": 200_000}
_PAIR = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
_BIG = 2**64 - 1


def _tool_use(arguments: Any) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "a", "name": "read_file", "input": arguments}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "x"}]},
    ]


@pytest.mark.parametrize(
    ("op", "args", "reason"),
    [
        (
            "count_tokens",
            {"dialect": "anthropic", "messages": _tool_use({b"path": "a"})},
            r"messages\[1\] has a map key that is not a string",
        ),
        (
            "optimize_file_reads",
            {"task": "f-bytes", "dialect": "anthropic", "messages": _tool_use({b"k": 1}), "ts": 1},
            "map key that is not a string",
        ),
        (
            "truncated_messages",
            {"task": "f-range", "messages": _PAIR, "deleted_range": [2, 0]},
            r"deleted_range must end at 1 \(\[2, 1\] is the empty range\)",
        ),
        (
            "truncated_messages",
            {"task": "f-range", "messages": _PAIR, "deleted_range": [2, -(2**63)]},
            "deleted_range must end at 1",
        ),
        (
            "rollback",
            {"task": "f-range", "ts": 1, "deleted_range": [2, _BIG]},
            "deleted_range must end at 1",
        ),
        (
            "should_compact",
            {"model": _MODEL, "usage": dict.fromkeys(proto.USAGE_FIELDS, _BIG)},
            r"usage \.tokens_in must be an integer from 0 to",
        ),
        (
            "context_window_info",
            {"model": {**_MODEL, "context_window": _BIG}},
            "context_window must be a number from 0 to",
        ),
    ],
)
def test_hostile_values_are_bad_requests_never_internal(
    fuzz_daemon: DaemonProcess, op: str, args: dict[str, Any], reason: str
) -> None:
    """Byte map keys, inverted or huge ranges, overflowing counts: bad_request saying why."""
    reply = fuzz_daemon.call(op, args)
    assert (reply.ok, reply.code) == (False, "bad_request"), reply
    assert re.search(reason, reply.message or ""), reply.message
    assert fuzz_daemon.call("ping", timeout=5).ok
    if "task" in args:
        shown = fuzz_daemon.call("inspect", {"task": args["task"]})
        assert shown.result is not None
        assert shown.result["deleted_range"] is None  # nothing was taken from the request


@pytest.mark.parametrize("dialect", ["openai-chat", "openai-responses"])
def test_arguments_nested_deeper_than_the_daemon_follows_stay_text(
    fuzz_daemon: DaemonProcess, dialect: str
) -> None:
    """A call's arguments JSON nested 30,000 deep is kept as its text: counted, not internal."""
    deep = "[" * 30_000 + "]" * 30_000
    call = {"name": "read_file", "arguments": deep}
    if dialect == "openai-chat":
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c", "type": "function", "function": call}],
            },
            {"role": "tool", "tool_call_id": "c", "content": "x"},
        ]
    else:
        messages = [
            {"type": "message", "role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c", **call},
            {"type": "function_call_output", "call_id": "c", "output": "x"},
        ]
    counted = fuzz_daemon.call("count_tokens", {"dialect": dialect, "messages": messages})
    assert counted.ok, counted
    args = {"task": f"f-deep-{dialect}", "dialect": dialect, "messages": messages, "ts": 1}
    assert fuzz_daemon.call("optimize_file_reads", args).ok
