"""Bad input, generated: every message gets an error reply or a clean disconnect, never a crash."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxwin import proto
from tests._daemon import DaemonProcess

CI = bool(os.environ.get("CI") or os.environ.get("CTXWIN_CI"))
MAX_BYTES = 65536
CODES = {code.value for code in proto.ErrorCode}
FIELDS = sorted({name for spec in proto.OPS.values() for name in spec.fields})
BAD_TASK_IDS = ["../x", "..", ".", "", "a/b", "/etc/passwd", "x" * 129, "-x", "a\x00b", "Ω", "a b"]

leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=12)
    | st.binary(max_size=12)
)
values = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=16,
)
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


def _socket(endpoint: str) -> zmq.Socket[bytes]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


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
    sock = _socket(fuzz_daemon.endpoint)
    try:
        sock.send_multipart(frames)
        if sock.poll(0 if oversize else 5000):
            reply = proto.decode_reply(sock.recv_multipart()[-1])
            assert reply.ok or reply.code in CODES
        else:
            assert oversize, "no reply to a message within the limits"
    finally:
        sock.close(linger=0)
    assert fuzz_daemon.call("ping", timeout=5).ok
