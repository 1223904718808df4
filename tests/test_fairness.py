"""One client's costly request never holds up another client's ping (issue 33, "Medium").

Each test starts a real daemon, sends the costly request from one client and
pings from another all the while, and checks the longest ping. The bound is
one second, generous against the 250 ms aimed at (bench/fairness.py measures
it) so that a loaded machine does not fail it; without the guards these
stalls lasted from seconds to minutes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ctxwin import proto
from ctxwin.daemon._decode import SLICED_DECODE_BYTES, TooManyMessages, decode_in_slices
from tests._daemon import DaemonProcess, WirePeer
from tests._pinger import hostile_tools, pinging


def test_costly_read_tool_patterns_do_not_stall_other_clients(tmp_path: Path) -> None:
    """16 tasks at once, each naming 16 hostile patterns: each refused as too large by name.

    Another client's pings stay quick all the while (they waited 1-2 s per
    pattern, one after another, when RE2 compiled them under 8 MiB).
    """
    with DaemonProcess(tmp_path) as daemon, WirePeer(daemon.endpoint, timeout=300) as sender:
        with pinging(daemon.endpoint) as pinger:
            for number in range(16):
                tools = hostile_tools(f"t{number}-")
                args = {"task": f"flood-{number}", "dialect": "anthropic", "read_tools": tools}
                sender.send(number + 1, "inspect", args)
            replies = [sender.recv() for _ in range(16)]
        for reply in replies:
            assert (reply.ok, reply.code) == (False, "bad_request")
            assert "read_tools[0]: a read tool's pattern is too large" in (reply.message or "")
        assert pinger.worst < 1.0, f"another client's ping waited {pinger.worst:.2f}s"


def test_more_patterns_than_allowed_are_refused_before_any_is_compiled(
    tmp_path: Path,
) -> None:
    """17 tools with a pattern: bad_request naming the cap (64 tools without one are fine)."""
    with DaemonProcess(tmp_path) as daemon, WirePeer(daemon.endpoint, timeout=60) as sender:
        tools = hostile_tools("cap", proto.MAX_READ_PATTERNS + 1)
        reply = sender.call("inspect", {"task": "cap", "dialect": "anthropic", "read_tools": tools})
        assert (reply.ok, reply.code) == (False, "bad_request")
        assert "holds 17 tools with a pattern; at most 16" in (reply.message or "")
        assert '"read_tool_patterns_compiled"' not in daemon.log()
        plain = [{"name": f"read{n}", "arg": "path"} for n in range(64)]
        args = {"task": "cap", "dialect": "anthropic", "read_tools": plain}
        assert sender.call("inspect", args).ok


def test_read_tool_patterns_are_compiled_once_per_text(tmp_path: Path) -> None:
    """The same 16 costly-but-allowed patterns sent by many tasks are compiled once each."""
    tools = [
        {"name": f"sh{n}", "arg": "command", "pattern": rf"(?P<path>\S{{1,{100 + n}}})"}
        for n in range(16)
    ]
    with DaemonProcess(tmp_path) as daemon, WirePeer(daemon.endpoint, timeout=60) as sender:
        for number in range(8):
            args = {"task": f"same-{number}", "dialect": "anthropic", "read_tools": tools}
            assert sender.call("inspect", args).ok
        compiled = [
            json.loads(line)
            for line in daemon.log().splitlines()
            if '"read_tool_patterns_compiled"' in line
        ]
        assert sum(event["compiled"] for event in compiled) == 16
        assert sum(event["cached"] for event in compiled) == 16 * 7


def test_stored_costly_patterns_do_not_stall_the_restart(tmp_path: Path) -> None:
    """Hostile patterns written into a stored task: loading it keeps others' pings quick."""
    with DaemonProcess(tmp_path) as daemon, WirePeer(daemon.endpoint) as peer:
        ok = peer.call("inspect", {"task": "kept", "dialect": "anthropic", "read_tools": []})
        assert ok.ok
        reads = [{"name": "Bash", "arg": "command", "pattern": "shell"}]
        assert peer.call("inspect", {"task": "kept", "read_tools": reads}).ok
        assert peer.call("flush", {"task": "kept"}).ok
    meta_path = daemon.task_dir("kept") / "ctxwin.json"
    meta = json.loads(meta_path.read_text())
    meta["read_tools"] = hostile_tools("s")
    meta_path.write_text(json.dumps(meta))
    with DaemonProcess(tmp_path) as daemon, WirePeer(daemon.endpoint, timeout=120) as peer:
        with pinging(daemon.endpoint) as pinger:
            seen = peer.call("inspect", {"task": "kept"})
        assert seen.ok
        assert seen.result is not None
        unused = seen.result["read_tools_unused"]
        assert [position for position, _ in unused] == list(range(proto.MAX_READ_PATTERNS))
        assert all("too large" in reason for _, reason in unused)
        assert pinger.worst < 1.0, f"another client's ping waited {pinger.worst:.2f}s"


def _empty_arrays(size: int) -> bytes:
    """About ``size`` bytes of msgpack: an array of arrays of 65,535 empty arrays each."""
    inner = b"\xdc\xff\xff" + b"\x90" * 0xFFFF  # array 16 of 65,535 empty arrays
    count = size // len(inner)
    return b"\xdd" + count.to_bytes(4, "big") + inner * count


def _request_with(prefix: dict[str, Any], key: str, raw_value: bytes) -> bytes:
    """A prepare_request body whose args hold ``prefix``, then ``key`` set to ``raw_value``."""
    head = proto.pack({"v": proto.PROTOCOL_VERSION, "id": 7, "op": "prepare_request"})
    args = proto.pack(prefix)
    assert head[0] == 0x83  # fixmap of 3: one more field, args, follows
    assert 0x80 <= args[0] < 0x8F  # fixmap: one more key follows
    return (
        bytes([0x84])
        + head[1:]
        + proto.pack("args")
        + bytes([args[0] + 1])
        + args[1:]
        + proto.pack(key)
        + raw_value
    )


def _peak_rss_mib(daemon: DaemonProcess) -> float:
    """The daemon's peak resident size so far (VmHWM), in MiB."""
    assert daemon.proc is not None
    status = Path(f"/proc/{daemon.proc.pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def test_a_decode_bomb_under_any_argument_stays_small_and_quick(tmp_path: Path) -> None:
    """60 MiB of empty arrays under model, or in a message: too_large, no balloon, quick pings.

    Decoded whole, such a body took the daemon from 84 MiB to 4.8 GiB
    resident and every client waited 17-21 s.
    """
    bomb = _empty_arrays(60 << 20)
    model = _request_with({"task": "bomb-a"}, "model", bomb)
    message = b"\x91\x82" + proto.pack("role") + proto.pack("user") + proto.pack("content")
    in_message = _request_with({"task": "bomb-b"}, "messages", message + bomb)
    with DaemonProcess(tmp_path) as daemon, WirePeer(daemon.endpoint, timeout=120) as sender:
        for body, where in ((model, "argument 'model'"), (in_message, "messages[0]")):
            with pinging(daemon.endpoint) as pinger:
                sender.send_frames([body])
                reply = sender.recv()
            assert (reply.id, reply.ok, reply.code) == (7, False, "too_large")
            assert f"{where} holds more than" in (reply.message or "")
            assert pinger.worst < 1.0, f"another client's ping waited {pinger.worst:.2f}s"
        # The frames themselves (64 MiB in ZeroMQ, then in Python) are most of it.
        assert _peak_rss_mib(daemon) < 600
        unknown = _request_with({"task": "bomb-c"}, "colour", bomb)
        sender.send_frames([unknown])
        refused = sender.recv()
        assert (refused.code, refused.message) == (
            "bad_request",
            "prepare_request: unknown argument(s) ['colour']",
        )


def _forbid(request_id: int, op: str, task: object) -> None:
    """A bound client's check that refuses every task but ``mine-*``."""
    if not (isinstance(task, str) and task.startswith("mine-")):
        raise proto.ProtocolError(proto.ErrorCode.FORBIDDEN, f"not {task!r}", request_id)


@pytest.mark.anyio
async def test_the_envelope_and_binding_are_checked_before_the_arguments_are_read() -> None:
    """A forbidden task, an unknown op or argument: refused with the body after them unread.

    What follows is not even msgpack: read first, it would have been a bad_request.
    """
    limits = proto.Limits()
    garbage = b"\xc1" * 200_000  # 0xc1 is never used in msgpack
    forbidden = _request_with({"task": "theirs-1"}, "messages", garbage)
    with pytest.raises(proto.ProtocolError) as caught:
        await decode_in_slices(forbidden, limits, 100_000, _forbid)
    assert (caught.value.code, caught.value.request_id) == (proto.ErrorCode.FORBIDDEN, 7)
    allowed = _request_with({"task": "mine-1"}, "messages", garbage)
    with pytest.raises(proto.ProtocolError) as caught:
        await decode_in_slices(allowed, limits, 100_000, _forbid)
    assert caught.value.code == proto.ErrorCode.BAD_REQUEST
    unknown = _request_with({"task": "mine-1"}, "colour", garbage)
    with pytest.raises(proto.ProtocolError, match=r"unknown argument\(s\) \['colour'\]"):
        await decode_in_slices(unknown, limits, 100_000, _forbid)
    unknown_op = proto.pack({"v": proto.PROTOCOL_VERSION, "id": 4, "op": "nope"})
    with pytest.raises(proto.ProtocolError, match="unknown op 'nope'"):
        await decode_in_slices(
            bytes([0x84]) + unknown_op[1:] + proto.pack("args") + garbage, limits, 100_000
        )
    bad_op = b"\x84" + proto.pack("v") + proto.pack(proto.PROTOCOL_VERSION)
    bad_op += proto.pack("id") + proto.pack(3) + proto.pack("op") + proto.pack(5)
    with pytest.raises(proto.ProtocolError, match="'op' must be a string"):
        await decode_in_slices(bad_op + proto.pack("args") + garbage, limits, 100_000)


@pytest.mark.anyio
async def test_requests_decoded_in_slices_equal_those_decoded_whole() -> None:
    """A large request of every kind of value comes out as msgpack decodes it whole."""
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "x" * 100}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "input": {"n": [1.5]}}]},
    ] * 6000
    args = {"task": "t", "messages": messages, "ts": 3, "keep": "none", "read_tools": None}
    body = proto.encode_request(9, "compact", args)
    assert len(body) > SLICED_DECODE_BYTES
    decoded = await decode_in_slices(body, proto.Limits(), 100_000)
    assert decoded == (9, "compact", args)
    with pytest.raises(TooManyMessages):
        await decode_in_slices(body, proto.Limits(), 11_999)
    dense = [{"role": "user", "content": [0] * 300}] * 4000  # 304 values each
    body = proto.encode_request(9, "compact", {**args, "messages": dense})
    with pytest.raises(proto.ProtocolError, match="the request holds more than 1176576 values"):
        await decode_in_slices(body, proto.Limits(), 4000)  # 1,048,576 + 32 x 4,000


def test_checking_a_long_history_does_not_stall_other_clients(tmp_path: Path) -> None:
    """400,000 messages refused by the task's dialect: checking them keeps others' pings quick.

    The actor refuses the request before any engine work, so what is timed
    is the decode and the check of every message, which held the loop for
    one to two seconds before the check went to a worker thread.
    """
    messages = [{"role": "user", "content": "ok"}] * 400_000
    with (
        DaemonProcess(tmp_path, "--max-messages", "400000") as daemon,
        WirePeer(daemon.endpoint, timeout=120) as sender,
    ):
        assert sender.call("inspect", {"task": "long", "dialect": "anthropic"}).ok
        assert sender.call("flush", {"task": "long"}).ok
        args = {"task": "long", "messages": messages, "dialect": "cline"}
        body = proto.encode_request(5, "truncated_messages", args)
        with pinging(daemon.endpoint) as pinger:
            sender.send_frames([body])
            reply = sender.recv()
        assert (reply.ok, reply.code) == (False, "bad_request")
        assert "has dialect 'anthropic', not 'cline'" in (reply.message or "")
        assert pinger.worst < 1.0, f"another client's ping waited {pinger.worst:.2f}s"


def test_a_burst_of_megabyte_bombs_does_not_stall_other_clients(tmp_path: Path) -> None:
    """64 requests of 1 MiB of empty arrays under model, sent at once: each too_large, quick pings.

    Decoded whole, each took about a second (a million lists) and all 64 in
    one wake-up of the socket: a ping waited 33 s; decoded within limits but
    in one wake-up, 2.7 s.
    """
    bomb = _empty_arrays((1 << 20) - 4096)
    body = _request_with({"task": "burst"}, "model", bomb)
    assert 64 * 1024 < len(body) <= 1 << 20  # decoded in order, not in slices
    with DaemonProcess(tmp_path) as daemon, WirePeer(daemon.endpoint, timeout=300) as sender:
        with pinging(daemon.endpoint) as pinger:
            for _ in range(64):
                sender.send_frames([body])
            replies = [sender.recv() for _ in range(64)]
        assert {(reply.code, reply.id) for reply in replies} == {("too_large", 7)}
        assert pinger.worst < 1.0, f"another client's ping waited {pinger.worst:.2f}s"
