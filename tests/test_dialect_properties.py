"""Properties of every dialect's views over generated conversations (docs/DIALECTS.md)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ctxwin.engine import (
    DEFAULT_NOTICES,
    PatchMaker,
    TaskState,
    apply_truncation_notice,
    compact,
    keep_from,
)
from ctxwin.engine._dialects import DIALECTS
from ctxwin.engine._mapped import MappedHistory
from ctxwin.engine._mapped_view import view_pieces
from ctxwin.engine._reads import DEFAULT_READ_RULES, ReadRules
from ctxwin.proto import apply_view_patch, view_origins
from tests._dialect_data import RENDER, Call, Turn, conversations, render_cline, sdk_validator
from tests._rules import CHECKS, check_origins

PROFILE = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODEL = {"id": "m", "context_window": 64_000}
OVER = {"ts": 0, "tokens_in": 200_000}  # a previous request over the limit: prepare_request cuts
DIALECT_NAMES = sorted(DIALECTS)
VALIDATORS = {name: sdk_validator(name) for name in DIALECT_NAMES}

operations = st.lists(
    st.tuples(
        st.sampled_from(
            ["prepare", "prepare_over", "compact", "notice", "optimize", "rollback", "drop"]
        ),
        st.floats(0.2, 1.0),
    ),
    min_size=1,
    max_size=8,
)


def _origins(length: int, patch: dict[str, Any]) -> list[int | None]:
    """The origins of a whole patch's view (docs/DIALECTS.md, "View patches")."""
    marks = dict(patch.get("origins", []))
    return view_origins(length, patch, dict(patch["overrides"]), marks)


def _kept_out(dialect: str, message: dict[str, Any]) -> bool:
    return message.get("role") in ("system", "developer")


def _bare_results(message: dict[str, Any]) -> bool:
    content = message["content"]
    return isinstance(content, list) and any(b.get("type") == "tool_result" for b in content)


class Run:
    """One task of a dialect: its state, its mapped history, and the op that runs on both."""

    def __init__(self, dialect: str, reads: ReadRules = DEFAULT_READ_RULES) -> None:
        self.dialect = dialect
        self.state = TaskState(reads=reads, dialect=DIALECTS[dialect])
        self.history = MappedHistory(DIALECTS[dialect])
        self.patches = PatchMaker()
        self.state.cache = self.history.cache
        self.ts = 0
        self.internal_view: list[dict[str, Any]] = []  # the engine's view of the last op

    def op(
        self, name: str, messages: list[dict[str, Any]], fraction: float = 0.5
    ) -> list[dict[str, Any]]:
        self.ts += 1
        history = self.history
        history.sync(messages)
        internal = history.internal
        if name in ("prepare", "prepare_over"):
            previous = {**OVER, "ts": self.ts} if name == "prepare_over" else None
            view: list[Any] = self.state.prepare_request(internal, previous, MODEL)["messages"]
        else:
            if name == "compact":
                compact(self.state, internal, "quarter", self.ts)
            elif name == "notice":
                apply_truncation_notice(self.state, self.ts, internal)
            elif name == "optimize":
                self.state.optimize_file_reads(internal, self.ts)
            elif name == "drop":
                self.state.drop(_turns_to_drop(internal, fraction), self.ts)
            else:
                self.state.rollback(self.ts - 2)
            view = self.state.truncated_messages(internal)
        # A copy of the internal list (no view cache is its) gives the same view: the
        # dialect, not the list passed, says how orphan results are dropped.
        assert self.state.truncated_messages(list(internal)) == view
        # Every other view goes through the patch first (as the daemon sends it), then
        # the view is mapped again from the same internal view: both give the same.
        patched = None
        if self.ts % 2:
            dropped = self.state.dropped
            patch = self.patches.of_mapped(history, view, self.state.deleted_range, dropped=dropped)
            patched = None if patch is None else apply_view_patch(messages, patch)
            if patch is not None and patched is not None:
                check_origins(messages, patched, _origins(len(messages), patch))
        mapped = history.view(view, self.state.deleted_range, dropped=self.state.dropped)
        assert patched is None or patched == mapped
        self.internal_view = view
        return mapped


def _turns_to_drop(internal: list[dict[str, Any]], fraction: float) -> list[tuple[int, int]]:
    """Whole turns (an assistant message after a user one, to the next such) to add to the
    deleted set, as ``auto`` drops them: about ``fraction`` of them, never the newest."""
    starts = [
        index
        for index in range(3, len(internal))
        if internal[index]["role"] == "assistant" and internal[index - 1]["role"] == "user"
    ]
    ranges = []
    for place, low in enumerate(starts[:-1]):
        if int((place + 1) * fraction) != int(place * fraction):
            ranges.append((low, starts[place + 1] - 1))
    return ranges


def _without_results(dialect: str, message: dict[str, Any]) -> Any:
    """``message`` with its tool results left out (the parts a read's notice may stand in)."""
    if message.get("role") == "tool" or str(message.get("type", "")).endswith("_call_output"):
        return None
    key = "parts" if dialect == "gemini" else "content"
    parts = message.get(key)
    if not isinstance(parts, list):
        return message
    kept = [
        part
        for part in parts
        if not (
            isinstance(part, dict)
            and (part.get("type") == "tool_result" or "functionResponse" in part)
        )
    ]
    return {**message, key: kept}


def _results_by_call(dialect: str, message: Any) -> dict[str, str]:
    """The results a message holds: call id -> its text as JSON (Chat, Anthropic, Responses)."""
    if not isinstance(message, dict):
        return {}
    if dialect == "openai-chat" and message.get("role") == "tool":
        return {message["tool_call_id"]: json.dumps(message.get("content"))}
    if dialect == "openai-responses" and str(message.get("type", "")).endswith("_call_output"):
        return {message["call_id"]: json.dumps(message.get("output"))}
    content = message.get("content")
    if dialect == "anthropic" and message.get("role") == "user" and isinstance(content, list):
        return {
            block["tool_use_id"]: json.dumps(block.get("content"))
            for block in content
            if isinstance(block, dict) and block.get("type") == "tool_result"
        }
    return {}


def check_results_kept(run: Run, messages: list[dict[str, Any]], view: list[Any]) -> None:
    """A call the view sends is answered by its real result wherever the history holds it
    (outside the deleted range), never by the missing-result text."""
    missing = run.state.notices.missing_result
    history = run.history
    start = keep_from(run.state.deleted_range)
    real: dict[str, int] = {}
    dropped = run.state.dropped
    for internal, members in enumerate(history.members):
        if 2 <= internal < start or any(low <= internal <= high for low, high in dropped):
            continue
        for member in members:
            for call, text in _results_by_call(run.dialect, messages[member]).items():
                if missing not in text:
                    real.setdefault(call, member)
    for message in view:
        for call, text in _results_by_call(run.dialect, message).items():
            assert not (missing in text and call in real), (call, real[call])


def check_view(run: Run, messages: list[dict[str, Any]], view: list[dict[str, Any]]) -> None:
    """Every property a view of ``messages`` must have."""
    CHECKS[run.dialect](view)
    check_results_kept(run, messages, view)
    VALIDATORS[run.dialect](view)
    # A read's notice stands in its result only, never in a text of the conversation.
    notice = run.state.notices.duplicate_file_read
    assert notice not in json.dumps([_without_results(run.dialect, m) for m in view])
    held = {id(message) for message in view}
    # Kept-out messages are never cut, and keep their order.
    kept_out = [m for m in messages if _kept_out(run.dialect, m)]
    assert kept_out == [m for m in view if id(m) in {id(k) for k in kept_out}]
    # The newest message is always sent (as given, or rebuilt last when the view changed
    # it), unless all it holds is an orphan result.
    newest = messages[-1]
    merged = [call["id"] for call in newest.get("tool_calls") or []]
    sent_calls = {call["id"] for message in view for call in message.get("tool_calls") or []}
    if merged and set(merged) <= sent_calls:
        pass  # OpenAI Chat: its calls went out in one message with the calls before them
    elif id(newest) not in held and "call_orphan" not in json.dumps(newest):
        assert view[-1].get("role") == newest.get("role")
    # The kept head: the first message (the task) is in the view, as given or edited.
    history = run.history
    if history.members and 0 not in run.state.overlay:
        assert id(messages[history.members[0][0]]) in held
    # Internal messages the engine did not touch come back as the caller's own objects,
    # but for calls split over consecutive messages, which OpenAI Chat sends as one message.
    # (The op's own view: building another would make the next op's view start afresh.)
    for message in run.internal_view:
        if any(message is m for m in history.internal):
            index = next(i for i, m in enumerate(history.internal) if m is message)
            for member in history.members[index]:
                if index in history.merges and messages[member].get("tool_calls"):
                    continue
                assert id(messages[member]) in held, (index, member)


# A call without its result, then system messages, then an orphan result: the prefix of
# half of it ends with the call and a system message, whose missing result the view fills in.
CALL_THEN_SYSTEM = [
    Turn("user", "a"),
    Turn("system", "a"),
    Turn("assistant", "a", reasoning=True, calls=[Call("call_1", "Bash", {"command": "a"})]),
    Turn("results"),
    Turn("system", "a"),
    Turn("assistant", "a"),
    Turn("results", results=[("call_orphan", "stray")]),
    Turn("user", "a"),
    Turn("assistant", "a"),
    Turn("results", results=[("call_orphan", "stray")]),
    Turn("user", "a"),
]

# A call without its result, a system message, then calls with results: a prefix ending
# with those calls holds the first call among the newest ones (OpenAI Responses sends each
# call as an item), whose missing result the view puts before the system message.
CALL_SYSTEM_CALLS = [
    Turn("user", "a"),
    Turn("assistant", "a"),
    Turn("assistant", "", calls=[Call("call_1", "Bash", {"command": "a"})]),
    Turn("results"),
    Turn("system", "a"),
    Turn("assistant", "", calls=[Call("call_2", "Bash", {"command": "a"})]),
    Turn("results", results=[("call_2", "a")]),
]


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
@PROFILE
@given(turns=conversations(), ops=operations)
@example(turns=CALL_THEN_SYSTEM, ops=[("prepare", 0.5)])
@example(turns=CALL_SYSTEM_CALLS, ops=[("prepare", 0.8)])
def test_every_view_satisfies_the_provider_and_keeps_what_must_be_kept(
    dialect: str, turns: list[Turn], ops: list[tuple[str, float]]
) -> None:
    """After every op on a growing history, the view is valid and keeps head, newest, kept-out."""
    messages = RENDER[dialect](turns)
    snapshot = copy.deepcopy(messages)
    run = Run(dialect)
    length = 1
    for name, fraction in ops:
        length = max(length, round(len(messages) * fraction))  # the history grows
        prefix = messages[:length]
        view = run.op(name, prefix, fraction)
        check_view(run, prefix, view)
    assert snapshot == messages


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
@PROFILE
@given(turns=conversations(systems=False, exact=True), ops=operations)
def test_a_conversation_cuts_as_its_cline_translation_does(
    dialect: str, turns: list[Turn], ops: list[tuple[str, float]]
) -> None:
    """Where the translation into the Cline dialect is exact, both give the same ranges."""
    native = RENDER[dialect](turns)
    cline = render_cline(turns)
    run = Run(dialect, ReadRules(()))
    run.history.sync(native)
    assert len(cline) == len(run.history.internal)
    ends = [members[-1] + 1 for members in run.history.members]
    state = TaskState()
    length = 1
    for name, fraction in ops:
        if name in ("rollback", "drop"):  # a rollback's ts differ; the deleted set is auto's
            continue
        length = max(length, round(len(cline) * fraction))
        while length < len(cline) and _bare_results(cline[length - 1]):
            length += 1  # a newest message of results only: native cuts keep its turn
        if _bare_results(cline[length - 1]):
            break
        run.op(name, native[: ends[length - 1]])
        ts = run.ts
        prefix = cline[:length]
        if name in ("prepare", "prepare_over"):
            previous = {**OVER, "ts": ts} if name == "prepare_over" else None
            state.prepare_request(prefix, previous, MODEL)
        elif name == "compact":
            compact(state, prefix, "quarter", ts)
        elif name == "notice":
            apply_truncation_notice(state, ts, prefix)
        else:
            state.optimize_file_reads(prefix, ts)
        assert state.deleted_range == run.state.deleted_range


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=conversations(), every=st.integers(3, 9))
def test_views_made_turn_by_turn_are_those_of_a_fresh_mapping(
    dialect: str, turns: list[Turn], every: int
) -> None:
    """A history growing one message a turn, cut now and then: each view (and its patch)
    resumed from the last one is the view a fresh mapping of that history gives."""
    messages = RENDER[dialect](turns)
    state = TaskState(reads=DEFAULT_READ_RULES, dialect=DIALECTS[dialect])
    history = MappedHistory(DIALECTS[dialect])
    patches = PatchMaker()
    state.cache = history.cache
    for end in range(1, len(messages) + 1):
        prefix = messages[:end]
        history.sync(prefix, end - 1)
        if end % every == 1:
            state.optimize_file_reads(history.internal, end)
        previous = {**OVER, "ts": end} if end % every == 0 else None
        view: list[Any] = state.prepare_request(history.internal, previous, MODEL)["messages"]
        if end % 2:
            patch = patches.of_mapped(history, view, state.deleted_range)
            mapped = history.view(view, state.deleted_range)
        else:
            mapped = history.view(view, state.deleted_range)
            patch = patches.of_mapped(history, view, state.deleted_range)
        fresh = MappedHistory(DIALECTS[dialect], prefix)
        assert mapped == fresh.view(state.truncated_messages(fresh.internal), state.deleted_range)
        assert patch is None or mapped == apply_view_patch(prefix, patch)
        if patch is not None:
            check_origins(prefix, apply_view_patch(prefix, patch), _origins(end, patch))


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
@PROFILE
@given(
    turns=conversations(),
    steps=st.lists(
        st.tuples(
            st.integers(0, 4),
            st.sampled_from(["prepare", "prepare_over", "notice", "optimize", "again"]),
        ),
        min_size=1,
        max_size=30,
    ),
)
def test_resumed_view_back_makes_the_pieces_of_the_plain_walk(
    dialect: str, turns: list[Turn], steps: list[tuple[int, str]]
) -> None:
    """ViewResume (the walk resumed at the last view's first change) gives the pieces of the
    plain walk from the first message, view after view, as the history grows (a step of 0
    takes two messages back), is cut and optimised, or is viewed again unchanged."""
    messages = RENDER[dialect](turns)
    state = TaskState(dialect=DIALECTS[dialect])
    history = MappedHistory(DIALECTS[dialect])
    assert history.resume is not None
    state.cache = history.cache
    end = 0
    for ts, (grow, op) in enumerate(steps, 1):
        end = min(end + grow, len(messages)) if grow else max(end - 2, 0)
        history.sync(messages[:end])
        internal = history.internal
        if op == "optimize":
            state.optimize_file_reads(internal, ts)
        elif op == "notice":
            apply_truncation_notice(state, ts, internal)
        if op.startswith("prepare"):
            previous = {**OVER, "ts": ts} if op == "prepare_over" else None
            view: list[Any] = state.prepare_request(internal, previous, MODEL)["messages"]
        else:
            view = state.truncated_messages(internal)
        resumed = history.pieces(view, state.deleted_range)
        fast, fast_kept = (
            _spelled(history, resumed.pieces),
            _spelled(history, resumed.pieces[: resumed.kept]),
        )
        plain = view_pieces(history, view, state.deleted_range, DEFAULT_NOTICES.missing_result)
        # A resumed walk may start a run where the plain one goes on: pieces are compared
        # message by message (what the view and the patch's order are made of).
        assert fast == _spelled(history, plain.pieces), f"step {ts}"
        assert len(fast_kept) == len(_spelled(history, plain.pieces[: plain.kept]))
        for (index, mine), (_, theirs) in zip(fast, _spelled(history, plain.pieces), strict=True):
            if index is not None and theirs is history.source[index]:
                assert mine is theirs  # the caller's own message, in both


def _spelled(history: MappedHistory, pieces: list[Any]) -> list[tuple[int | None, Any]]:
    """Each message the pieces stand for, with its history index."""
    out: list[tuple[int | None, Any]] = []
    for index, message, end in pieces:
        if message is None:
            out.extend((place, history.source[place]) for place in range(index, end))
        else:
            out.append((index, message))
    return out
