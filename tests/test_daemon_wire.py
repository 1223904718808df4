"""Every op of the wire table against the real ctxwind, over REQ and DEALER sockets."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from ctxwin import proto
from ctxwin.engine import DEFAULT_NOTICES
from tests._daemon import Connect, DaemonProcess, WirePeer, wait_until

TASK = "wire-task"
CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": [{"type": "text", "text": "Add a --verbose flag."}]},
    {"role": "assistant", "content": [{"type": "text", "text": "On it."}]},
]
for turn in range(6):
    CONVERSATION += [
        {"role": "user", "content": [{"type": "text", "text": f"step {turn}"}]},
        {"role": "assistant", "content": [{"type": "text", "text": f"done {turn}"}]},
    ]
MODEL = {"id": "claude-sonnet", "context_window": 200000}


@pytest.fixture
def shared_peer(shared_daemon: DaemonProcess, wire_peer: Connect) -> WirePeer:
    """A DEALER connected to the shared daemon."""
    return wire_peer(shared_daemon.endpoint)


@pytest.fixture
def quiet_daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A daemon whose debouncer never writes first, so flush counts are exact."""
    with DaemonProcess(tmp_path, "--debounce-ms", "600000", "--debounce-max-ms", "600000") as d:
        yield d


@pytest.fixture
def peer(daemon: DaemonProcess, wire_peer: Connect) -> WirePeer:
    """A DEALER connected to the test's own daemon."""
    return wire_peer(daemon.endpoint)


def ok(reply: proto.Reply) -> dict[str, Any]:
    """The result of a reply that must have succeeded."""
    assert reply.ok, (reply.code, reply.message)
    assert reply.result is not None
    return reply.result


def test_ping_answers_pong_with_versions(shared_peer: WirePeer) -> None:
    """ping answers pong, the versions and its extensions: no ``fleet`` with the file store."""
    peer = shared_peer
    assert ok(peer.call("ping")) == {
        "pong": True,
        "version": proto.__version__,
        "proto": proto.PROTOCOL_VERSION,
        "features": list(proto.FEATURES),
        "dialects": ["cline", "openai-chat", "anthropic", "openai-responses", "gemini"],
    }


def test_stats_counts_tasks_actors_and_requests(peer: WirePeer) -> None:
    """stats reports tasks, actors, requests, flushes, write failures, uptime and caches."""
    ok(peer.call("truncated_messages", {"task": TASK, "messages": CONVERSATION, "view": "patch"}))
    stats = ok(peer.call("stats"))
    assert {
        "tasks",
        "actors",
        "requests",
        "flushes",
        "write_failures",
        "uptime_s",
        "histories",
        "history_bytes",
        "calibrated_tasks",
        "calibration_median",
        "store",
        "cache",
        "clients",
    } == set(stats)
    assert (1, 1, 0) == (stats["tasks"], stats["actors"], stats["write_failures"])
    # Who holds what: this test's ipc connection, by its uid; no request in flight but stats.
    assert stats["clients"] == {
        f"uid:{os.getuid()}": {"tasks": 1, "requests": 0, "history_bytes": stats["history_bytes"]}
    }
    assert "file" == stats["store"]["kind"]
    assert (1, 0, None) == (
        stats["histories"],
        stats["calibrated_tasks"],
        stats["calibration_median"],
    )
    assert stats["history_bytes"] > 0
    assert stats["requests"] >= 2
    assert stats["uptime_s"] >= 0


def test_a_long_count_does_not_hold_up_other_requests(shared_daemon: DaemonProcess) -> None:
    """count_tokens runs off the event loop: a ping sent right behind a big count comes first."""
    peer = WirePeer(shared_daemon.endpoint)
    try:
        text = " ".join(f"word{index} {index * 7}, and more." for index in range(300_000))
        peer.send(1, "count_tokens", {"text": text})
        peer.send(2, "ping")  # same connection: read after the count
        first, second = peer.recv(60), peer.recv(60)
        assert (2, 1) == (first.id, second.id)
        assert ok(second)["tokens"] > 1_000_000
    finally:
        peer.close()


def test_task_free_ops_answer_from_the_engine(shared_peer: WirePeer) -> None:
    """context_window_info, should_compact, next_truncation_range and count_tokens answer."""
    peer = shared_peer
    assert ok(peer.call("context_window_info", {"model": MODEL})) == {
        "context_window": 200000,
        "max_allowed_size": 160000,
    }
    usage = {"ts": 1, "tokens_in": 155000}
    assert ok(peer.call("should_compact", {"usage": usage, "model": MODEL, "threshold": 0.75})) == {
        "compact": True,
        "total_tokens": 155000,
        "threshold_tokens": 150000,
    }
    assert ok(
        peer.call(
            "next_truncation_range",
            {"messages": CONVERSATION[:11], "deleted_range": None, "keep": "half"},
        )
    ) == {"deleted_range": [2, 5]}
    assert ok(peer.call("count_tokens", {"text": "hello world"})) == {"tokens": 2}
    counted = ok(peer.call("count_tokens", {"messages": CONVERSATION}))["tokens"]
    assert counted > 0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("messages", CONVERSATION),
        ("dialect", "anthropic"),
        ("read_tools", [{"name": "open_file", "arg": "filename"}]),
        ("ephemeral", True),
    ],
)
def test_should_compact_without_a_task_refuses_what_acts_on_a_task(
    shared_peer: WirePeer, name: str, value: object
) -> None:
    """An argument that would do nothing without a task is refused by name, not ignored;
    with a task the same request is answered."""
    usage = {"ts": 1, "tokens_in": 190000}
    args = {"usage": usage, "model": MODEL, name: value}
    reply = shared_peer.call("should_compact", args)
    assert (reply.ok, reply.code) == (False, "bad_request")
    assert (
        reply.message == f"should_compact: {name!r} needs 'task' (without a task it has no effect)"
    )
    task = {"task": f"compact-{name}", "ephemeral": True, "dialect": "anthropic"}
    assert ok(shared_peer.call("should_compact", {**args, **task}))["compact"] is True


def test_count_tokens_counts_blocks_by_the_documented_rules(shared_peer: WirePeer) -> None:
    """count_tokens counts text, tool_use input, tool_result content and a fixed cost per image."""
    peer = shared_peer
    image = {"type": "image", "source": {"type": "base64", "data": "AAAA" * 1000}}
    message = {"role": "user", "content": [image]}
    assert ok(peer.call("count_tokens", {"messages": [message]})) == {"tokens": 1600}
    tool = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t1", "name": "read_file", "input": {"p": "x"}}],
    }
    assert ok(peer.call("count_tokens", {"messages": [tool]}))["tokens"] > 2
    special = ok(peer.call("count_tokens", {"text": "<|endoftext|>"}))["tokens"]
    assert special > 1  # ordinary text, not the special token


def test_task_ops_change_and_show_the_overlay(
    quiet_daemon: DaemonProcess, wire_peer: Connect
) -> None:
    """Each task op answers with its documented fields and inspect shows the result."""
    peer, daemon = wire_peer(quiet_daemon.endpoint), quiet_daemon
    messages = CONVERSATION
    prepared = ok(
        peer.call(
            "prepare_request",
            {
                "task": TASK,
                "messages": messages,
                "model": MODEL,
                "previous_request": {"ts": 10, "tokens_in": 170000},
            },
        )
    )
    assert set(prepared) >= {"deleted_range", "range_updated", "messages"}
    assert prepared["range_updated"] is True
    assert prepared["deleted_range"][0] == 2
    view = ok(peer.call("truncated_messages", {"task": TASK, "messages": messages}))
    assert view["messages"] == prepared["messages"]
    assert set(
        ok(peer.call("optimize_file_reads", {"task": TASK, "messages": messages, "ts": 11}))
    ) == {
        "changed",
        "need_to_truncate",
        "percent_saved",
    }
    in_memory = ok(
        peer.call("optimize_file_reads_in_memory", {"task": TASK, "messages": messages, "ts": 12})
    )
    assert set(in_memory) == {"changed", "need_to_truncate", "messages"}
    subagent = ok(peer.call("compact_subagent", {"task": "wire-sub", "messages": messages}))
    assert set(subagent) == {"compacted", "deleted_range", "messages"}
    assert ok(
        peer.call("apply_truncation_notice", {"task": TASK, "ts": 13, "messages": messages})
    ) == {"changed": True}
    compacted = ok(
        peer.call("compact", {"task": TASK, "messages": messages, "keep": "none", "ts": 14})
    )
    assert compacted["deleted_range"] == [2, len(messages) - 1]
    assert ok(peer.call("condensed", {"task": TASK, "messages": messages})) == {
        "deleted_range": [2, len(messages) - 1]
    }
    decision = ok(
        peer.call(
            "should_compact",
            {"usage": {"tokens_in": 190000}, "model": MODEL, "task": TASK, "messages": messages},
        )
    )
    assert decision["compact"] is False  # nothing active after the range
    inspected = ok(peer.call("inspect", {"task": TASK}))
    assert inspected["deleted_range"] == [2, len(messages) - 1]
    assert inspected["dirty"] is True
    assert [entry[0] for entry in inspected["updates"]] == [1, 0]
    assert ok(peer.call("rollback", {"task": TASK, "ts": 12, "deleted_range": [2, 3]})) == {
        "removed": 1
    }
    inspected = ok(peer.call("inspect", {"task": TASK}))
    notice = [10, "text", [DEFAULT_NOTICES.truncation], []]
    assert inspected["updates"] == [[1, [0, [[0, [notice]]]]]]
    assert inspected["deleted_range"] == [2, 3]
    assert ok(peer.call("flush", {"task": TASK})) == {"flushed": 1, "loaded": True}
    assert ok(peer.call("inspect", {"task": TASK}))["dirty"] is False
    on_disk = json.loads((daemon.task_dir(TASK) / "context_history.json").read_text())
    assert on_disk == inspected["updates"]
    meta = json.loads((daemon.task_dir(TASK) / "ctxwin.json").read_text())
    assert meta == {
        "format": 2,
        "dialect": "cline",
        "deleted_range": [2, 3],
        "calibration": None,
        "updates": inspected["updates"],
    }
    assert ok(peer.call("flush")) == {"flushed": 1}  # wire-sub's new range
    assert ok(peer.call("close", {"task": TASK})) == {"closed": True, "loaded": True}
    assert ok(peer.call("stats"))["actors"] == 1  # wire-sub is still open


def test_a_given_deleted_range_replaces_the_stored_one_and_nil_clears_it(
    shared_peer: WirePeer,
) -> None:
    """A deleted_range argument replaces the stored range; an explicit nil clears it."""
    peer, task = shared_peer, "wire-range"
    ok(
        peer.call(
            "truncated_messages", {"task": task, "messages": CONVERSATION, "deleted_range": [2, 5]}
        )
    )
    assert ok(peer.call("inspect", {"task": task}))["deleted_range"] == [2, 5]
    view = ok(peer.call("truncated_messages", {"task": task, "messages": CONVERSATION}))
    assert len(view["messages"]) == len(CONVERSATION) - 4
    ok(
        peer.call(
            "truncated_messages", {"task": task, "messages": CONVERSATION, "deleted_range": None}
        )
    )
    assert ok(peer.call("inspect", {"task": task}))["deleted_range"] is None


def test_ephemeral_tasks_never_write(peer: WirePeer, daemon: DaemonProcess) -> None:
    """A task opened with ephemeral: true keeps its state in memory and never writes it."""
    ok(
        peer.call(
            "compact",
            {"task": "eph", "messages": CONVERSATION, "keep": "none", "ts": 1, "ephemeral": True},
        )
    )
    assert ok(peer.call("inspect", {"task": "eph"}))["dirty"] is False
    assert ok(peer.call("flush", {"task": "eph"})) == {"flushed": 0, "loaded": True}
    assert ok(peer.call("flush")) == {"flushed": 0}
    assert ok(peer.call("close", {"task": "eph"})) == {"closed": True, "loaded": True}
    assert not daemon.task_dir("eph").exists()
    assert ok(peer.call("inspect", {"task": "eph"}))["updates"] == []


def test_req_clients_get_replies_in_their_envelope(shared_daemon: DaemonProcess) -> None:
    """A plain REQ socket (empty delimiter frame) gets its reply."""
    daemon = shared_daemon
    req = WirePeer(daemon.endpoint, zmq.REQ)
    try:
        for request_id in (1, 2, 3):
            req.send(request_id, "ping")
            reply = req.recv()
            assert (reply.id, reply.ok) == (request_id, True)
    finally:
        req.close()


def test_pipelined_requests_are_answered_with_their_ids(shared_peer: WirePeer) -> None:
    """Pipelined requests from one DEALER get replies with their ids; one task's stay in order."""
    peer = shared_peer
    ids = list(range(100, 300))
    for request_id in ids:
        if request_id % 4:
            peer.send(request_id, "ping")
        else:
            peer.send(
                request_id,
                "truncated_messages",
                {
                    "task": "wire-pipelined",
                    "messages": CONVERSATION,
                    "deleted_range": [2, request_id % 9 + 2],
                },
            )
    replies = [peer.recv() for _ in ids]
    assert sorted(r.id for r in replies if r.id is not None) == ids
    assert all(r.ok for r in replies)
    task_ids = [r.id for r in replies if r.id is not None and r.id % 4 == 0]
    assert task_ids == sorted(task_ids)


def test_full_mailbox_answers_busy(tmp_path: Path) -> None:
    """With a one-request mailbox a burst to one task gets busy replies; every request a reply."""
    daemon = DaemonProcess(tmp_path, "--mailbox-size", "1")
    daemon.start()
    client = WirePeer(daemon.endpoint)
    try:
        big = [*CONVERSATION, *[{"role": "user", "content": "x" * 20000}] * 40]
        ids = list(range(1, 41))
        for request_id in ids:
            client.send(request_id, "truncated_messages", {"task": TASK, "messages": big})
        replies = [client.recv() for _ in ids]
        assert sorted(r.id for r in replies if r.id is not None) == ids
        codes = {r.code for r in replies if not r.ok}
        assert codes == {"busy"}
        assert any(r.ok for r in replies)
        assert ok(client.call("ping"))["pong"] is True
    finally:
        client.close()
        assert daemon.stop() == 0


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"\xc1", "bad_request"),
        (msgpack.packb([1, 2]), "bad_request"),
        (msgpack.packb({"v": 1, "id": "x", "op": "ping"}), "bad_request"),
        (msgpack.packb({"v": 9, "id": 5, "op": "ping", "args": {}}), "unsupported_version"),
        (msgpack.packb({"v": 1, "id": 5, "op": "nope", "args": {}}), "unknown_op"),
        (
            msgpack.packb({"v": 1, "id": 5, "op": "inspect", "args": {"task": "../x"}}),
            "invalid_task_id",
        ),
        (msgpack.packb({"v": 1, "id": 5, "op": "inspect", "args": {"task": 3}}), "invalid_task_id"),
        (
            msgpack.packb(
                {
                    "v": 1,
                    "id": 5,
                    "op": "compact",
                    "args": {"task": "t", "messages": [], "keep": "half", "ts": 1},
                }
            ),
            "bad_request",
        ),
    ],
)
def test_bad_requests_get_the_right_error_code(
    shared_peer: WirePeer, body: bytes, code: str
) -> None:
    """Malformed or invalid requests get an error reply with the matching code."""
    peer = shared_peer
    peer.send_frames([body])
    reply = peer.recv()
    assert (reply.ok, reply.code) == (False, code)
    if code == "bad_request" and b"compact" not in body:
        assert reply.id is None
    assert ok(peer.call("ping"))["pong"] is True


@pytest.mark.parametrize(
    "envelope",
    [
        {"v": 9, "id": 0, "op": "ping", "args": {}},
        {"v": 1, "id": 0, "op": "nope", "args": {}},
        {"v": 1, "id": 0, "op": "ping", "args": {}, "extra": 1},
        {"v": 1, "id": 0, "op": "inspect", "args": {"task": "../x"}},
    ],
    ids=["version", "op", "envelope-field", "task-id"],
)
def test_an_error_reply_echoes_request_id_zero(
    shared_peer: WirePeer, envelope: dict[str, object]
) -> None:
    """Id 0 is an id like any other: error replies carry it, not nil."""
    shared_peer.send_frames([msgpack.packb(envelope)])
    reply = shared_peer.recv()
    assert (reply.ok, reply.id) == (False, 0)


def test_wrong_frame_counts_are_refused(tmp_path: Path) -> None:
    """Extra frames get bad_request; more than the frame cap or bytes cap gets too_large."""
    daemon = DaemonProcess(tmp_path, "--max-bytes", "65536", "--max-frames", "4")
    daemon.start()
    client = WirePeer(daemon.endpoint)
    try:
        client.send_frames([b"a", b"b"])
        assert client.recv().code == "bad_request"
        client.send_frames([b"x"] * 10)
        assert client.recv().code == "too_large"
        client.send_frames([b"", b"x" * 40000, b"y" * 40000])
        assert client.recv().code == "too_large"
        assert ok(client.call("ping"))["pong"] is True
        # A refused body still names its request when its first bytes show the id.
        body = proto.encode_request(41, "count_tokens", {"text": "w" * 40_000})
        client.send_frames([b"x" * 30_000, body])
        refused = client.recv()
        assert (refused.code, refused.id) == ("too_large", 41)
        # A body of exactly the cap is not refused for the routing id the daemon adds.
        exact = proto.encode_request(42, "count_tokens", {"text": ""})
        padding = 65536 - len(exact)
        exact = proto.encode_request(42, "count_tokens", {"text": "w" * (padding - 2)})
        assert len(exact) == 65536
        client.send_frames([exact])
        answered = client.recv()
        assert (answered.ok, answered.id) == (True, 42)
        client.send_frames([b"z" * 70000])  # past MAXMSGSIZE: the peer is disconnected
        with pytest.raises(TimeoutError):
            client.recv(timeout=0.5)
        client.close()
        client = WirePeer(daemon.endpoint)
        assert ok(client.call("ping"))["pong"] is True
    finally:
        client.close()
        assert daemon.stop() == 0


def test_deeply_nested_input_is_counted_and_echoed(shared_peer: WirePeer) -> None:
    """Nesting as deep as msgpack allows is counted and echoed back without a crash."""
    peer = shared_peer
    deep: Any = "x"
    for _ in range(1010):
        deep = [deep]
    block = {"type": "tool_use", "id": "1", "name": "n", "input": deep}
    message = {"role": "assistant", "content": [block]}
    assert ok(peer.call("count_tokens", {"messages": [message]}))["tokens"] > 1000
    view = ok(peer.call("truncated_messages", {"task": TASK, "messages": [message]}))
    assert msgpack.packb(view["messages"]) == msgpack.packb([message])
    assert ok(peer.call("ping"))["pong"] is True


def test_idle_actors_stop_and_load_again(tmp_path: Path) -> None:
    """An idle actor flushes and stops after --idle-timeout; the next request loads its state."""
    daemon = DaemonProcess(
        tmp_path, "--idle-timeout", "0.3", "--debounce-ms", "5000", "--debounce-max-ms", "10000"
    )
    daemon.start()
    client = WirePeer(daemon.endpoint)
    try:
        ok(
            client.call(
                "compact", {"task": TASK, "messages": CONVERSATION, "keep": "none", "ts": 7}
            )
        )
        wait_until(lambda: ok(client.call("stats"))["actors"] == 0, 10, "the idle actor stops")
        history = json.loads((daemon.task_dir(TASK) / "context_history.json").read_text())
        inspected = ok(client.call("inspect", {"task": TASK}))
        assert inspected["updates"] == history
        assert inspected["deleted_range"] == [2, len(CONVERSATION) - 1]
        assert '"actor_stopped"' in daemon.log()
    finally:
        client.close()
        assert daemon.stop() == 0


def test_socket_and_directories_are_private(shared_daemon: DaemonProcess) -> None:
    """The ipc directory is 0700 and the socket 0600."""
    sock = Path(shared_daemon.endpoint[len("ipc://") :])
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600


def _second(daemon: DaemonProcess, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ctxwin.daemon", "--log-format", "json", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        env=daemon.env,
        check=False,
    )


def test_a_second_daemon_on_the_same_endpoint_or_state_dir_exits(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """A second ctxwind on the same endpoint or state dir exits non-zero and says why."""
    same_endpoint = _second(
        daemon, "--endpoint", daemon.endpoint, "--state-dir", str(tmp_path / "other")
    )
    assert same_endpoint.returncode == 1
    assert "another ctxwind is listening on" in same_endpoint.stderr
    same_state = _second(
        daemon,
        "--endpoint",
        f"ipc://{tmp_path / 'other-run' / 's.sock'}",
        "--state-dir",
        str(daemon.state_dir),
    )
    assert same_state.returncode == 1
    assert "another ctxwind is using the state dir" in same_state.stderr
    assert daemon.call("ping").ok


def test_a_stale_socket_file_is_replaced(tmp_path: Path) -> None:
    """A socket file left by a killed daemon does not stop the next one from starting."""
    daemon = DaemonProcess(tmp_path)
    daemon.start()
    daemon.kill()
    assert Path(daemon.endpoint[len("ipc://") :]).exists()
    daemon.start()
    assert daemon.call("ping").ok
    assert daemon.stop() == 0


def test_non_loopback_tcp_needs_allow_remote(tmp_path: Path) -> None:
    """A TCP endpoint on a non-loopback address is refused unless allowed."""
    wildcard = DaemonProcess(
        tmp_path, endpoint="tcp://0.0.0.0:0", env={"XDG_CONFIG_HOME": str(tmp_path)}
    )
    result = wildcard.run_to_exit()
    assert result.returncode == 2
    assert "allow_remote" in result.stderr


def test_requests_queued_behind_close_get_an_error_not_silence(shared_peer: WirePeer) -> None:
    """Requests pipelined behind close get busy replies; later ones start a fresh actor."""
    peer, task = shared_peer, "wire-close"
    args = {"task": task, "messages": CONVERSATION}
    ok(peer.call("truncated_messages", args))
    peer.send(1, "close", {"task": task})
    for request_id in range(2, 6):
        peer.send(request_id, "truncated_messages", args)
    replies = {reply.id: reply for reply in (peer.recv() for _ in range(5))}
    assert sorted(r for r in replies if r is not None) == [1, 2, 3, 4, 5]
    assert ok(replies[1]) == {"closed": True, "loaded": True}
    for request_id in range(2, 6):
        reply = replies[request_id]
        assert reply.ok or reply.code == "busy"
    assert ok(peer.call("truncated_messages", args))["messages"] == CONVERSATION


def test_open_files_limit_is_raised_to_the_hard_limit(shared_daemon: DaemonProcess) -> None:
    """At start the daemon raises its soft RLIMIT_NOFILE to the hard limit."""
    assert shared_daemon.proc is not None
    limits = Path(f"/proc/{shared_daemon.proc.pid}/limits").read_text().splitlines()
    line = next(line for line in limits if line.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    assert soft == hard


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory of another uid needs root")
def test_a_default_socket_dir_of_another_uid_is_refused(tmp_path: Path) -> None:
    """A pre-created default socket dir owned by another uid stops the start, saying why."""
    base = tmp_path / "tmp"
    base.mkdir()
    runtime = base / f"ctxwin-{os.getuid()}"
    runtime.mkdir(mode=0o777)
    os.chown(runtime, 65534, 65534)
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "CTXWIN_ENDPOINT")}
    env.update({"TMPDIR": str(base), "XDG_CONFIG_HOME": str(tmp_path), "HOME": str(tmp_path)})
    result = subprocess.run(
        [sys.executable, "-m", "ctxwin.daemon", "--state-dir", str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        check=False,
    )
    assert result.returncode == 1
    assert "belongs to uid 65534" in result.stderr
    assert os.listdir(runtime) == []


def test_idle_ephemeral_tasks_are_dropped(tmp_path: Path) -> None:
    """An ephemeral task's state is dropped when its actor goes idle, and nothing is written."""
    with DaemonProcess(tmp_path, "--idle-timeout", "0.2") as daemon:
        args = {"task": "sub", "messages": CONVERSATION, "keep": "none", "ts": 7, "ephemeral": True}
        ok(daemon.call("compact", args))
        wait_until(lambda: ok(daemon.call("stats"))["actors"] == 0, 10, "the idle actor stops")
        assert ok(daemon.call("inspect", {"task": "sub"}))["updates"] == []
        assert not daemon.task_dir("sub").exists()


def test_memory_is_released_after_a_sweep_stops_many_actors(tmp_path: Path) -> None:
    """Once 300 idle actors stop, the daemon releases memory and still counts every task."""
    daemon = DaemonProcess(tmp_path, "--idle-timeout", "0.5")
    daemon.start()
    client = WirePeer(daemon.endpoint)
    names = [f"sweep-{index}" for index in range(300)]
    try:
        for index, name in enumerate(names):
            args = {
                "task": name,
                "messages": CONVERSATION,
                "keep": "none",
                "ts": 7,
                "ephemeral": True,
            }
            client.send(index, "compact", args)
        for _ in names:
            ok(client.recv())
        wait_until(lambda: ok(client.call("stats"))["actors"] == 0, 30, "the idle actors stop")

        def released() -> list[dict[str, Any]]:
            lines = [line for line in daemon.log().splitlines() if '"memory_released"' in line]
            return [json.loads(line) for line in lines]

        wait_until(lambda: bool(released()), 30, "the daemon releases memory", interval=0.1)
        event = released()[0]
        assert event["stopped_actors"] >= 256
        assert 0 == event["actors"]
        if (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            assert event["trimmed"] is not None
        assert 300 == ok(client.call("stats"))["tasks"]
        assert [] == ok(client.call("inspect", {"task": names[-1]}))["updates"]
        assert 300 == ok(client.call("stats"))["tasks"]
    finally:
        client.close()
        assert daemon.stop() == 0


def test_messages_per_request_and_tasks_per_daemon_are_bounded(tmp_path: Path) -> None:
    """Past max_messages a request is too_large; past max_tasks a new task is busy, saying why.

    Tasks already held are served all the while, and once one is closed a
    new task is taken again.
    """
    with DaemonProcess(tmp_path, "--max-messages", "6", "--max-tasks", "3") as daemon:
        pair = CONVERSATION[:2]
        many = pair * 4  # 8 messages
        refused = daemon.call("truncated_messages", {"task": "m", "messages": many})
        assert (refused.ok, refused.code) == (False, "too_large")
        assert "8 messages in one request; at most 6 (max_messages)" in (refused.message or "")
        counted = daemon.call("count_tokens", {"messages": many})
        assert counted.code == "too_large"
        ok(daemon.call("truncated_messages", {"task": "m", "messages": pair * 3}))
        for task in ("t2", "t3"):
            ok(daemon.call("truncated_messages", {"task": task, "messages": pair}))
        busy = daemon.call("truncated_messages", {"task": "t4", "messages": pair})
        assert (busy.ok, busy.code) == (False, "busy")
        assert "holds 3 tasks, its limit (max_tasks)" in (busy.message or "")
        ok(daemon.call("truncated_messages", {"task": "t2", "messages": pair}))  # held: served
        assert ok(daemon.call("stats"))["actors"] == 3
        ok(daemon.call("close", {"task": "t3"}))
        wait_until(
            lambda: daemon.call("truncated_messages", {"task": "t4", "messages": pair}).ok,
            10,
            "a new task is taken once one is closed",
        )


def test_large_requests_are_decoded_in_slices_with_the_same_outcome(tmp_path: Path) -> None:
    """Bodies past 1 MiB: the same result, too many messages refused, a bad one's exact error."""
    from ctxwin.daemon._decode import SLICED_DECODE_BYTES

    text = "x" * 200
    messages = [
        {"role": "user" if index % 2 == 0 else "assistant", "content": text}
        for index in range(8000)
    ]
    assert len(proto.pack(messages)) > SLICED_DECODE_BYTES
    with DaemonProcess(tmp_path, "--max-messages", "10000") as daemon:
        args = {"task": "big", "messages": messages, "deleted_range": [2, 7001]}
        view = ok(daemon.call("truncated_messages", args))["messages"]
        assert view == messages[:2] + messages[7002:]
        refused = daemon.call("truncated_messages", {"task": "big", "messages": messages * 2})
        assert (refused.ok, refused.code) == (False, "too_large")
        assert "16000 messages in one request; at most 10000" in (refused.message or "")
        bad = daemon.call("truncated_messages", {"task": "big", "messages": messages, "x": 1})
        assert (bad.ok, bad.code) == (False, "bad_request")
        assert "unknown argument(s) ['x']" in (bad.message or "")
        body = msgpack.packb({"v": 1, "id": 9, "op": "ping", "args": {1: messages}})
        with WirePeer(daemon.endpoint) as raw:
            raw.send_frames([body])
            reply = raw.recv()
        assert (reply.ok, reply.code) == (False, "bad_request")  # an int key: not valid msgpack
        assert ok(daemon.call("inspect", {"task": "big"}))["deleted_range"] == [2, 7001]
