"""The ``auto`` strategy's decisions, price sheets and the cache ledger, in process."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from ctxwin import proto
from ctxwin.engine import (
    DEFAULT_POLICY,
    DEFAULT_READ_RULES,
    Budgeting,
    TaskState,
    get_dialect,
    plan,
    text_of,
)

Message = dict[str, Any]
WINDOW = 20_000
MODEL = {"id": "m", "context_window": WINDOW}
BUDGET = WINDOW - DEFAULT_POLICY.reserve  # no response reported yet
TS = 1_000


def chars(message: Message) -> int:
    """A stand-in counter: one token per character of text, a call's name and arguments."""
    total = 0
    for block in message.get("content") or []:
        kind = block.get("type")
        if kind == "text":
            total += len(block["text"])
        elif kind == "tool_use":
            total += len(block["name"]) + len(json.dumps(block["input"], separators=(",", ":")))
        elif kind == "tool_result":
            total += sum(len(part.get("text", "")) for part in block["content"])
    return total


def user(text: str) -> Message:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def call(tool_id: str, name: str, arguments: dict[str, Any]) -> Message:
    return {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": tool_id, "name": name, "input": arguments}],
    }


def result(tool_id: str, text: str) -> Message:
    return {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": tool_id,
                "content": [{"type": "text", "text": text}],
            }
        ],
    }


def conversation(
    steps: list[tuple[str, dict[str, Any], int]], task: str = "fix it"
) -> list[Message]:
    """A task, a reply, then one call and its result per step: (tool, arguments, result size)."""
    messages = [user(task), {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
    messages.append(user("go on"))
    for number, (name, arguments, size) in enumerate(steps):
        tool_id = f"call_{number}"
        messages.append(call(tool_id, name, arguments))
        messages.append(result(tool_id, f"{name}:{number}:" + "y" * size))
    return messages


def native() -> TaskState:
    return TaskState(reads=DEFAULT_READ_RULES, dialect=get_dialect("anthropic"))


def auto(pricing: str | None = "anthropic") -> Budgeting:
    sheet = None if pricing is None else proto.PRICE_SHEETS[pricing]
    return Budgeting(chars, strategy="auto", pricing=sheet)


def view_problems(view: list[Message]) -> list[str]:
    """Calls not answered right after, results answering no call of the message before."""
    found = []
    for place, message in enumerate(view):
        blocks = message["content"]
        if message["role"] == "assistant":
            ids = {b["id"] for b in blocks if b["type"] == "tool_use"}
            after = view[place + 1]["content"] if place + 1 < len(view) else []
            answered = {b["tool_use_id"] for b in after if b["type"] == "tool_result"}
            if place + 1 < len(view):
                found += [f"unanswered {i}" for i in ids - answered]
        else:
            before = view[place - 1]["content"] if place else []
            calls = {b["id"] for b in before if b["type"] == "tool_use"}
            found += [
                f"orphan {b['tool_use_id']}"
                for b in blocks
                if b["type"] == "tool_result" and b["tool_use_id"] not in calls
            ]
    return found


def texts(view: list[Message]) -> list[str]:
    return [text_of(block) or "" for message in view for block in message["content"]]


def test_no_edit_while_the_view_fits_and_nothing_pays_back() -> None:
    messages = conversation([("Bash", {"command": f"ls {n}"}, 300) for n in range(12)])
    state = native()
    result = state.prepare_request(messages, None, MODEL, budgeting=auto(), ts=TS)
    assert not state.overlay
    assert state.deleted_range is None
    assert result["messages"] == messages
    assert result["fits"]
    assert "receipts" not in result
    assert result["cache"]["written_tokens"] == sum(map(chars, messages))


def test_a_superseded_read_becomes_the_notice_when_it_pays_back() -> None:
    read = ("Read", {"file_path": "src/a.py"}, 6000)
    messages = conversation([read, read, *[("Bash", {"command": "true"}, 10)] * 30])
    state = native()
    result = state.prepare_request(messages, None, MODEL, budgeting=auto(), ts=TS)
    assert result["fits"]
    first, latest = messages[4]["content"][0], messages[6]["content"][0]
    view: list[Any] = result["messages"]
    assert text_of(view[4]["content"][0]) == state.notices.duplicate_file_read
    assert view[6]["content"][0] == latest  # the latest read is never replaced
    assert first != view[4]["content"][0]
    (receipt,) = result["receipts"]
    assert receipt["kind"] == "supersede"
    assert receipt["index"] == 4
    assert receipt["saved_tokens"] > 5000
    assert receipt["payback_turns"] is not None
    assert receipt["payback_turns"] < 20


def test_a_batch_below_the_minimum_waits_even_when_it_would_pay() -> None:
    read = ("Read", {"file_path": "src/a.py"}, DEFAULT_POLICY.min_batch // 2)
    messages = conversation([read, read, *[("Bash", {"command": "true"}, 10)] * 30])
    state = native()
    # Tokens only: a rewrite costs nothing extra, so only the minimum holds the batch back.
    state.prepare_request(messages, None, MODEL, budgeting=auto("none"), ts=TS)
    assert not state.overlay


def test_old_results_are_masked_with_a_stub_when_the_view_does_not_fit() -> None:
    steps = [("Bash", {"command": f"make test{n}"}, 1500) for n in range(14)]
    messages = conversation(steps)
    assert sum(map(chars, messages)) > BUDGET
    state = native()
    result = state.prepare_request(messages, None, MODEL, budgeting=auto(), ts=TS)
    assert result["fits"]
    assert state.deleted_range is None  # masking was enough: nothing cut
    view: list[Any] = result["messages"]
    old = text_of(view[4]["content"][0]) or ""
    assert old.startswith("[ctxwin] The result of Bash(")
    assert '"make test0"' in old
    assert "(1507 tokens)" in old  # "Bash:0:" and 1500 characters
    # The results of the last calls stay as they are.
    for place in range(len(view) - 2 * DEFAULT_POLICY.keep_calls + 1, len(view), 2):
        assert view[place] == messages[place]
    assert not view_problems(view)
    assert {r["kind"] for r in result["receipts"]} == {"mask"}


def test_the_latest_read_of_a_file_is_never_masked() -> None:
    steps = [("Read", {"file_path": "big.py"}, 3000)]
    steps += [("Bash", {"command": f"make {n}"}, 1500) for n in range(14)]
    messages = conversation(steps)
    state = native()
    state.auto.policy = replace(DEFAULT_POLICY, ceiling=1.0)  # masking alone, nothing cut
    result = state.prepare_request(messages, None, MODEL, budgeting=auto(), ts=TS)
    assert state.deleted_range is None
    assert result["messages"][4] == messages[4]
    view: list[Any] = result["messages"]
    assert text_of(view[6]["content"][0]).startswith("[ctxwin] The result of Bash")  # type: ignore[union-attr]


def test_whole_turns_are_cut_to_the_low_water_mark_when_masking_is_not_enough() -> None:
    messages = [
        user("task " + "t" * 50),
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
    ]
    for number in range(40):
        messages.append(user(f"question {number} " + "q" * 700))
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "a" * 300}]})
    messages.append(user("last"))
    state = native()
    result = state.prepare_request(messages, None, MODEL, budgeting=auto(), ts=TS)
    assert state.deleted_range is not None
    assert result["range_updated"]
    assert result["estimated_tokens"] <= BUDGET * DEFAULT_POLICY.low_water + 400  # plus the notice
    assert result["messages"][-1] == messages[-1]
    # The next turns fit again without another cut.
    grown = [*messages, {"role": "assistant", "content": [{"type": "text", "text": "a" * 300}]}]
    grown.append(user("q" * 700))
    again = state.prepare_request(grown, None, MODEL, budgeting=auto(), ts=TS + 1)
    assert not again["range_updated"]


def test_a_message_larger_than_the_budget_is_shortened_with_a_notice_before_it_is_sent() -> None:
    steps = [("Bash", {"command": "true"}, 10)] * 4 + [("Grep", {"pattern": "x"}, 3 * WINDOW)]
    messages = conversation(steps)
    state = native()
    result = state.prepare_request(messages, None, MODEL, budgeting=auto(), ts=TS)
    assert result["fits"]
    view: list[Any] = result["messages"]
    newest = text_of(view[-1]["content"][0]) or ""
    assert "[ctxwin] This content was shortened to fit the model's context window" in newest
    assert newest.startswith("Grep:4:")  # its head is kept
    assert not view_problems(view)
    assert any(r["kind"] == "shorten" for r in result["receipts"])


def test_rollback_removes_autos_edits() -> None:
    steps = [("Bash", {"command": f"make test{n}"}, 1500) for n in range(14)]
    messages = conversation(steps)
    state = native()
    state.prepare_request(messages, None, MODEL, budgeting=auto(), ts=TS)
    assert state.overlay
    assert state.rollback(TS - 1) > 0
    assert not state.overlay
    assert state.truncated_messages(messages) == messages


def test_the_cline_dialect_masks_after_the_result_header() -> None:
    messages: list[Message] = [
        user("task"),
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
    ]
    for number in range(14):
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "run it"}]})
        messages.append(user(f"[execute_command for 'make {number}'] Result:\n" + "z" * 1500))
    messages.insert(2, user("start"))
    state = TaskState()
    result = state.prepare_request(messages, None, MODEL, budgeting=auto(), ts=TS)
    view: list[Any] = result["messages"]
    masked = text_of(view[4]["content"][0]) or ""
    assert masked.startswith("[execute_command for 'make 0'] Result:\n[ctxwin] The result of ")


def test_ledger_figures_are_exact_on_a_small_conversation() -> None:
    messages = conversation([("Bash", {"command": "ls"}, 100), ("Bash", {"command": "pwd"}, 50)])
    state = native()
    first = messages[:5]
    one = state.prepare_request(first, None, MODEL, budgeting=auto(), ts=TS)
    sizes = [chars(m) for m in messages]
    assert one["cache"]["cached_tokens"] == 0
    assert one["cache"]["written_tokens"] == sum(sizes[:5])
    assert one["cache"]["cost"] == pytest.approx(1.25 * sum(sizes[:5]))
    two = state.prepare_request(messages, None, MODEL, budgeting=auto(), ts=TS + 1)
    assert two["cache"]["cached_tokens"] == sum(sizes[:5])
    assert two["cache"]["written_tokens"] == sum(sizes[5:])
    assert two["cache"]["cost"] == pytest.approx(0.1 * sum(sizes[:5]) + 1.25 * sum(sizes[5:]))
    assert two["cache"]["keep_all_cost"] == pytest.approx(two["cache"]["cost"])
    totals = state.ledger.totals()
    assert totals["requests"] == 2
    assert totals["cached_tokens"] == sum(sizes[:5])
    assert totals["cost"] == pytest.approx(one["cache"]["cost"] + two["cache"]["cost"], abs=0.01)
    # The request's pricing stays with the task.
    assert state.pricing == proto.PRICE_SHEETS["anthropic"]


def test_price_sheets_by_name_multipliers_and_model() -> None:
    assert proto.sheet_from_wire("anthropic-1h").cache_write == 2.0
    custom = proto.sheet_from_wire({"input": 1, "cache_write": 1.5, "cache_read": 0.2})
    assert custom.name == "custom"
    assert custom.cost(10, 100) == pytest.approx(35.0)
    assert proto.sheet_from_wire({"input": 1, "cache_write": 1.25, "cache_read": 0.1}).name == (
        "anthropic"
    )
    assert proto.sheet_for_model({"id": "claude-sonnet-4-5"}) == proto.PRICE_SHEETS["anthropic"]
    assert (
        proto.sheet_for_model({"id": "openai/gpt-4.1-mini"}) == proto.PRICE_SHEETS["openai-gpt-4.1"]
    )
    assert proto.sheet_for_model({"id": "gpt-4o"}) == proto.PRICE_SHEETS["openai-gpt-4o"]
    assert proto.sheet_for_model({"id": "gemini-2.5-pro"}) == proto.PRICE_SHEETS["gemini"]
    assert (
        proto.sheet_for_model({"id": "x", "provider": "deepseek"}) == proto.PRICE_SHEETS["deepseek"]
    )
    assert proto.sheet_for_model({"id": "local-llama"}) is None
    for bad in ("cheap", {"input": 1}, {"input": 1, "cache_write": "2", "cache_read": 0}, 3):
        assert proto.pricing_error(bad) is not None
        with pytest.raises(ValueError, match="pricing"):
            proto.sheet_from_wire(bad)


def test_once_a_view_outgrew_the_budget_later_views_stay_under_the_ceiling() -> None:
    """A long conversation is kept small (cheaper cache reads); before, nothing is cut."""
    messages = [user("task"), {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
    for number in range(60):
        messages.append(user(f"question {number} " + "q" * 700))
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "a" * 300}]})
    state = native()
    state.auto.policy = replace(DEFAULT_POLICY, ceiling_floor=0)  # a small window: no floor
    ceiling = BUDGET * DEFAULT_POLICY.ceiling
    first_over = None
    for end in range(3, len(messages) + 1, 2):
        result = state.prepare_request(messages[:end], None, MODEL, budgeting=auto(), ts=TS + end)
        if first_over is None and state.auto.overflowed:
            first_over = end
        if first_over is not None:
            assert result["estimated_tokens"] <= ceiling
        else:
            assert state.deleted_range is None  # nothing is cut while everything fits
        view: list[Any] = result["messages"]
        assert not view_problems(view)
    assert first_over is not None


def test_plan_keeps_the_sheet_it_names_and_changes_nothing_else() -> None:
    steps = [("Bash", {"command": f"make test{n}"}, 1500) for n in range(14)]
    messages = conversation(steps)
    state = native()
    planned = plan(state, messages, None, MODEL, auto("openai"), ts=TS)
    assert planned["tokens_after"] < planned["tokens_before"]  # it would mask
    assert not state.overlay
    assert state.ledger.requests == 0
    assert state.pricing == proto.PRICE_SHEETS["openai"]
