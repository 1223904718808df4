"""The wire protocol package: codec limits, argument checks, endpoint and error classifier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ctxwin import proto
from ctxwin.proto import ErrorCode, ProtocolError


def request(**fields: Any) -> bytes:
    body = {"v": 1, "id": 7, "op": "ping", "args": {}}
    body.update(fields)
    return msgpack.packb({k: v for k, v in body.items() if v is not ...})


def test_a_request_round_trips() -> None:
    """encode_request and decode_request agree."""
    decoded = proto.decode_request(proto.encode_request(3, "inspect", {"task": "t1"}))
    assert (3, "inspect", {"task": "t1"}) == (decoded.id, decoded.op, decoded.args)


@pytest.mark.parametrize(
    ("body", "code", "request_id"),
    [
        (b"\xc1", ErrorCode.BAD_REQUEST, None),
        (b"", ErrorCode.BAD_REQUEST, None),
        (msgpack.packb([1, 2]), ErrorCode.BAD_REQUEST, None),
        (request(id="x"), ErrorCode.BAD_REQUEST, None),
        (request(id=True), ErrorCode.BAD_REQUEST, None),
        (request(v=2), ErrorCode.UNSUPPORTED_VERSION, 7),
        (request(v=...), ErrorCode.UNSUPPORTED_VERSION, 7),
        (request(op=5), ErrorCode.BAD_REQUEST, 7),
        (request(args=[1]), ErrorCode.BAD_REQUEST, 7),
        (request(extra=1), ErrorCode.BAD_REQUEST, 7),
        (msgpack.packb({1: 2}), ErrorCode.BAD_REQUEST, None),
        (request() + b"\x00", ErrorCode.BAD_REQUEST, None),
    ],
)
def test_malformed_requests_are_refused_with_a_code(
    body: bytes, code: ErrorCode, request_id: int | None
) -> None:
    """Every malformed envelope raises ProtocolError with the right code and id."""
    with pytest.raises(ProtocolError) as caught:
        proto.decode_request(body)
    assert (code, request_id) == (caught.value.code, caught.value.request_id)


def test_oversize_frames_are_refused_before_decoding() -> None:
    """A frame over the limit is too_large."""
    limits = proto.Limits(max_frame_bytes=100)
    with pytest.raises(ProtocolError) as caught:
        proto.decode_request(proto.encode_request(1, "count_tokens", {"text": "x" * 200}), limits)
    assert ErrorCode.TOO_LARGE == caught.value.code


def test_deep_nesting_is_a_bad_request_not_a_crash() -> None:
    """Nesting far beyond any real message is refused by the decoder."""
    body = b"\x91" * 100_000 + b"\xc0"
    with pytest.raises(ProtocolError) as caught:
        proto.unpack(body)
    assert ErrorCode.BAD_REQUEST == caught.value.code


def test_replies_round_trip() -> None:
    """Result and error replies decode to what was encoded."""
    ok = proto.decode_reply(proto.encode_result(4, {"pong": True}))
    err = proto.decode_reply(proto.encode_error(None, ErrorCode.BUSY, "full"))
    assert (4, True, {"pong": True}) == (ok.id, ok.ok, ok.result)
    assert (None, False, "busy", "full") == (err.id, err.ok, err.code, err.message)


MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": []}]
MODEL = {"id": "m", "context_window": 200_000}


@pytest.mark.parametrize(
    ("op", "args", "code", "fragment"),
    [
        ("nope", {}, ErrorCode.UNKNOWN_OP, "nope"),
        ("inspect", {}, ErrorCode.BAD_REQUEST, "missing argument 'task'"),
        ("inspect", {"task": "../x"}, ErrorCode.INVALID_TASK_ID, "task id"),
        ("inspect", {"task": ""}, ErrorCode.INVALID_TASK_ID, "task id"),
        ("inspect", {"task": "a" * 129}, ErrorCode.INVALID_TASK_ID, "task id"),
        ("inspect", {"task": 5}, ErrorCode.INVALID_TASK_ID, "task id"),
        ("inspect", {"task": "t", "bogus": 1}, ErrorCode.BAD_REQUEST, "bogus"),
        ("truncated_messages", {"task": "t", "messages": "x"}, ErrorCode.BAD_REQUEST, "list"),
        (
            "truncated_messages",
            {"task": "t", "messages": [{"role": "system", "content": "x"}]},
            ErrorCode.BAD_REQUEST,
            "role",
        ),
        (
            "truncated_messages",
            {"task": "t", "messages": [{"role": "user", "content": [1]}]},
            ErrorCode.BAD_REQUEST,
            "content[0]",
        ),
        (
            "truncated_messages",
            {"task": "t", "messages": MESSAGES, "deleted_range": [3, 5]},
            ErrorCode.BAD_REQUEST,
            "start at 2",
        ),
        (
            "truncated_messages",
            {"task": "t", "messages": MESSAGES, "deleted_range": [2]},
            ErrorCode.BAD_REQUEST,
            "pair",
        ),
        (
            "should_compact",
            {"usage": {"tokens_in": -1}, "model": MODEL},
            ErrorCode.BAD_REQUEST,
            "tokens_in",
        ),
        (
            "should_compact",
            {"usage": {"tokens_in": 1.5}, "model": MODEL},
            ErrorCode.BAD_REQUEST,
            "tokens_in",
        ),
        ("context_window_info", {"model": {"id": 3}}, ErrorCode.BAD_REQUEST, "id"),
        (
            "context_window_info",
            {"model": {"id": "m", "context_window": "big"}},
            ErrorCode.BAD_REQUEST,
            "context_window",
        ),
        (
            "compact",
            {"task": "t", "messages": MESSAGES, "keep": "half", "ts": 1},
            ErrorCode.BAD_REQUEST,
            "quarter, none",
        ),
        ("rollback", {"task": "t", "ts": -1}, ErrorCode.BAD_REQUEST, "ts"),
        ("rollback", {"task": "t", "ts": 2**64 - 1}, ErrorCode.BAD_REQUEST, "ts"),
        (
            "should_compact",
            {"usage": {"ts": 1}, "model": MODEL, "threshold": 1e308},
            ErrorCode.BAD_REQUEST,
            "threshold must be a fraction of the context window, from 0 to 1",
        ),
        (
            "prepare_request",
            {"task": "t", "messages": MESSAGES, "model": MODEL, "threshold": 1.5},
            ErrorCode.BAD_REQUEST,
            "from 0 to 1",
        ),
        ("count_tokens", {}, ErrorCode.BAD_REQUEST, "exactly one"),
        ("count_tokens", {"text": "a", "messages": []}, ErrorCode.BAD_REQUEST, "exactly one"),
    ],
)
def test_arguments_are_checked(
    op: str, args: dict[str, Any], code: ErrorCode, fragment: str
) -> None:
    """validate_args refuses bad arguments with the right code and a message that says why."""
    with pytest.raises(ProtocolError) as caught:
        proto.validate_args(op, args)
    assert code == caught.value.code
    assert fragment in caught.value.message


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("ping", {}),
        ("should_compact", {"usage": {"ts": 1}, "model": MODEL, "threshold": None}),
        (
            "prepare_request",
            {
                "task": "conf-s1001_00000",
                "messages": MESSAGES,
                "model": MODEL,
                "previous_request": None,
                "deleted_range": None,
                "use_auto_condense": False,
            },
        ),
        ("flush", {}),
        ("count_tokens", {"text": "hello"}),
        ("inspect", {"task": "A.b_c-9"}),
    ],
)
def test_valid_arguments_pass(op: str, args: dict[str, Any]) -> None:
    """Well-formed arguments are accepted and the op's spec comes back."""
    assert op == proto.validate_args(op, args).name


DESIGN_OPS = {
    "ping",
    "stats",
    "context_window_info",
    "should_compact",
    "next_truncation_range",
    "prepare_request",
    "truncated_messages",
    "optimize_file_reads",
    "optimize_file_reads_in_memory",
    "compact_subagent",
    "apply_truncation_notice",
    "compact",
    "condensed",
    "rollback",
    "inspect",
    "flush",
    "close",
    "count_tokens",
}
"""The version 1 ops of DESIGN.md's table, which every daemon of the version answers."""


def test_every_op_of_the_design_table_is_known_and_each_later_one_names_its_feature() -> None:
    """The op table holds DESIGN.md's ops, and every op added since declares the feature
    ``ping`` names it by (a daemon of the same version may lack it)."""
    assert DESIGN_OPS <= set(proto.OPS)
    later = {op: spec.feature for op, spec in proto.OPS.items() if op not in DESIGN_OPS}
    assert later["plan"] == "plan"
    assert [op for op, feature in later.items() if feature is None] == []


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({"base": 0, "base_digest": bytes(16)}, "give exactly one of messages, append"),
        ({"append": [], "base": 0}, "base, base_digest and append together"),
        ({"messages": [], "base": 0, "base_digest": bytes(16)}, "either messages"),
        ({"append": [], "base": -1, "base_digest": bytes(16)}, "base must be a non-negative"),
        ({"append": [], "base": 0, "base_digest": b"short"}, "base_digest must be 16 bytes"),
        ({"append": [{"role": "x"}], "base": 3, "base_digest": bytes(16)}, "messages[3].role"),
        ({"messages": [], "view": "diff"}, "view must be one of list, patch, patch_prepend"),
    ],
)
def test_delta_arguments_are_checked(args: dict[str, Any], fragment: str) -> None:
    """Delta sync fields come as a set of three, instead of messages, and are typed."""
    with pytest.raises(proto.ProtocolError) as caught:
        proto.validate_args("truncated_messages", {"task": "t", **args})
    assert caught.value.code == proto.ErrorCode.BAD_REQUEST
    assert fragment in caught.value.message


def test_delta_arguments_pass() -> None:
    """base, base_digest and append replace messages on every history op."""
    delta = {"base": 2, "base_digest": bytes(16), "append": MESSAGES, "view": "patch"}
    for op in ("prepare_request", "plan"):
        assert op == proto.validate_args(op, {"task": "t", "model": MODEL, **delta}).name
    assert proto.validate_args("condensed", {"task": "t", **delta}).name == "condensed"


def test_endpoint_resolution_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Explicit beats $CTXWIN_ENDPOINT beats the default under $XDG_RUNTIME_DIR."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("CTXWIN_ENDPOINT", raising=False)
    assert f"ipc://{tmp_path}/ctxwin/ctxwind.sock" == proto.resolve_endpoint()
    monkeypatch.setenv("CTXWIN_ENDPOINT", "tcp://127.0.0.1:1")
    assert "tcp://127.0.0.1:1" == proto.resolve_endpoint()
    assert "ipc:///x" == proto.resolve_endpoint("ipc:///x")


def test_the_default_runtime_dir_without_xdg_is_per_user(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without $XDG_RUNTIME_DIR the socket lives in a per-user temp directory."""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert proto.default_runtime_dir().name.endswith(str(__import__("os").getuid()))


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        ({"status": 400, "message": "This model's maximum context length is 128000 tokens"}, True),
        ({"status": 400, "message": "prompt is too long: 210000 tokens > 200000 maximum"}, True),
        ({"status": 400, "message": "Input is too long for requested model."}, True),
        ({"status": 400, "error": {"message": "too many tokens in the request"}}, True),
        ({"error": {"code": "context_length_exceeded", "message": "x"}}, True),
        ({"type": "error", "error": {"type": "invalid_request_error", "message": "x"}}, True),
        ({"name": "ValidationException", "message": "Input is too long for model"}, True),
        ({"name": "ValidationException", "message": "Malformed input request"}, False),
        ({"status": 500, "message": "context window exceeded"}, False),
        ({"status": 400, "message": "invalid api key"}, False),
        ({"status": 429, "message": "rate limited"}, False),
        (None, False),
        ("context_length_exceeded", True),
    ],
)
def test_context_window_errors_are_classified(error: Any, expected: bool) -> None:
    """SPEC.md §10: provider errors that mean the request did not fit."""
    assert expected == proto.is_context_window_error(error)


def test_exceptions_are_classified_by_their_attributes() -> None:
    """An SDK exception with status and message attributes is read like a map."""

    class APIError(Exception):
        def __init__(self) -> None:
            super().__init__("maximum context length exceeded")
            self.status = 400

    assert proto.is_context_window_error(APIError())
    assert not proto.is_context_window_error(RuntimeError("boom"))


_ODD = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=4)
)
_FIELDS = ("v", "id", "op", "args")


@st.composite
def _envelopes(draw: st.DrawFn) -> dict[str, Any]:
    """A well-formed request envelope, then a few fields dropped, replaced or added."""
    envelope: dict[str, Any] = {
        "v": proto.PROTOCOL_VERSION,
        "id": draw(st.integers(-(2**63), 2**64 - 1)),
        "op": draw(st.sampled_from(["ping", "stats", "inspect", ""])),
        "args": draw(st.sampled_from([{}, {"task": "t"}])),
    }
    for _ in range(draw(st.integers(0, 2))):
        change = draw(st.sampled_from(["drop", "replace", "add"]))
        if change == "add":
            envelope[draw(st.sampled_from(["extra", "ok", "result"]))] = draw(_ODD)
        elif change == "drop":
            envelope.pop(draw(st.sampled_from(_FIELDS)), None)
        else:
            envelope[draw(st.sampled_from(_FIELDS))] = draw(st.one_of(_ODD, st.lists(_ODD)))
    return envelope


def _outcome(decode: Any, body: bytes, limits: proto.Limits) -> tuple[Any, ...]:
    try:
        return ("ok", decode(body, limits))
    except proto.ProtocolError as exc:
        return ("error", exc.code, exc.message, exc.request_id)


def _codec_decode(body: bytes, limits: proto.Limits) -> tuple[int, str, dict[str, Any]]:
    request = proto.decode_request(body, limits)
    return request.id, request.op, request.args


_ENCODE_RESULT = proto.result_encoder()


def _near(**changes: Any) -> bytes:
    """A well-formed ping envelope with ``changes`` (None drops the field)."""
    envelope: dict[str, Any] = {"v": proto.PROTOCOL_VERSION, "id": 7, "op": "ping", "args": {}}
    envelope.update(changes)
    return proto.pack({key: value for key, value in envelope.items() if value is not None})


@given(st.one_of(_envelopes().map(proto.pack), st.binary(max_size=40)))
@example(_near())
@example(_near(v=True))
@example(_near(v=1.0))
@example(_near(v=2))
@example(_near(id=True))
@example(_near(id=-1))
@example(_near(op=b"ping"))
@example(_near(args=[]))
@example(_near(args=None))
@example(proto.pack({"v": 1, "id": 7, "op": "ping", "args": None}))
@example(_near(extra=1))
@example(proto.pack([1, 7, "ping", {}]))
@example(_near(args={"task": "t" * 100}))
def test_the_fast_request_decoding_agrees_with_the_general_one(body: bytes) -> None:
    """proto's hot-path decoding of a request body accepts and refuses exactly as decode_request."""
    limits = proto.Limits(max_frame_bytes=64)
    assert _outcome(_codec_decode, body, limits) == _outcome(
        proto.decode_request_parts, body, limits
    )


@given(
    st.integers(-(2**63), 2**64 - 1),
    st.dictionaries(st.text(max_size=8), st.one_of(_ODD, st.binary(max_size=8)), max_size=4),
)
def test_the_fast_result_encoding_is_the_general_ones_byte_for_byte(
    request_id: int, result: dict[str, Any]
) -> None:
    """A result reply encodes to exactly the bytes proto.encode_result gives."""
    assert proto.encode_result(request_id, result) == _ENCODE_RESULT(request_id, result)


def test_overlay_reader_reads_the_on_disk_form_and_refuses_other_shapes() -> None:
    """read_overlay gives each message's edits by block and names where a bad shape is."""
    update = [5, "text", ["short"], []]
    edits = proto.read_overlay([[3, [proto.EDIT_READ_FILE, [[1, [update]]]]]])
    assert [proto.MessageEdits(3, proto.EDIT_READ_FILE, {1: [update]})] == edits
    assert "short" == proto.update_text(update)
    assert "read_file" == proto.EDIT_TYPES[edits[0].edit_type]
    for bad, where in [
        ({}, "must be a list"),
        ([[3, [2, [[1, [update]]]]], [4]], "entry 1"),
        ([[3, [2, [[1, [[5, "text", [], []]]]]]]], "entry 0 block 1"),
        ([[3, [True, []]]], "edit_type"),
    ]:
        with pytest.raises(proto.OverlayFormatError, match=where):
            proto.read_overlay(bad)


_OBJECTS = [object() for _ in range(4)]


@given(
    st.lists(st.sampled_from(_OBJECTS), max_size=12),
    st.lists(st.sampled_from(_OBJECTS), max_size=12),
    st.integers(0, 14),
    st.none() | st.integers(0, 14),
)
def test_first_other_and_other_places_are_the_plain_identity_scan(
    a: list[object], b: list[object], start: int, stop: int | None
) -> None:
    """The C-speed scans find the positions a plain loop over ``is not`` finds."""
    end = min(len(a), len(b)) if stop is None else min(len(a), len(b), stop)
    plain = [place for place in range(start, end) if a[place] is not b[place]]
    assert plain == list(proto.other_places(a, b, start, stop))
    assert (plain[0] if plain else max(end, start)) == proto.first_other(a, b, start, stop)
