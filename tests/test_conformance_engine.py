"""Every conformance scenario, run against the engine in-process."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ctxwin.engine import (
    Notices,
    TaskState,
    apply_truncation_notice,
    context_window_info,
    next_truncation_range,
    should_compact,
)
from tests._scenarios import (
    PLACEHOLDER_NOTICES,
    SCENARIO_COUNT,
    Scenario,
    expand_args,
    expected_value,
    load_scenarios,
    normalise_updates,
)

NOTICES = Notices(**PLACEHOLDER_NOTICES)
SCENARIOS = load_scenarios()


def run_op(state: TaskState, op: str, args: dict[str, Any]) -> dict[str, Any]:
    """Run one wire op against the engine the way the daemon maps it."""
    if op == "next_truncation_range":
        return {
            "deleted_range": next_truncation_range(
                args["messages"], args["deleted_range"], args["keep"]
            )
        }
    if op == "should_compact":
        return should_compact(args["usage"], args["model"], args.get("threshold")).wire()
    if op == "context_window_info":
        return context_window_info(args["model"]).wire()
    if "deleted_range" in args:
        state.deleted_range = args["deleted_range"]
    messages = args.get("messages", [])
    if op == "prepare_request":
        return {
            **state.prepare_request(
                messages, args.get("previous_request"), args["model"], args["use_auto_condense"]
            )
        }
    if op == "truncated_messages":
        return {"messages": state.truncated_messages(messages)}
    if op == "optimize_file_reads_in_memory":
        return {**state.optimize_file_reads_in_memory(messages, args["ts"])}
    if op == "rollback":
        return {"removed": state.rollback(args["ts"])}
    if op == "apply_truncation_notice":
        return {"changed": apply_truncation_notice(state, args["ts"], messages)}
    raise AssertionError(f"scenario uses op {op!r} that this runner does not map")


def test_the_scenario_folder_holds_the_expected_scenarios() -> None:
    """The repository's folder is complete, so a copy that lost files cannot pass silently."""
    assert len(SCENARIOS) == SCENARIO_COUNT == 150


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda scenario: scenario.name)
def test_engine_matches_scenario(scenario: Scenario) -> None:
    """Each step's result and overlay equal the recorded ones, and inputs are never mutated."""
    state = TaskState.load(scenario.initial_updates, None, NOTICES)
    for number, step in enumerate(scenario.steps):
        args = expand_args(step["args"], scenario.conversation)
        pristine = copy.deepcopy(args)
        result = run_op(state, step["op"], args)
        assert args == pristine, f"step {number} mutated its input"
        for key, expected in step["expect"].items():
            want, got = expected_value(expected, result[key])
            assert want == got, f"step {number} ({step['op']}): {key}"
        if "expect_updates" in step:
            assert normalise_updates(step["expect_updates"]) == normalise_updates(
                state.dump_updates()
            ), f"step {number} ({step['op']}): overlay"


@pytest.mark.parametrize(
    "scenario",
    [scenario for scenario in SCENARIOS if scenario.initial_updates],
    ids=lambda scenario: scenario.name,
)
def test_stored_overlays_round_trip(scenario: Scenario) -> None:
    """Loading a stored context_history.json and dumping it gives the same JSON values."""
    state = TaskState.load(copy.deepcopy(scenario.initial_updates), None, NOTICES)
    assert scenario.initial_updates == state.dump_updates()
