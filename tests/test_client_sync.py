"""The blocking Client against the real daemon: every op, Task handles, errors, recovery."""

from __future__ import annotations

import math
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxwin import proto
from ctxwin.client import (
    BadRequestError,
    Call,
    Client,
    CtxwinError,
    InvalidTaskIdError,
    RequestTimeoutError,
    TooLargeError,
    UnknownOpError,
    UnsupportedVersionError,
    usage_from_anthropic,
)
from tests._client_data import MODEL, PONG, conversation, with_duplicate_reads
from tests._daemon import DaemonFactory, DaemonProcess, WirePeer


@pytest.fixture(scope="module")
def shared(daemon_factory: DaemonFactory) -> DaemonProcess:
    """The shared daemon, for the tests that do not disturb it."""
    return daemon_factory()


@pytest.fixture
def client(shared: DaemonProcess) -> Iterator[Client]:
    """A blocking client of the shared daemon."""
    with Client(shared.endpoint, timeout=10) as connected:
        yield connected


def test_ping_stats_and_window_info(client: Client) -> None:
    """ping, stats and context_window_info return their typed results."""
    assert PONG == client.ping()
    stats = client.stats()
    assert stats["requests"] >= 1
    assert {"context_window": 64000, "max_allowed_size": 37000} == client.context_window_info(MODEL)


def test_should_compact_and_next_truncation_range(client: Client) -> None:
    """should_compact compares usage with the threshold; next_truncation_range cuts half."""
    usage = usage_from_anthropic({"input_tokens": 30000, "output_tokens": 8000})
    result = client.should_compact(usage, MODEL)
    assert (True, 38000, 37000) == (
        result["compact"],
        result["total_tokens"],
        result["threshold_tokens"],
    )
    assert {"deleted_range": [2, 5]} == client.next_truncation_range(
        conversation(4)[:11], None, "half"
    )


def test_prepare_request_cuts_when_the_previous_request_was_too_big(client: Client) -> None:
    """A previous request over the limit advances the range and sends fewer messages."""
    messages = conversation(10)
    result = client.prepare_request(
        "sync-prepare",
        messages,
        MODEL,
        previous_request={"ts": 1, "tokens_in": 60000},
    )
    assert result["range_updated"] is True
    assert [2, 11] == result["deleted_range"]
    assert len(messages) - 10 == len(result["messages"])
    calm = client.prepare_request("sync-prepare", messages, MODEL)
    assert (False, [2, 11]) == (calm["range_updated"], calm["deleted_range"])


def test_truncated_messages_honours_unset_and_explicit_ranges(client: Client) -> None:
    """The stored range applies when none is given; an explicit nil clears it."""
    messages = conversation(6)
    client.compact("sync-view", messages, "quarter", ts=10)
    assert len(client.truncated_messages("sync-view", messages)["messages"]) < len(messages)
    cleared = client.truncated_messages("sync-view", messages, deleted_range=None)
    assert len(messages) == len(cleared["messages"])
    assert client.inspect("sync-view")["deleted_range"] is None


def test_file_read_optimisation_ops(client: Client) -> None:
    """Duplicate reads are replaced, in memory or persisted, and reported as such."""
    messages = with_duplicate_reads()
    in_memory = client.optimize_file_reads_in_memory("sync-mem", messages, ts=5)
    assert (True, False) == (in_memory["changed"], in_memory["need_to_truncate"])
    assert len(str(in_memory["messages"])) < len(str(messages))
    persisted = client.optimize_file_reads("sync-opt", messages, ts=5)
    assert persisted["changed"] is True
    assert persisted["percent_saved"] > 0.3
    assert client.inspect("sync-opt")["updates"]


def test_subagent_compaction_is_ephemeral(client: Client) -> None:
    """compact_subagent compacts an ephemeral task, which close then drops."""
    result = client.compact_subagent("sync-sub", conversation(10), ephemeral=True)
    assert result["compacted"] is True
    assert result["deleted_range"] is not None
    assert {"closed": True, "loaded": True} == client.close_task("sync-sub")


def test_notice_compact_condensed_rollback_flush_close(client: Client) -> None:
    """The overlay ops change the task as SPEC.md §5, §8, §9 say and persist on flush."""
    messages = conversation(10)
    task = "sync-overlay"
    assert {"changed": True} == client.apply_truncation_notice(task, messages, ts=100)
    compacted = client.compact(task, messages, "quarter", ts=200)
    assert [2, 15] == compacted["deleted_range"]
    assert {"deleted_range": [2, 17]} == client.condensed(task, messages)
    inspected = client.inspect(task)
    assert ([2, 17], 2) == (inspected["deleted_range"], len(inspected["updates"]))
    assert {"removed": 2} == client.rollback(task, 50, deleted_range=[2, 5])
    assert [2, 5] == client.inspect(task)["deleted_range"]
    assert client.flush(task)["flushed"] >= 0
    assert client.flush()["flushed"] >= 0
    assert {"closed": True, "loaded": True} == client.close_task(task)


def test_count_tokens_of_messages_and_text(client: Client) -> None:
    """count_tokens counts a text or a conversation."""
    assert {"tokens": 2} == client.count_tokens(text="hello world")
    assert client.count_tokens(conversation(2))["tokens"] > 10


def test_task_handle_binds_the_task_id(client: Client) -> None:
    """Every Task method is the op for its task id."""
    task = client.task("sync-handle")
    messages = conversation(10)
    assert task.prepare_request(messages, MODEL)["range_updated"] is False
    assert task.should_compact({"tokens_in": 1}, MODEL, messages=messages)["compact"] is False
    assert len(messages) == len(task.truncated_messages(messages)["messages"])
    assert task.optimize_file_reads(messages, ts=1)["changed"] is False
    assert task.optimize_file_reads_in_memory(messages, ts=1)["changed"] is False
    assert task.compact_subagent(messages)["compacted"] is True
    assert task.apply_truncation_notice(messages, ts=2)["changed"] is True
    assert task.compact(messages, ts=3)["deleted_range"] is not None
    assert task.condensed(messages)["deleted_range"] is not None
    assert task.rollback(1)["removed"] >= 1
    assert task.inspect()["updates"] == []
    assert task.flush()["flushed"] >= 0
    assert {"closed": True, "loaded": True} == task.close()


def test_daemon_errors_map_to_their_classes(client: Client) -> None:
    """Errors the daemon answers with come back as their CtxwinError subclasses."""
    with pytest.raises(UnknownOpError) as unknown:
        client.call(Call("no_such_op", {}))
    assert (False, "unknown_op") == (unknown.value.local, unknown.value.code)
    with pytest.raises(InvalidTaskIdError):
        client.call(Call("inspect", {"task": "../escape"}))
    with pytest.raises(BadRequestError) as bad:
        client.call(Call("compact", {"task": "t", "messages": [], "keep": "half", "ts": 1}))
    assert bad.value.local is False
    with pytest.raises(InvalidTaskIdError) as local:
        client.inspect("../escape")
    assert local.value.local is True


def test_unsupported_version_reply_maps_to_its_class(shared: DaemonProcess) -> None:
    """The daemon's reply to a version-2 request maps to UnsupportedVersionError."""
    with WirePeer(shared.endpoint) as peer:
        peer.send_frames([proto.pack({"v": 2, "id": 5, "op": "ping", "args": {}})])
        reply = peer.recv()
    from ctxwin.client._errors import error_for

    error = error_for(reply.code, reply.message)
    assert isinstance(error, UnsupportedVersionError)
    assert 5 == reply.id


def test_oversize_request_is_dropped_and_the_client_recovers(tmp_path: Path) -> None:
    """A daemon with a small request limit drops an oversize request; the client then recovers."""
    with (
        DaemonProcess(tmp_path, "--max-bytes", "4096") as small,
        Client(small.endpoint, timeout=10) as client,
    ):
        with pytest.raises((TooLargeError, RequestTimeoutError)):
            client.count_tokens(text="x" * 10_000, timeout=1)
        assert client.ping()["pong"] is True


def test_timeout_while_the_daemon_is_stopped_then_recovery(daemon: DaemonProcess) -> None:
    """A frozen daemon makes calls time out; once it runs again the same client works."""
    assert daemon.proc is not None
    with Client(daemon.endpoint, timeout=10) as client:
        assert client.ping()["pong"]
        os.kill(daemon.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(RequestTimeoutError):
                client.count_tokens(text="one two three", timeout=0.3)
        finally:
            os.kill(daemon.proc.pid, signal.SIGCONT)
        assert {"tokens": 1} == client.count_tokens(text="hello")


def test_reconnects_after_a_daemon_restart(daemon: DaemonProcess) -> None:
    """The same client keeps working across a restart, even when called while it is down."""
    with Client(daemon.endpoint, timeout=20) as client:
        client.flush()
        client.compact("sync-restart", conversation(10), "quarter", ts=1)
        client.flush("sync-restart")
        daemon.stop()
        results: list[object] = []
        waiting = threading.Thread(target=lambda: results.append(client.inspect("sync-restart")))
        waiting.start()
        daemon.start()
        waiting.join(30)
        assert [2, 15] == results[0]["deleted_range"]  # type: ignore[index]
        assert client.ping()["pong"]


def test_any_client_error_is_a_ctxwin_error(client: Client) -> None:
    """Everything the client raises for a refused request derives from CtxwinError."""
    with pytest.raises(CtxwinError):
        client.call(Call("no_such_op", {}))


def test_one_client_shared_by_threads(client: Client) -> None:
    """Calls from several threads on one Client are serialised and each gets its own reply."""
    results: dict[int, int] = {}

    def count(n: int) -> None:
        results[n] = client.count_tokens(text=" ".join(["word"] * n))["tokens"]

    threads = [threading.Thread(target=count, args=(n,)) for n in range(1, 9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert {n: n for n in range(1, 9)} == results


def test_an_ephemeral_handle_stays_ephemeral_whatever_its_first_op(
    client: Client, shared: DaemonProcess
) -> None:
    """should_compact opens the task as ephemeral too; nothing of it is ever written."""
    sub = client.task("sync-sub-first", ephemeral=True)
    usage: proto.Usage = {"ts": 1, "tokens_in": 10}
    assert sub.should_compact(usage, MODEL)["compact"] is False
    assert sub.compact(conversation(10), "none", ts=2)["deleted_range"] is not None
    client.flush()
    assert not shared.task_dir("sync-sub-first").exists()
    # A task only looked at (inspect opened it as persistent) is taken over as ephemeral...
    assert client.inspect("sync-looked-at")["updates"] == []
    looked_at = client.task("sync-looked-at", ephemeral=True)
    assert looked_at.compact(conversation(10), "none", ts=3)["deleted_range"] is not None
    client.flush()
    assert not shared.task_dir("sync-looked-at").exists()
    # ... a task in use as a persistent one is not, with state or still without any.
    client.task("sync-live").compact(conversation(10), "quarter", ts=4)
    client.task("sync-early").truncated_messages(conversation(2))  # no state yet
    for live in ("sync-live", "sync-early"):
        with pytest.raises(BadRequestError, match="open as a persistent task"):
            client.task(live, ephemeral=True).truncated_messages(conversation(2))
    assert client.task("sync-early").compact(conversation(10), "none", ts=5)["deleted_range"]
    client.flush()
    assert shared.task_dir("sync-early").exists()


@pytest.mark.parametrize(
    "send",
    [
        lambda client: client.rollback("sync-big", 2**64),
        lambda client: client.count_tokens(text="half a pair \ud83d"),
        lambda client: client.task("sync-big").truncated_messages(
            [{"role": "user", "content": [{"type": "tool_use", "input": {"n": 10**20}}]}]
        ),
    ],
    ids=["ts-beyond-64-bits", "lone-surrogate", "huge-int-in-a-message"],
)
def test_values_msgpack_cannot_carry_are_refused_before_sending(client: Client, send: Any) -> None:
    """No OverflowError or UnicodeEncodeError escapes: a local BadRequestError, client intact."""
    with pytest.raises(BadRequestError) as refused:
        send(client)
    assert refused.value.local
    assert client.ping()["pong"] is True


def test_an_infinite_timeout_waits_without_overflow(shared: DaemonProcess) -> None:
    """timeout=inf (or huge) means wait as long as it takes."""
    for timeout in (math.inf, 1e300):
        with Client(shared.endpoint, timeout=timeout) as patient:
            assert patient.ping()["pong"] is True


def test_a_malformed_endpoint_is_a_usage_error(shared: DaemonProcess) -> None:
    """An endpoint ZeroMQ cannot parse raises a local BadRequestError naming it."""
    with Client("localhost:7878") as wrong, pytest.raises(BadRequestError) as refused:
        wrong.ping()
    assert refused.value.local
    assert "localhost:7878" in refused.value.message
