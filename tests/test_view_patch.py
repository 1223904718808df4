"""View patches made turn by turn on the kept history, in the forms the client applies."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxwin import proto
from ctxwin.engine import History, PatchMaker, TaskState, view_patch
from tests._strategies import apply, conversations, operations


def wire(value: Any) -> Any:
    """``value`` as the other side of the wire decodes it."""
    return proto.unpack(proto.pack(value))


def tool_turns(turns: int) -> list[dict[str, Any]]:
    """A task whose user messages never carry the results of the assistant's tool calls."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "<task>Fix it</task>"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Looking."}]},
    ]
    for index in range(turns):
        messages.append(
            {"role": "user", "content": [{"type": "text", "text": f"output {index}\n" * 50}]}
        )
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"step {index}"},
                    {"type": "tool_use", "id": f"call-{index}", "name": "run", "input": {}},
                ],
            }
        )
    return messages


drops = st.lists(st.tuples(st.integers(1, 8), st.integers(0, 4)), max_size=3)
"""Ranges dropped after the range, as ``auto``'s deleted set (which may reach past a history
cut back): (how far after the message kept first, how many after their first)."""


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    conversations(),
    st.lists(
        st.tuples(
            st.integers(0, 24), operations, st.booleans(), st.booleans(), st.booleans(), drops
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_patches_made_from_the_last_rebuild_every_view_as_the_full_form_does(
    messages: list[dict[str, Any]], turns: list[tuple[int, Any, bool, bool, bool, Any]]
) -> None:
    """Turn by turn (cuts, fresh copies, range and overlay edits, turns dropped after the
    range, up to the newest one, as ``skip`` runs) every patch rebuilds the view."""
    maker = PatchMaker()
    history = History()
    state = TaskState()
    state.cache = history.cache  # views built on the last one, as the daemon builds them
    receiver = proto.PatchReceiver()
    caller: list[dict[str, Any]] = []  # the client's own objects: equal, never the daemon's
    ts = 0
    for cut, ops, fresh, prepend, holds, dropping in [
        *turns,
        (len(messages), [], False, True, True, []),
    ]:
        prefix = messages[: min(cut, len(messages))]
        if fresh:
            prefix = [copy.deepcopy(message) for message in prefix]  # same values, new objects
        common = 0
        while (
            common < min(len(prefix), len(history)) and history.messages[common] is prefix[common]
        ):
            common += 1
        history.apply(common, history.digest_of(common), prefix[common:])
        caller = [copy.deepcopy(message) for message in prefix]
        for op in ops:
            ts += 1000
            apply(state, history.messages, op, ts)
        ts += 1000
        kept = state.deleted_range[1] + 1 if state.deleted_range else 2
        firsts = [(kept + offset, size) for offset, size in dropping]
        state.drop([(first, first + size) for first, size in firsts], ts)
        view = state.truncated_messages(history.messages)
        base = receiver.token if holds else None
        patch = maker.of_history(
            view, history, state.deleted_range, base, prepend=prepend, gaps=state.dropped
        )
        assert patch is not None
        if not prepend:
            assert "prepend" not in patch
        rebuilt = receiver.apply(caller, wire(patch))
        whole = view_patch(view, history.messages, state.deleted_range, state.dropped)
        old_form = proto.apply_view_patch(caller, wire(whole))
        assert rebuilt == view
        assert rebuilt == old_form
        # Messages the view took from the history as they were are the caller's own objects.
        layout: dict[str, Any] = {
            key: patch[key] for key in ("length", "keep_from", "skip") if key in patch
        }
        origins = proto.apply_view_patch(list(range(len(caller))), {**layout, "overrides": []})
        assert receiver.origins() == origins
        for place, origin in enumerate(origins):
            if view[place] is history.messages[origin]:
                assert rebuilt[place] is caller[origin]


def test_history_messages_replaced_since_the_last_patch_are_looked_at_again() -> None:
    """A view keeping the last view's objects where the history now holds copies overrides them."""
    maker = PatchMaker()
    messages = tool_turns(2)
    history = History(messages)
    old_view = list(history.messages)
    assert maker.of_history(old_view, history, None, None) is not None
    copies = copy.deepcopy(messages[3:])
    history.apply(3, history.digest_of(3), copies)  # equal messages, other objects
    patch = maker.of_history(list(old_view), history, None, None)
    assert patch is not None
    expected = view_patch(old_view, history.messages, None)["overrides"]
    assert [origin for origin, _ in expected] == [3, 4, 5]
    assert patch["overrides"] == expected


def test_history_messages_replaced_behind_a_gap_are_looked_at_again() -> None:
    """Past a run of the deleted set, the history messages replaced since the last patch are
    found by their own index: a view keeping the old objects overrides each of them."""
    maker = PatchMaker()
    messages = tool_turns(6)  # 14 messages
    history = History(messages)
    dropped = [(3, 6)]
    old_view = [messages[index] for index in (0, 1, 2, *range(7, 14))]
    first = maker.of_history(old_view, history, None, None, gaps=dropped)
    assert first is not None
    assert first["skip"] == [[3, 7]]
    copies = copy.deepcopy(messages[9:])
    history.apply(9, history.digest_of(9), copies)  # equal messages, other objects
    patch = maker.of_history(list(old_view), history, None, None, gaps=dropped)
    assert patch is not None
    expected = view_patch(old_view, history.messages, None, dropped)["overrides"]
    assert [origin for origin, _ in expected] == list(range(9, 14))
    assert patch["overrides"] == expected


def test_a_repaired_newest_message_crosses_as_the_blocks_put_first() -> None:
    """Each turn's patch carries the filled-in results of the newest message, not the message."""
    maker = PatchMaker()
    messages = tool_turns(6)
    history = History(messages[:-2])
    state = TaskState()
    state.cache = history.cache  # the view built on the last one keeps its repaired messages
    receiver = proto.PatchReceiver()
    first = maker.of_history(
        state.truncated_messages(history.messages), history, None, None, prepend=True
    )
    assert first is not None
    assert first["overrides"] == []
    assert [origin for origin, _ in first["prepend"]] == [4, 6, 8, 10]
    receiver.apply(messages[:-2], wire(first))
    history.apply(len(messages) - 2, history.digest_of(len(messages) - 2), messages[-2:])
    view = state.truncated_messages(history.messages)
    patch = maker.of_history(view, history, None, receiver.token, prepend=True)
    assert patch is not None
    missing = view[12]["content"][0]  # the filled-in result, with the daemon's notice text
    assert (missing["type"], missing["tool_use_id"]) == ("tool_result", "call-4")
    assert (patch["reuse"], patch["overrides"], patch["prepend"]) == (True, [], [[12, [missing]]])
    assert len(proto.pack(patch)) < 300 < len(proto.pack(view[12]))
    assert receiver.apply(copy.deepcopy(messages), wire(patch)) == view


def test_a_message_changed_beyond_its_first_blocks_is_sent_whole() -> None:
    """prepended_blocks refuses every change but blocks put before the original's own ones."""
    block = {"type": "text", "text": "a"}
    original = {"role": "user", "content": [block], "ts": 1}
    added = {"type": "tool_result", "tool_use_id": "x", "content": "r"}
    assert proto.prepended_blocks(original, {**original, "content": [added, block]}) == [added]
    assert proto.prepended_blocks(original, {**original, "content": [block, added]}) is None
    assert proto.prepended_blocks(original, {**original, "content": [dict(block)]}) is None
    assert proto.prepended_blocks(original, {**original, "ts": 2}) is None
    reordered = {"content": [added, block], "role": "user", "ts": 1}
    assert proto.prepended_blocks(original, reordered) is None
    assert proto.prepended_blocks({"role": "user", "content": "text"}, original) is None


@pytest.mark.parametrize(
    ("prepend", "problem"),
    [
        ({"0": []}, "must be a list"),
        ([[0]], "must be a list"),
        ([[0, {}]], "must be a list"),
        ([[True, []]], "must be a list"),
        ([[5, []]], "not in the view"),
        ([[1, []]], "not in the view"),  # also overridden
        ([[0, []]], "no block list"),
    ],
)
def test_a_prepend_entry_that_does_not_fit_is_refused(prepend: Any, problem: str) -> None:
    """The client refuses a prepend entry it cannot apply to its own history."""
    history = [{"role": "user", "content": "plain"}, {"role": "assistant", "content": []}]
    patch = {"length": 2, "keep_from": 2, "overrides": [[1, {}]], "prepend": prepend}
    with pytest.raises(ValueError, match=problem):
        proto.apply_view_patch(history, patch)
    with pytest.raises(ValueError, match=problem):
        proto.PatchReceiver().apply(history, patch)


def test_a_history_cut_back_behind_a_gap_drops_the_overrides_past_its_end() -> None:
    """With the same gaps, a view of a history cut back to the gap reuses the last patch: the
    overrides of messages past the new end are dropped, found by the last view's own runs
    (which reached its longer history), so none names a message the view no longer holds."""
    messages = tool_turns(3)  # 8 messages
    maker = PatchMaker()
    receiver = proto.PatchReceiver()
    dropped = [(3, 4)]  # the assistant turn at 3-4 left out
    history = History(messages[:7])
    edited = {**messages[6], "content": [{"type": "text", "text": "shortened"}]}
    view = [*messages[:3], messages[5], edited]
    first = maker.of_history(view, history, None, None, gaps=dropped)
    assert first is not None
    assert first["overrides"] == [[6, edited]]
    caller = [copy.deepcopy(message) for message in history.messages]
    assert receiver.apply(caller, wire(first)) == view
    history.apply(5, history.digest_of(5), [])  # cut back to 5 messages: 0-2, then the gap
    shorter = list(messages[:3])
    patch = maker.of_history(shorter, history, None, receiver.token, gaps=[(3, 4)])
    assert patch is not None
    assert patch.get("dropped") == [6]
    caller = [copy.deepcopy(message) for message in history.messages]
    assert receiver.apply(caller, wire(patch)) == shorter
