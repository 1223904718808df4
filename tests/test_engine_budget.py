"""Opt-in token budgeting: estimates, fit cuts, plans, oversized and stalled reports."""

from __future__ import annotations

import json
from typing import Any, get_args

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ctxwin import proto
from ctxwin.engine import (
    STRATEGIES,
    Budgeting,
    Calibration,
    Strategy,
    TaskState,
    context_window_info,
    next_truncation_range,
    plan,
)

MODEL = {"id": "m", "context_window": 64_000}  # max_allowed_size 37000
LIMIT = context_window_info(MODEL).max_allowed_size


def by_length(message: dict[str, Any]) -> int:
    """A stand-in counter: one token per character of the JSON form."""
    return len(json.dumps(message))


def conversation(sizes: list[int]) -> list[dict[str, Any]]:
    """Alternating messages whose JSON size is roughly the given token counts."""
    return [
        {
            "role": "user" if index % 2 == 0 else "assistant",
            "content": [{"type": "text", "text": "x" * size}],
        }
        for index, size in enumerate(sizes)
    ]


def fits(state: TaskState, messages: list[dict[str, Any]], budget: float, scale: float) -> bool:
    return sum(map(by_length, state.truncated_messages(messages))) * scale <= budget


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(10, 9000), min_size=6, max_size=60), st.integers(0, 80_000))
# Over the target by a third of a token once calibrated: per-message rounding let it pass.
@example([133, 10, 10, 10, 10, 8604, *[10] * 8, 8049, 9000], 6789)
def test_fit_removes_no_more_turns_than_half_and_fits(sizes: list[int], extra: int) -> None:
    """Where half's result fits the target, fit cuts no more and its result fits too.

    Both measured as fit measures: estimates sized up to the reported usage
    when the report is the larger (bounded at 4x).
    """
    messages = conversation(sizes)
    budgeting = Budgeting(by_length, strategy="fit")
    previous = {"ts": 1, "tokens_in": LIMIT + extra}
    estimate = sum(map(by_length, messages))
    scale = min(max(previous["tokens_in"] / estimate, 1.0), 4.0)
    fit_state = TaskState()
    fit_result = fit_state.prepare_request(messages, previous, MODEL, budgeting=budgeting)
    half_state = TaskState()
    half_state.prepare_request(messages, previous, MODEL)
    keep = "quarter" if previous["tokens_in"] / 2 > LIMIT else "half"
    half_range = next_truncation_range(messages, None, keep)
    assert half_range == half_state.deleted_range
    target = LIMIT * budgeting.target
    if fits(half_state, messages, target, scale):
        fit_end = fit_result["deleted_range"][1] if fit_result["deleted_range"] else 1
        assert fit_end <= half_range[1]
        assert fits(fit_state, messages, target, scale)
    assert fit_result["fits"] == ((fit_result["estimated_tokens"] or 0) <= LIMIT)


def test_plan_changes_nothing() -> None:
    """plan reports a cut and the reads it would replace; overlay and range stay as they were."""
    read = {"type": "text", "text": "[read_file for 'a.py'] Result:\n" + "y" * 5000}
    messages = [
        *conversation([100, 100]),
        {"role": "user", "content": [read]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [read]},
        *conversation([30000, 30000, 100, 100]),
    ]
    state = TaskState()
    state.deleted_range = None
    before = (json.dumps(state.dump_updates()), state.deleted_range, state.revision)
    planned = plan(state, messages, {"ts": 5, "tokens_in": 50_000}, MODEL, Budgeting(by_length))
    assert (json.dumps(state.dump_updates()), state.deleted_range, state.revision) == before
    assert planned["range_updated"]
    assert [{"index": 2, "block": 0, "edit_type": 2, "paths": ["a.py"]}] == planned["file_reads"]
    assert planned["tokens_after"] < planned["tokens_before"]
    assert LIMIT == planned["budget"]


def test_one_oversized_message_is_named_instead_of_cut_again_and_again() -> None:
    """When even the first pair and the newest turn cannot fit, fits is false with the culprit."""
    messages = conversation([100, 100, 500, 500, 100, 60_000])
    state = TaskState()
    budgeting = Budgeting(by_length, strategy="fit")
    first = state.prepare_request(messages, {"ts": 1, "tokens_in": 60_000}, MODEL, False, budgeting)
    assert first["fits"] is False
    assert first["largest"] is not None
    assert 5 == first["largest"][0][0]
    again = state.prepare_request(messages, {"ts": 2, "tokens_in": 60_000}, MODEL, False, budgeting)
    assert again["stalled"]
    assert first["deleted_range"] == again["deleted_range"]


def test_a_compaction_that_cannot_shrink_the_view_is_reported_stalled() -> None:
    """Default strategy: once nothing is left to remove, the result says stalled."""
    messages = conversation([10] * 8)
    state = TaskState()
    usage = {"ts": 1, "tokens_in": 40_000}
    results = [state.prepare_request(messages, usage, MODEL) for _ in range(3)]
    assert [[2, 3], [2, 5], [2, 5]] == [result["deleted_range"] for result in results]
    assert [False, False, True] == [result["stalled"] for result in results]


def test_proactive_mode_compacts_before_the_first_request() -> None:
    """With no previous usage, an estimate over the limit compacts before sending."""
    messages = conversation([100, 100] + [5000] * 12)
    state = TaskState()
    idle = state.prepare_request(messages, None, MODEL, False, Budgeting(by_length), ts=9)
    assert (idle["range_updated"], idle["deleted_range"]) == (False, None)
    result = state.prepare_request(
        messages, None, MODEL, False, Budgeting(by_length, proactive=True), ts=9
    )
    assert result["range_updated"]
    assert result["fits"]


def test_default_behaviour_adds_no_estimate() -> None:
    """Without budgeting, results carry no estimate fields."""
    wire = TaskState().prepare_request(conversation([5, 5, 5]), None, MODEL)
    assert {"deleted_range", "range_updated", "messages", "stalled"} == set(wire)


def test_calibration_converges_on_a_fixed_multiple() -> None:
    """Reports that are always 1.37x the estimate bring the ratio within 5% in 10 reports."""
    calibration = Calibration()
    for estimate in [1000, 5000, 20_000, 800, 12_000, 3000, 9000, 15_000, 400, 7000]:
        calibration.update(round(estimate * 1.37), estimate)
    assert abs(calibration.ratio - 1.37) / 1.37 < 0.05


def test_calibration_ignores_unusable_reports_and_stays_bounded() -> None:
    """Zero counts change nothing; absurd ratios are clamped."""
    calibration = Calibration()
    assert 1.0 == calibration.update(0, 100)
    assert 4.0 == calibration.update(10_000, 1)


def test_every_strategy_the_wire_accepts_has_one_object() -> None:
    """prepare_request picks one object per strategy name: the names proto accepts and the
    engine's type spell the same set."""
    assert set(proto.STRATEGY_VALUES) == set(STRATEGIES)
    assert set(get_args(Strategy)) == set(STRATEGIES)
    assert len({id(strategy) for strategy in STRATEGIES.values()}) == len(STRATEGIES)
