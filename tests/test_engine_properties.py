"""Properties of the engine over generated conversations (SPEC.md §3, §4, §9)."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxwin.engine import TaskState, next_truncation_range
from ctxwin.engine._notices import DEFAULT_NOTICES
from ctxwin.engine._view import pair_needs_repair, repair_tool_results
from tests._strategies import apply, conversations, operations, run_all

PROFILE = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def tool_use_ids(message: dict[str, Any]) -> list[str]:
    content = message["content"]
    if message["role"] != "assistant" or not isinstance(content, list):
        return []
    return [block["id"] for block in content if block.get("type") == "tool_use"]


@PROFILE
@given(conversations(), operations)
def test_the_first_pair_is_always_in_the_view(
    messages: list[dict[str, Any]], ops: list[tuple[str, Any]]
) -> None:
    """Whatever was cut, the view starts with messages 0 and 1 (edited or not)."""
    view = run_all(messages, ops).truncated_messages(messages)
    if len(messages) >= 2:
        assert [0, 1] == [view[0]["ts"], view[1]["ts"]]
        assert ["user", "assistant"] == [view[0]["role"], view[1]["role"]]
    else:
        assert messages == view


@PROFILE
@given(conversations(), st.sampled_from(["none", "lastTwo", "half", "quarter"]), st.data())
def test_a_truncation_ends_on_an_assistant_and_keeps_a_user_next(
    messages: list[dict[str, Any]], keep: str, data: st.DataObject
) -> None:
    """A non-empty range ends on an assistant message and the next kept message is a user's."""
    previous = None
    if len(messages) > 4 and data.draw(st.booleans()):
        previous = next_truncation_range(messages, None, "half")
    start, end = next_truncation_range(messages, previous, keep)
    assert start == 2
    if previous is not None:
        assert end >= previous[1] or end < start
    if start <= end < len(messages):
        assert messages[end]["role"] == "assistant"
        if end + 1 < len(messages):
            assert messages[end + 1]["role"] == "user"


@PROFILE
@given(conversations(), operations)
def test_every_tool_use_is_followed_by_its_results_in_order(
    messages: list[dict[str, Any]], ops: list[tuple[str, Any]]
) -> None:
    """In the view, a user message after tool_use blocks starts with their results in order."""
    view = run_all(messages, ops).truncated_messages(messages)
    for current, following in itertools.pairwise(view):
        ids = tool_use_ids(current)
        if not ids or following["role"] != "user":
            continue
        content = following["content"]
        assert isinstance(content, list)
        head = content[: len(ids)]
        assert ids == [block.get("tool_use_id") for block in head]
        assert all(block["type"] == "tool_result" for block in head)
        rest = content[len(ids) :]
        assert not any(block.get("type") == "tool_result" for block in rest)


@PROFILE
@given(conversations(), operations, operations)
def test_rollback_then_replay_gives_the_same_overlay(
    messages: list[dict[str, Any]],
    before: list[tuple[str, Any]],
    after: list[tuple[str, Any]],
) -> None:
    """Rolling back to a checkpoint and replaying the later operations rebuilds the overlay."""
    state = TaskState()
    ts = 0
    for op in before:
        ts += 1000
        apply(state, messages, op, ts)
    checkpoint_ts, checkpoint_range = ts, state.deleted_range
    checkpoint = json.dumps(state.dump_updates())
    for op in after:
        ts += 1000
        apply(state, messages, op, ts)
    final = json.dumps(state.dump_updates())

    state.rollback(checkpoint_ts)
    state.deleted_range = checkpoint_range
    assert checkpoint == json.dumps(state.dump_updates())
    ts = checkpoint_ts
    for op in after:
        ts += 1000
        apply(state, messages, op, ts)
    assert final == json.dumps(state.dump_updates())


@PROFILE
@given(conversations(), operations)
def test_dump_and_load_round_trip(
    messages: list[dict[str, Any]], ops: list[tuple[str, Any]]
) -> None:
    """The on-disk form survives JSON and a load: same overlay, same view."""
    state = run_all(messages, ops)
    stored = json.loads(json.dumps(state.dump_updates()))
    loaded = TaskState.load(stored, state.deleted_range)
    assert state.dump_updates() == loaded.dump_updates()
    assert state.truncated_messages(messages) == loaded.truncated_messages(messages)


@PROFILE
@given(conversations(), operations)
def test_the_input_is_never_mutated(
    messages: list[dict[str, Any]], ops: list[tuple[str, Any]]
) -> None:
    """No operation changes the caller's messages, and views are new lists."""
    pristine = copy.deepcopy(messages)
    state = run_all(messages, ops)
    view = state.truncated_messages(messages)
    in_memory = state.optimize_file_reads_in_memory(messages, 10**9)
    assert pristine == messages
    assert view is not messages
    assert in_memory["messages"] is not messages


_pair_ids = st.lists(st.sampled_from(["a", "b", "c"]), max_size=3)
_pair_block = st.one_of(
    st.builds(
        lambda tool_id: {"type": "tool_result", "tool_use_id": tool_id, "content": "r"},
        st.sampled_from(["a", "b", "c", "d", "", 7, None]),
    ),
    st.just({"type": "text", "text": "t"}),
    st.just({"type": "image", "source": {}}),
)


@given(_pair_ids, st.one_of(st.lists(_pair_block, max_size=5), st.just("text")), st.booleans())
def test_a_pair_needs_repair_exactly_when_the_repair_changes_it(
    ids: list[str], content: Any, strict: bool
) -> None:
    """The check that builds nothing agrees with repair_tool_results on every pair."""
    assistant = {
        "role": "assistant",
        "content": [{"type": "text", "text": "x"}]
        + [{"type": "tool_use", "id": tool_id, "name": "n", "input": {}} for tool_id in ids],
    }
    user = {"role": "user", "content": content}
    repaired = repair_tool_results(ids, user, DEFAULT_NOTICES) is not user
    expected = repaired if ids or strict else False
    assert pair_needs_repair(assistant, user, strict) == expected
