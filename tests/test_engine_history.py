"""The daemon-side history for delta sync, and views sent as patches."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxwin.engine import (
    DIALECTS,
    History,
    Notices,
    Overlay,
    ResyncRequired,
    TaskState,
    truncated_messages,
    view_patch,
)
from ctxwin.engine._view import ViewCache, find_repairs
from ctxwin.proto import DigestChain, apply_view_patch
from tests._scenarios import PLACEHOLDER_NOTICES, expand_args, load_scenarios
from tests._strategies import apply, conversations, operations, run_all


def messages(count: int, tag: str = "") -> list[dict[str, Any]]:
    return [
        {"role": "user" if index % 2 == 0 else "assistant", "content": f"{tag}{index}"}
        for index in range(count)
    ]


def test_a_delta_on_the_right_prefix_extends_the_history() -> None:
    """base + base_digest + append gives the same history and digest as the whole list."""
    full = messages(6)
    history = History(full[:4])
    history.apply(4, DigestChain(full[:4]).digest(4), full[4:])
    assert full == history.messages
    assert DigestChain(full).digest(6) == history.digest


def test_a_delta_may_drop_trailing_messages() -> None:
    """A caller that cut its last messages (a resumed task) sends a shorter base."""
    history = History(messages(6))
    replacement = messages(1, "new")
    history.apply(3, DigestChain(messages(3)).digest(3), replacement)
    assert [*messages(3), *replacement] == history.messages


@pytest.mark.parametrize(("base", "digest_of"), [(4, 3), (7, 6), (2, 2)])
def test_a_delta_on_another_prefix_requires_a_resync(base: int, digest_of: int) -> None:
    """A wrong digest, a base past the end, or a changed message all answer resync_required."""
    history = History(messages(6))
    digest = DigestChain(messages(6, "x" if base == 2 else "")).digest(digest_of)
    with pytest.raises(ResyncRequired):
        history.apply(base, digest, [])
    assert messages(6) == history.messages


class RecordingCount:
    """A token count (a message's content length) that records what it counted."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, message: dict[str, Any]) -> int:
        self.seen.append(message["content"])
        return len(message["content"])


def test_token_counts_are_cached_until_the_message_changes() -> None:
    """A turn counts only its new messages; a rewritten message is counted again."""
    count = RecordingCount()
    counted = count.seen
    history = History(messages(4))
    assert [1, 1, 1, 1] == [history.tokens(index, count) for index in range(4)]
    history.apply(4, history.digest, messages(6)[4:])
    total = sum(history.tokens(index, count) for index in range(6))
    assert (6, ["0", "1", "2", "3", "4", "5"]) == (total, counted)
    history.replace([*messages(3), {"role": "assistant", "content": "rewritten"}])
    assert 9 == history.tokens(3, count)
    assert "rewritten" == counted[-1]
    assert 7 == len(counted)


def test_view_copies_are_counted_once_per_object() -> None:
    """The counter counts history messages by index and a view's copies once each."""
    count = RecordingCount()
    counted = count.seen
    history = History(messages(3))
    copy = {"role": "user", "content": "an overlaid copy"}
    counter = history.counter(count)
    assert [1, 1, 1, 16, 16] == [counter(m) for m in [*history.messages, copy, copy]]
    assert ["0", "1", "2", "an overlaid copy"] == counted
    equal = dict(copy)  # another object: counted on its own
    assert 16 == history.counter(count)(equal)
    history.apply(1, history.digest_of(1), [{"role": "assistant", "content": "new"}])
    assert [1, 3] == [history.counter(count)(m) for m in history.messages]
    assert ["an overlaid copy", "new"] == counted[-2:]


def test_an_untouched_view_is_a_patch_without_overrides() -> None:
    """With no overlay and no repair the view costs no message bytes."""
    history = History(messages(10))
    state = TaskState()
    state.deleted_range = [2, 5]
    view = state.truncated_messages(history.messages)
    patch = view_patch(view, history.messages, state.deleted_range)
    assert {"length": 10, "keep_from": 6, "overrides": []} == patch
    assert view == apply_view_patch(history.messages, patch)


def test_patches_rebuild_every_conformance_view_exactly() -> None:
    """For every view in the scenarios, rebuilding from the patch gives the same messages."""
    checked = 0
    for scenario in load_scenarios():
        state = TaskState.load(scenario.initial_updates, None, Notices(**PLACEHOLDER_NOTICES))
        for step in scenario.steps:
            if step["op"] not in ("truncated_messages", "prepare_request"):
                continue
            args = expand_args(step["args"], scenario.conversation)
            state.deleted_range = args["deleted_range"]
            history = args["messages"]
            if step["op"] == "prepare_request":
                view: list[Any] = state.prepare_request(
                    history, args["previous_request"], args["model"], args["use_auto_condense"]
                )["messages"]
            else:
                view = state.truncated_messages(history)
            patch = view_patch(view, history, state.deleted_range)
            assert view == apply_view_patch(history, patch)
            assert len(patch["overrides"]) <= len(view)
            checked += 1
    assert checked > 1000


def test_a_patch_for_another_history_is_refused() -> None:
    """apply_view_patch checks the length and the indices it overrides."""
    with pytest.raises(ValueError, match="does not match"):
        apply_view_patch(messages(3), {"length": 4, "keep_from": 2, "overrides": []})
    with pytest.raises(ValueError, match="not in the view"):
        apply_view_patch(messages(6), {"length": 6, "keep_from": 4, "overrides": [[3, {}]]})


def test_a_view_cache_serves_only_its_own_history_and_dialect() -> None:
    """A cache passed with another list, or kept under the other ``strict``, is refused; a
    native dialect's history keeps none (its views are built from the internal form)."""
    history = History(messages(6))
    assert history.cache is not None
    with pytest.raises(ValueError, match="not one of this history"):
        truncated_messages(list(history.messages), None, Overlay(), cache=history.cache)
    with pytest.raises(ValueError, match="not one of this history"):
        truncated_messages(history.messages, None, Overlay(), strict=True, cache=history.cache)
    view = truncated_messages(history.messages, None, Overlay(), cache=history.cache)
    assert view == truncated_messages(list(history.messages), None, Overlay())
    history.use_dialect(DIALECTS["anthropic"])
    assert history.cache is None


def test_known_pairs_give_the_same_views_on_every_conformance_step() -> None:
    """The incremental view (pairs known in advance) equals the full scan on every scenario."""
    for scenario in load_scenarios():
        state = TaskState.load(scenario.initial_updates, None, Notices(**PLACEHOLDER_NOTICES))
        history = History()
        for step in scenario.steps:
            args = expand_args(step["args"], scenario.conversation)
            if "deleted_range" in args and step["op"] != "next_truncation_range":
                state.deleted_range = args["deleted_range"]
            if step["op"] == "rollback":
                state.rollback(args["ts"])
            if "messages" not in args or step["op"] == "next_truncation_range":
                continue
            history.replace(args["messages"])
            assert history.cache is not None
            assert find_repairs(args["messages"]) == history.cache.repairs
            state.cache = history.cache
            assert state.truncated_messages(args["messages"]) == state.truncated_messages(
                history.messages
            )
            if step["op"] == "optimize_file_reads_in_memory":
                state.optimize_file_reads_in_memory(history.messages, args["ts"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), operations, st.lists(st.integers(0, 24), max_size=6))
def test_incremental_history_matches_the_full_engine(
    messages: list[dict[str, Any]], ops: list[tuple[str, Any]], cuts: list[int]
) -> None:
    """A history grown by deltas (with trailing drops) gives the same views as a fresh list."""
    history = History()
    for cut in [*cuts, len(messages)]:
        prefix = messages[: min(cut, len(messages))]
        common = 0
        while (
            common < min(len(prefix), len(history)) and history.messages[common] is prefix[common]
        ):
            common += 1
        history.apply(common, DigestChain(prefix).digest(common), prefix[common:])
        assert history.cache is not None
        assert find_repairs(prefix) == history.cache.repairs
    assert messages == list(history.messages)
    state = run_all(messages, ops)
    state.cache = history.cache
    assert state.truncated_messages(messages) == state.truncated_messages(history.messages)
    view = state.truncated_messages(history.messages)
    patch = view_patch(view, history.messages, state.deleted_range)
    assert view == apply_view_patch(messages, patch)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    conversations(),
    operations,
    st.lists(st.integers(0, 24), min_size=1, max_size=8),
    st.lists(st.integers(0, 24), max_size=4),
)
def test_reused_views_match_fresh_ones_turn_by_turn(
    messages: list[dict[str, Any]],
    ops: list[tuple[str, Any]],
    cuts: list[int],
    ranges: list[int],
) -> None:
    """Views built on the last one (after appends, cut backs, edits, moves) equal fresh ones."""
    history = History()
    state = TaskState()  # operations on plain lists: everything parsed afresh
    cached = TaskState()  # the same operations on the kept history: parsed once
    cached.cache = history.cache
    for turn, cut in enumerate([*cuts, len(messages)]):
        prefix = messages[: min(cut, len(messages))]
        history.replace(prefix)
        if ops:
            op, ts = ops[turn % len(ops)], (turn + 1) * 1000
            apply(state, list(history.messages), op, ts)
            apply(cached, history.messages, op, ts)
            assert state.dump_updates() == cached.dump_updates(), f"turn {turn} overlay"
            assert state.deleted_range == cached.deleted_range, f"turn {turn} range"
        # An optimisation now (on copies) reports the same savings either way.
        plain_run = state.clone().optimize_file_reads(list(history.messages), 10**9)
        assert plain_run == cached.clone().optimize_file_reads(history.messages, 10**9)
        if ranges and turn % 2:
            end = ranges[turn % len(ranges)]
            state.deleted_range = cached.deleted_range = [2, end] if end >= 2 else None
        for _ in range(2):  # the second view comes from the cache untouched
            fresh = state.truncated_messages(list(history.messages))
            assert fresh == cached.truncated_messages(history.messages), f"turn {turn}"


def test_a_deleted_set_reaching_the_newest_message_changes_the_cached_view() -> None:
    """A drop that reaches the history's end (its last kept run then ends before it) is not
    served the view cached before it: the view built on the cache equals a fresh one."""
    history = History(messages(6))
    cached = TaskState()
    cached.cache = history.cache
    state = TaskState()
    assert cached.truncated_messages(history.messages) == history.messages
    for each in (state, cached):
        each.drop([(3, 5)], 1000)
    fresh = state.truncated_messages(list(history.messages))
    assert [message["content"] for message in fresh] == ["0", "1", "2"]
    assert cached.truncated_messages(history.messages) == fresh


def _ordered_view_by_steps(history: list[Any], patch: dict[str, Any]) -> list[Any] | None:
    """An ordered patch applied one history index at a time (None where it must be refused)."""
    replaced = dict(patch["overrides"])
    view: list[Any] = []
    used = 0
    covered: set[int] = set()
    for start, end in patch["order"]:
        if not 0 <= start <= end <= len(history) or covered.intersection(range(start, end)):
            return None  # outside the history, or overlapping another run
        covered.update(range(start, end))
        for index in range(start, end):
            if index in replaced:
                used += 1
                value = replaced[index]
                view.extend(value) if isinstance(value, list) else view.append(value)
            else:
                view.append(history[index])
    return view if used == len(replaced) else None


@given(
    st.integers(0, 12).flatmap(
        lambda length: st.tuples(
            st.just(length),
            st.lists(st.tuples(st.integers(-1, length + 1), st.integers(0, 3)), max_size=4),
            st.dictionaries(
                st.integers(-1, length + 1),
                st.one_of(
                    st.just({"role": "user", "content": "new"}),
                    st.just([]),
                    st.just([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]),
                ),
                max_size=4,
            ),
        )
    )
)
def test_an_ordered_patch_rebuilds_the_view_its_runs_and_overrides_name(
    case: tuple[int, list[tuple[int, int]], dict[int, Any]],
) -> None:
    """A dialect patch (``order`` runs) gives the view its runs name index by index, and is
    refused exactly when a run leaves the history or overlaps another, or an override is
    not in the view."""
    length, runs, overrides = case
    history = messages(length)
    order = [[start, start + size] for start, size in runs]
    patch = {
        "length": length,
        "keep_from": 0,
        "order": order,
        "overrides": list(map(list, overrides.items())),
    }
    expected = _ordered_view_by_steps(history, patch)
    if expected is None:
        with pytest.raises(ValueError):
            apply_view_patch(history, patch)
    else:
        assert apply_view_patch(history, patch) == expected


def _strict_turns() -> list[dict[str, Any]]:
    """A call whose result comes late, after a message that answers nothing."""
    return [
        {"role": "user", "content": [{"type": "text", "text": "task"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "reading"},
                {"type": "tool_use", "id": "a", "name": "read", "input": {}},
            ],
        },
        {"role": "user", "content": [{"type": "text", "text": "meanwhile"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "waiting"}]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "a", "content": "late"}],
        },
    ]


@pytest.mark.parametrize("cut_back", [True, False])
def test_a_cached_strict_view_takes_a_late_result_as_the_history_changes(cut_back: bool) -> None:
    """Under a strict dialect a repair takes a call's result from a later message: the cached
    view drops it when that message is cut, and takes it when it is appended, as a view
    built afresh does."""
    full = _strict_turns()
    messages = full if cut_back else full[:4]
    cache = ViewCache(messages, True)
    overlay = Overlay()
    truncated_messages(messages, None, overlay, strict=True, cache=cache)
    if cut_back:
        del messages[4:]
        cache.changed_from(4)
    else:
        messages.append(full[4])
        cache.changed_from(4)
    cache.repairs[:] = find_repairs(messages, 0, True)
    view = truncated_messages(messages, None, overlay, strict=True, cache=cache)
    assert view == truncated_messages(list(messages), None, overlay, strict=True)
    late = view[2]["content"][0]
    assert (late["content"] == "late") is not cut_back
