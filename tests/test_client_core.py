"""The client's pure core, errors, usage helpers and public surface (no daemon needed)."""

from __future__ import annotations

import errno
import inspect
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, assert_type

import pytest
import zmq

import ctxwin.client
from ctxwin import proto
from ctxwin.client import AsyncClient, AsyncTask, Client, Task, _core, _delta, _link, _ops
from ctxwin.client._errors import (
    ERROR_CLASSES,
    BadRequestError,
    DaemonUnavailableError,
    RequestTimeoutError,
    error_for,
)
from tests._daemon import DaemonProcess

CLIENT_SRC = Path(ctxwin.client.__file__).parent
MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "task"},
    {"role": "assistant", "content": "ok"},
]


def test_all_lists_exactly_the_public_names() -> None:
    """``__all__`` names every public attribute of ctxwin.client and nothing else."""
    public = {
        name
        for name, value in vars(ctxwin.client).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    }
    assert sorted(public) == sorted(ctxwin.client.__all__)


def test_every_wire_error_code_has_its_class() -> None:
    """Each error code of the protocol maps to a CtxwinError subclass carrying code and message."""
    for code in proto.ErrorCode:
        error = error_for(code.value, "why")
        assert type(error) is ERROR_CLASSES[code.value]
        assert isinstance(error, ctxwin.client.CtxwinError)
        assert (code.value, "why") == (error.code, error.message)


def test_an_unknown_error_code_keeps_its_code() -> None:
    """A code this client does not know becomes a plain CtxwinError with that code."""
    error = error_for("brand_new", "later version")
    assert type(error) is ctxwin.client.CtxwinError
    assert "brand_new" == error.code


def test_timeout_error_is_also_a_builtin_timeout() -> None:
    """RequestTimeoutError is a DaemonUnavailableError and a builtin TimeoutError."""
    error = ctxwin.client.RequestTimeoutError("late", endpoint="ipc://x")
    assert isinstance(error, TimeoutError)
    assert isinstance(error, ctxwin.client.DaemonUnavailableError)
    assert ("timeout", "ipc://x") == (error.code, error.endpoint)


def test_builders_validate_before_anything_is_sent() -> None:
    """A bad task id or argument fails at the call site with the daemon's own error class."""
    with pytest.raises(ctxwin.client.InvalidTaskIdError):
        _ops.inspect("../etc")
    with pytest.raises(ctxwin.client.BadRequestError, match="keep"):
        _ops.compact("t1", MESSAGES, "half", ts=1)  # type: ignore[arg-type]
    with pytest.raises(ctxwin.client.BadRequestError, match="exactly one"):
        _ops.count_tokens(MESSAGES, text="both")
    with pytest.raises(TypeError, match="estimat"):  # an option misspelt: as Python would
        _ops.inspect("t1", estimat=True)  # type: ignore[call-arg]


def test_deleted_range_distinguishes_unset_from_none() -> None:
    """Leaving ``deleted_range`` out omits it; None sends an explicit nil that clears it."""
    assert "deleted_range" not in _ops.truncated_messages("t1", MESSAGES).args
    assert _ops.truncated_messages("t1", MESSAGES, deleted_range=None).args["deleted_range"] is None
    assert [2, 3] == _ops.truncated_messages("t1", MESSAGES, deleted_range=[2, 3]).args[
        "deleted_range"
    ]


def test_optional_arguments_left_none_are_not_sent() -> None:
    """Optional arguments that are None stay off the wire; ts defaults to now."""
    call = _ops.prepare_request("t1", MESSAGES, {"id": "m", "context_window": 1000})
    assert {"task", "messages", "model"} == set(call.args)
    assert _ops.optimize_file_reads("t1", MESSAGES).args["ts"] > 1_600_000_000_000
    assert {"task", "ephemeral"} == set(_ops.inspect("t1", ephemeral=True).args)


def _parameters(function: Any, drop: int = 0) -> list[inspect.Parameter]:
    return list(inspect.signature(function).parameters.values())[drop:]


def test_every_op_has_a_builder_and_a_method_on_both_clients() -> None:
    """Each wire op has a builder, and both clients' method takes exactly its arguments."""
    for op in proto.OPS:
        method = "close_task" if op == "close" else op
        build = getattr(_ops, op)
        sync, asynchronous = getattr(Client, method), getattr(AsyncClient, method)
        assert not inspect.iscoroutinefunction(sync)
        assert inspect.iscoroutinefunction(asynchronous)
        for made in (sync, asynchronous):
            assert _parameters(build) == _parameters(made, drop=1)
            assert build.__doc__ == made.__doc__


def test_task_handles_take_each_task_op_without_the_task_id() -> None:
    """Each op whose first argument is the task is a method of both handles, minus that one."""
    task_ops = [op for op in proto.OPS if _parameters(getattr(_ops, op))[0].name == "task"]
    assert "flush" in task_ops
    assert "should_compact" not in task_ops  # its task is a keyword: a builder of its own
    for op in [*task_ops, "should_compact"]:
        build = getattr(_ops, "task_should_compact" if op == "should_compact" else op)
        for handle in (Task, AsyncTask):
            assert _parameters(build, drop=1) == _parameters(getattr(handle, op), drop=1)
    assert [p.name for p in _parameters(_ops.task_should_compact)] == [
        "task",
        *(p.name for p in _parameters(_ops.should_compact) if p.name != "task"),
    ]


def test_methods_keep_their_builders_precise_types(shared_daemon: DaemonProcess) -> None:
    """Methods made from builders keep argument and result types for mypy, and run as such."""
    model: proto.Model = {"id": "m", "context_window": 1000}
    with Client(shared_daemon.endpoint, timeout=10) as client:
        result = client.prepare_request("builder-types", MESSAGES, model, estimate=True, timeout=5)
        assert MESSAGES == assert_type(result, proto.PrepareRequestResult)["messages"]
        task = client.task("builder-types", delta=False)
        view = task.truncated_messages(MESSAGES, deleted_range=None)
        assert MESSAGES == assert_type(view, proto.TruncatedMessagesResult)["messages"]
        assert [] == assert_type(task.inspect(), proto.InspectResult)["updates"]
    if TYPE_CHECKING:  # what mypy must refuse; never run
        client.prepare_request("builder-types", MESSAGES, model, estimat=True)  # type: ignore[call-arg]
        task.inspect(task="builder-types")  # type: ignore[call-arg]


def test_reply_target_matches_by_id_and_drops_strangers() -> None:
    """A reply goes to its id; unknown ids are dropped; an id-less error only to a lone caller."""
    answer = proto.Reply(7, True, result={})
    assert 7 == _core.reply_target(answer, {7, 8})
    assert _core.reply_target(proto.Reply(9, True, result={}), {7, 8}) is None
    lost = proto.Reply(None, False, code="bad_request", message="?")
    assert 7 == _core.reply_target(lost, {7})
    assert _core.reply_target(lost, {7, 8}) is None


def test_decode_drops_frames_that_are_not_replies() -> None:
    """Garbage frames decode to None instead of raising."""
    assert _core.decode([b"\xc1"]) is None
    assert _core.decode([]) is None
    assert 3 == (_core.decode([b"", proto.encode_result(3, {})]) or proto.Reply(0, False)).id


def test_busy_is_retried_with_growing_bounded_delays() -> None:
    """busy asks for a retry after 0.05, 0.1, ... capped, then raises BusyError."""
    policy = _core.RetryPolicy(busy_retries=3, initial_delay=0.05, max_delay=0.15)
    busy = proto.Reply(1, False, code="busy", message="full")
    call = _ops.ping()
    delays = [_core.outcome(call, busy, n, policy, 10.0) for n in range(3)]
    assert [_core.Retry(0.05), _core.Retry(0.1), _core.Retry(0.15)] == delays
    with pytest.raises(ctxwin.client.BusyError):
        _core.outcome(call, busy, 3, policy, 10.0)
    with pytest.raises(ctxwin.client.BusyError):
        _core.outcome(call, busy, 0, policy, 0.01)


def test_results_missing_fields_raise_bad_reply() -> None:
    """A result lacking a field of the wire table raises BadReplyError."""
    with pytest.raises(ctxwin.client.BadReplyError, match="version"):
        _core.outcome(
            _ops.ping(), proto.Reply(1, True, result={"pong": True}), 0, _core.RetryPolicy(), 1
        )


def test_oversize_requests_are_refused_locally() -> None:
    """A request larger than the frame limit raises TooLargeError before sending."""
    call = _ops.count_tokens(text="x" * 2000)
    with pytest.raises(ctxwin.client.TooLargeError):
        _core.encode(call, 1, proto.Limits(max_frame_bytes=1000))


def test_usage_from_anthropic_maps_the_cache_fields() -> None:
    """Anthropic input/output/cache creation/cache read tokens map one to one."""
    usage = ctxwin.client.usage_from_anthropic(
        {
            "input_tokens": 10,
            "output_tokens": 5,
            "cache_creation_input_tokens": 100,
            "cache_read_input_tokens": 1000,
        },
        ts=42,
    )
    assert {
        "ts": 42,
        "tokens_in": 10,
        "tokens_out": 5,
        "cache_writes": 100,
        "cache_reads": 1000,
    } == usage
    assert 1115 == ctxwin.client.total_tokens(usage)


def test_usage_from_openai_moves_cached_tokens_out_of_the_prompt() -> None:
    """OpenAI's prompt tokens include the cached ones; the total stays prompt + completion."""

    class Details:
        cached_tokens = 300

    class Report:
        prompt_tokens = 1000
        completion_tokens = 50
        prompt_tokens_details = Details()

    usage = ctxwin.client.usage_from_openai(Report())
    assert {"tokens_in": 700, "tokens_out": 50, "cache_writes": 0, "cache_reads": 300} == usage
    assert usage == ctxwin.client.usage_from_provider(
        {
            "prompt_tokens": 1000,
            "completion_tokens": 50,
            "prompt_tokens_details": {"cached_tokens": 300},
        }
    )


def test_usage_from_metrics_reads_cline_history_counts() -> None:
    """Cline's ``metrics.tokens`` {prompt, completion, cached} becomes a wire usage."""
    usage = ctxwin.client.usage_from_provider({"prompt": 10049, "completion": 640, "cached": 0})
    assert {"tokens_in": 10049, "tokens_out": 640, "cache_writes": 0, "cache_reads": 0} == usage


def test_missing_or_bad_usage_numbers_count_zero() -> None:
    """Absent, None, negative or non-numeric counts become 0."""
    usage = ctxwin.client.usage_from_anthropic({"input_tokens": None, "output_tokens": -3})
    assert 0 == ctxwin.client.total_tokens(usage)


def test_client_imports_only_proto_pyzmq_msgpack_and_the_stdlib() -> None:
    """No module of ctxwin.client imports anything beyond proto, zmq, msgpack and the stdlib."""
    import ast
    import sys

    allowed = {"zmq", "msgpack", "ctxwin"} | set(sys.stdlib_module_names)
    optional = {"_plot.py": {"matplotlib"}}  # the [plot] extra, imported only for --plot
    for path in [*CLIENT_SRC.glob("*.py"), *CLIENT_SRC.glob("cli/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top in allowed | optional.get(path.name, set()), f"{path.name}: {name}"
                if name.startswith("ctxwin."):
                    assert name.startswith(("ctxwin.proto", "ctxwin.client")), name


def test_task_handles_refuse_bad_ids_at_once(tmp_path: Path) -> None:
    """A Task or AsyncTask with an invalid id fails where it is made, before any I/O."""
    with ctxwin.client.Client(f"ipc://{tmp_path / 'x.sock'}") as client:
        with pytest.raises(ctxwin.client.InvalidTaskIdError) as caught:
            client.task("../x")
        assert caught.value.local is True
    with pytest.raises(ctxwin.client.InvalidTaskIdError):
        ctxwin.client.AsyncClient(f"ipc://{tmp_path / 'x.sock'}").task("")


def test_connect_errors_tell_a_bad_address_from_an_unreachable_daemon() -> None:
    """An address ZeroMQ cannot parse is a local usage error; running out of descriptors is not."""
    for code in (errno.EINVAL, zmq.EPROTONOSUPPORT):
        bad = _link.connect_error("foo:1", zmq.ZMQError(code))
        assert (type(bad), bad.local) == (BadRequestError, True)
    unreachable = _link.connect_error("ipc:///x.sock", zmq.ZMQError(errno.EMFILE))
    assert isinstance(unreachable, DaemonUnavailableError)
    assert unreachable.endpoint == "ipc:///x.sock"


def test_timeouts_become_budgets_that_are_never_negative() -> None:
    """Negative and NaN timeouts mean no time at all; infinite ones mean no limit on a lock."""
    assert [_core.budget(t) for t in (-1.0, float("nan"), 0.0, 2.5)] == [0.0, 0.0, 0.0, 2.5]
    assert _core.lock_wait(float("inf")) is None
    assert _core.lock_wait(3.0) == 3.0


def test_a_resend_needs_time_left() -> None:
    """After resync_required, the whole history goes again only if the deadline has not passed."""
    cause = error_for("resync_required", "send the whole list")
    assert 0 < _core.left_for_resend(time.monotonic() + 5, cause, "ipc:///x") <= 5
    with pytest.raises(RequestTimeoutError, match="no time left"):
        _core.left_for_resend(time.monotonic() - 0.1, cause, "ipc:///x")


def test_the_link_tells_a_refused_endpoint_from_a_restarting_daemon() -> None:
    """Refused before ever connecting is unreachable at once; after a drop, only past the grace."""
    link = _link.Link()
    link.feed(zmq.EVENT_CONNECT_RETRIED, 10.0)
    assert link.unreachable(10.0)
    link.feed(zmq.EVENT_CONNECTED, 11.0)
    assert (link.connected, link.dropped, link.unreachable(11.0)) == (True, False, False)
    link.feed(zmq.EVENT_DISCONNECTED, 12.0)
    assert link.dropped
    link.fresh()  # a new socket: the daemon was reached before, it may be restarting
    link.feed(zmq.EVENT_CONNECT_RETRIED, 13.0)
    assert not link.unreachable(13.0 + _link.RECONNECT_GRACE / 2)
    assert link.unreachable(13.0 + _link.RECONNECT_GRACE)
    assert "went away" in str(_link.unreachable_error("ipc:///x", link))


def test_delta_sync_asks_only_for_what_the_daemon_s_features_name() -> None:
    """The view form follows ping's features; a daemon without delta sync turns it off."""
    forms: list[tuple[Any, str | None]] = [
        (proto.FEATURES, "patch_prepend"),
        (["delta", "view_patch"], "patch"),
        (["delta"], None),
    ]
    for features, view in forms:
        sync = _delta.DeltaSync()
        call = sync.call(_ops.truncated_messages("t1", ()), MESSAGES, features)
        assert call.args.get("view") == view
        assert sync.enabled
    assert {_delta.DELTA, _delta.VIEW_PATCH, _delta.VIEW_PATCH_PREPEND} <= set(proto.FEATURES)
    sync = _delta.DeltaSync()
    call = sync.call(_ops.truncated_messages("t1", ()), MESSAGES, [])
    assert (set(call.args), sync.enabled) == ({"task", "messages"}, False)
    again = sync.call(_ops.truncated_messages("t1", ()), MESSAGES, proto.FEATURES)
    assert (set(again.args), sync.enabled) == ({"task", "messages"}, False)


def test_only_ops_that_change_nothing_twice_are_sent_again_after_a_drop() -> None:
    """A dropped read is resent; a dropped change raises, saying it may have been applied."""
    _link.after_drop(_ops.inspect("t1"), "ipc:///x")
    with pytest.raises(DaemonUnavailableError, match="may or may not have been applied"):
        _link.after_drop(_ops.compact("t1", MESSAGES, ts=1), "ipc:///x")
    assert set(proto.OPS) >= _link.SAFE_TO_REPEAT
