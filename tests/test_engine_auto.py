"""The ``auto`` strategy's decisions, price sheets and the cache ledger, in process."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from typing import Any

import pytest

from ctxwin import proto
from ctxwin.engine import (
    DEFAULT_POLICY,
    DEFAULT_READ_RULES,
    AutoPolicy,
    Budgeting,
    TaskState,
    get_dialect,
    plan,
    text_of,
)
from ctxwin.engine._auto import AutoMemory, _Turn
from ctxwin.engine._auto_edits import Planner
from tests._messages import call, result, user

Message = dict[str, Any]
WINDOW = 20_000
MODEL = {"id": "m", "context_window": WINDOW}
BUDGET = WINDOW - DEFAULT_POLICY.reserve  # no response reported yet
TS = 1_000
UNGOVERNED = replace(DEFAULT_POLICY, governor=0.0)
"""Masks whatever the share of cache hits so far (short conversations start low)."""


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


def native(policy: AutoPolicy = DEFAULT_POLICY) -> TaskState:
    """A task state of the Anthropic dialect whose ``auto`` follows ``policy``."""
    state = TaskState(reads=DEFAULT_READ_RULES, dialect=get_dialect("anthropic"))
    state.auto.policy = policy
    return state


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


def turn_by_turn(
    state: TaskState, messages: list[Message], budgeting: Budgeting, first: int = 3
) -> list[tuple[list[Message], Any]]:
    """Each request of the conversation (the history up to each user message from ``first``
    on), in order: (history sent, result)."""
    out: list[tuple[list[Message], Any]] = []
    for end in range(first, len(messages) + 1):
        if messages[end - 1]["role"] != "user":
            continue
        sent = messages[:end]
        result = state.prepare_request(sent, None, MODEL, budgeting=budgeting, ts=TS + end)
        out.append((sent, result))
    return out


def test_the_rolling_mask_stubs_the_turn_that_just_left_and_keeps_the_prefix() -> None:
    """Each result is sent whole once, then stubbed right before the new messages: what the
    last view held before it is sent again unchanged (read from the cache)."""
    steps = [("Bash", {"command": f"make test{n}"}, 3000) for n in range(6)]
    messages = conversation(steps)
    state = native()
    replies = turn_by_turn(state, messages, auto(), first=5)
    for (before, last), (sent, now) in itertools.pairwise(replies):
        previous: list[Any] = last["messages"]
        view: list[Any] = now["messages"]
        edited = len(before) - 1  # the result the last request ended with
        assert view[:edited] == previous[:edited]  # the cached prefix stands
        stub = text_of(view[edited]["content"][0]) or ""
        assert stub.startswith("[ctxwin] The result of Bash(")
        assert f'"make test{(edited - 4) // 2}"' in stub
        assert "(3007 tokens)" in stub  # "Bash:n:" and 3000 characters
        assert view[edited + 1 :] == sent[edited + 1 :]  # the new messages as they are
        assert {r["kind"] for r in now["receipts"]} == {"mask"}
        assert not view_problems(view)
    # Every result was sent whole in exactly one view.
    for number in range(6):
        body = f"Bash:{number}:" + "y" * 3000
        assert sum(body in texts(r["messages"]) for _, r in replies) == 1


def test_a_mask_only_edits_the_message_the_last_request_ended_with() -> None:
    """Each mask edits only the message the last request ended with, so nothing behind it is
    written again, and every result but the newest is masked in its turn."""
    steps = [("Bash", {"command": f"make test{n}"}, 3000) for n in range(40)]
    messages = conversation(steps)
    state = native()
    wide = {"id": "m", "context_window": 1_000_000}
    previous = 0
    masked = []
    for end in range(5, len(messages) + 1, 2):
        result = state.prepare_request(messages[:end], None, wide, budgeting=auto(), ts=TS + end)
        for receipt in result.get("receipts", ()):
            if receipt["kind"] == "mask":
                assert receipt["index"] == previous - 1
                masked.append(receipt["index"])
        previous = end
    assert masked == list(range(4, len(messages) - 1, 2))


def test_a_result_its_stub_does_not_pay_for_is_not_masked() -> None:
    """A stub written at the write price must cost less than reading the result it replaces."""
    steps = [("Bash", {"command": f"ls {n}"}, 300) for n in range(8)]
    messages = conversation(steps)
    state = native(replace(UNGOVERNED, rent_multiple=1e9))  # no rebuild: masks alone
    turn_by_turn(state, messages, auto())
    assert not state.overlay
    assert not state.dropped


def test_masks_are_not_held_back_by_the_governor() -> None:
    """A mask pays back by the next request on its own (it writes only the stub right before
    the new messages), so it is made even while the task's cache-hit rate is under the
    governor; the governor holds back rebuilds alone."""
    steps = [("Bash", {"command": f"make test{n}"}, 3000) for n in range(4)]
    messages = conversation(steps)
    state = native(replace(DEFAULT_POLICY, governor=1.0))  # no rate is ever enough
    turn_by_turn(state, messages, auto())
    assert state.overlay
    assert not state.dropped


def test_a_view_that_does_not_fit_is_rebuilt_to_the_head_the_ledger_the_pins_and_the_tail() -> None:
    steps = [("Read", {"file_path": "big.py"}, 2000)]
    steps += [("Bash", {"command": f"make test{n}"}, 1500) for n in range(14)]
    messages = conversation(steps, task="fix the build, keep the tests green")
    assert sum(map(chars, messages)) > BUDGET
    state = native()
    result = state.prepare_request(messages, None, MODEL, budgeting=auto(), ts=TS)
    assert result["fits"]
    assert result["range_updated"]
    assert state.deleted_range is None  # the first pair and its answer stay
    assert state.dropped
    view: list[Any] = result["messages"]
    assert view[:2] == messages[:2]
    ledger = texts(view)[2]  # the ledger joins message 2
    assert ledger.startswith(proto.SUMMARY_MARK)
    assert "fix the build, keep the tests green" in texts(view)  # the task, in place
    assert messages[4] in view  # the latest read of big.py is pinned
    tail = DEFAULT_POLICY.tail_turns * 2
    assert view[-tail:] == messages[-tail:]
    assert not view_problems(view)
    assert {r["kind"] for r in result["receipts"]} == {"rebuild"}


def test_pinned_latest_reads_survive_every_rebuild() -> None:
    steps = [("Read", {"file_path": "big.py"}, 1800), ("Read", {"file_path": "old.py"}, 500)]
    steps += [("Bash", {"command": f"make {n}"}, 1500) for n in range(30)]
    steps.insert(5, ("Read", {"file_path": "old.py"}, 600))  # supersedes the first read
    messages = conversation(steps)
    state = native()
    replies = turn_by_turn(state, messages, auto())
    rebuilds = [r for _, r in replies if any(x["kind"] == "rebuild" for x in r.get("receipts", ()))]
    assert len(rebuilds) >= 2
    big = "Read:0:" + "y" * 1800
    newer = "Read:5:" + "y" * 600
    for sent, answer in replies:
        view: list[Any] = answer["messages"]
        assert answer["estimated_tokens"] <= BUDGET
        if len(sent) > 4:
            assert big in texts(view)  # whole, wherever its turn stands
        if len(sent) > 16:
            assert newer in texts(view)
        assert not view_problems(view)
    assert "Read:1:" + "y" * 500 not in texts(replies[-1][1]["messages"])  # superseded: gone


def test_pins_keep_the_most_files_that_fit_smallest_first() -> None:
    """When the pin share cannot hold every file's latest read, a rebuild keeps the smaller
    files' reads (as many files as fit), not the newest large one."""
    share = DEFAULT_POLICY.pin_share * BUDGET
    small = int(share // 4)
    large = int(share * 0.8)
    steps = [("Read", {"file_path": f"small{n}.py"}, small) for n in range(3)]
    steps.append(("Read", {"file_path": "large.py"}, large))  # the newest read
    steps += [("Bash", {"command": f"make {n}"}, 1500) for n in range(14)]
    messages = conversation(steps)
    state = native()
    turn_by_turn(state, messages, auto())
    assert state.dropped
    answer = state.prepare_request(messages, None, MODEL, budgeting=auto(), ts=TS + 99)
    view: list[Any] = answer["messages"]
    kept = texts(view)
    for n in range(3):
        assert f"Read:{n}:" + "y" * small in kept
    assert "Read:3:" + "y" * large not in kept


BIG = {"id": "m", "context_window": 1_000_000}
"""A window no test conversation fills: every edit made under it is voluntary."""


def questions(count: int, size: int) -> list[Message]:
    """A task, then ``count`` questions of ``size`` characters each answered with text, then
    one last question (no tool calls: turns of text alone)."""
    messages = [user("task"), {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
    for number in range(count):
        messages.append(user(f"question {number} " + "q" * size))
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "a" * 100}]})
    messages.append(user("last"))
    return messages


def test_the_governor_counts_new_messages_as_the_provider_does() -> None:
    """The governor's share is cache reads over every input token, new messages included:
    where each turn brings much new text a voluntary rebuild that would take that share
    under the governor waits, while one that the share leaves room for goes through."""
    memory = AutoMemory(seen_input=9_000, seen_cached=8_000, last_tokens=1_000)
    assert memory.share_with(1_000, 2_000) == 9_000 / 12_000
    messages = questions(40, 400)
    eager = replace(DEFAULT_POLICY, rent_multiple=0.05)  # the rent rule alone: soon due
    ungoverned = native(replace(eager, governor=0.0))
    governed = native(replace(eager, governor=0.97))
    for end in range(3, len(messages) + 1, 2):
        for state in (ungoverned, governed):
            state.prepare_request(messages[:end], None, BIG, budgeting=auto(), ts=end)
    assert ungoverned.dropped  # due by the rent rule
    assert not governed.dropped  # each turn's new text keeps the provider's rate low


def test_a_rebuild_waits_for_the_rent_to_reach_its_rewrite_cost() -> None:
    """Views that fit are rebuilt when what not rebuilding cost (the cached reads of what a
    rebuild drops) reaches what the rebuild writes again, not before, and never without rent."""
    messages = questions(60, 150)
    sheet = proto.PRICE_SHEETS["anthropic"]
    price = sheet.cache_write - sheet.cache_read

    def replay(state: TaskState) -> list[tuple[float, float, Any]]:
        """Each turn: the rent before it, what a rebuild would write again after it (the
        view the turn sent, as the rule saw it when it made no edit; infinite when it
        would drop nothing), and the result."""
        out: list[tuple[float, float, Any]] = []
        for end in range(3, len(messages) + 1, 2):
            rent = state.auto.rent
            sent = messages[:end]
            result = state.prepare_request(sent, None, BIG, budgeting=auto(), ts=end)
            planner = Planner(state, sent, auto(), sheet, state.auto.policy, end)
            plan = _Turn(planner, state.auto.budget(BIG)).plan()
            out.append((rent, plan.rewritten if plan.dropped_tokens else math.inf, result))
        return out

    never = native(replace(UNGOVERNED, rent_multiple=1e9))
    assert not any("receipts" in result for _, _, result in replay(never))
    assert not never.dropped
    state = native(UNGOVERNED)  # the rule alone decides
    steps = replay(state)
    rebuilt = [n for n, (_, _, r) in enumerate(steps) if r.get("receipts")]
    assert rebuilt
    for n, (_, rewrite, answer) in enumerate(steps):
        if n in rebuilt:
            rent = steps[n][0]
            (receipt,) = answer["receipts"]
            assert receipt["kind"] == "rebuild"
            owed = rent + sheet.cache_read * receipt["saved_tokens"]
            assert owed >= price * receipt["rewrite_tokens"]
            assert n - 1 not in rebuilt
        else:
            # No rebuild: the rent after this turn is below what a rebuild would write again.
            after = steps[n + 1][0] if n + 1 < len(steps) else state.auto.rent
            assert after < price * rewrite, n
    assert state.summary is not None


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
    steps = [("Bash", {"command": f"make test{n}"}, 3000) for n in range(40)]
    messages = conversation(steps)
    state = native(UNGOVERNED)
    turn_by_turn(state, messages, auto())
    assert state.overlay
    assert state.dropped
    assert state.summaries
    assert state.rollback(TS - 1) > 0
    assert not state.overlay
    assert not state.dropped
    assert not state.summaries
    assert state.truncated_messages(messages) == messages


def first_result_masked(messages: list[Message]) -> str:
    """A Cline conversation sent turn by turn under ungoverned ``auto``: the text of its first
    result (message 4) in the last view."""
    state = TaskState()
    state.auto.policy = UNGOVERNED
    view: list[Any] = turn_by_turn(state, messages, auto())[-1][1]["messages"]
    return text_of(view[4]["content"][0]) or ""


def test_the_cline_dialect_masks_after_the_result_header() -> None:
    messages: list[Message] = [
        user("task"),
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        user("start"),
    ]
    for number in range(6):
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "run it"}]})
        messages.append(user(f"[execute_command for 'make {number}'] Result:\n" + "z" * 3000))
    masked = first_result_masked(messages)
    assert masked.startswith("[execute_command for 'make 0'] Result:\n[ctxwin] The result of ")


def test_a_cline_stub_keeps_what_a_person_typed_in_the_result() -> None:
    """A masked Cline result that holds an answer a person typed keeps that answer, tags and
    all, after the stub: masking never hides an instruction (docs/COST.md)."""
    messages: list[Message] = [
        user("<task>\nbuild it\n</task>"),
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        user("start"),
    ]
    for number in range(6):
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "ask"}]})
        answer = f"<answer>\nuse port {number}\n</answer>"
        body = f"[ask_followup_question for 'port?'] Result:\n{'z' * 3000}\n{answer}"
        messages.append(user(body))
    masked = first_result_masked(messages)
    assert "[ctxwin] The result of " in masked
    assert "z" * 100 not in masked
    assert masked.endswith("<answer>\nuse port 0\n</answer>")


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


def test_every_view_fits_and_carries_the_ledger_which_changes_only_at_a_rebuild() -> None:
    """Turn by turn past the window: each view fits and is valid; from the first rebuild on,
    the ledger follows the first pair and stays the same text until the next rebuild."""
    messages = [user("task"), {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
    for number in range(25):
        messages.append(user(f"question {number}."))
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "a" * 1200}]})
    state = native()
    ledger = None
    for end in range(3, len(messages) + 1, 2):
        result = state.prepare_request(messages[:end], None, MODEL, budgeting=auto(), ts=TS + end)
        assert result["fits"]
        view: list[Any] = result["messages"]
        assert not view_problems(view)
        rebuilt = any(r["kind"] == "rebuild" for r in result.get("receipts", ()))
        carried = texts(view[2:3])[0] if ledger is not None or rebuilt else None
        if rebuilt:
            assert carried is not None
            assert carried.startswith(proto.SUMMARY_MARK)
            ledger = carried
        elif ledger is not None:
            assert carried == ledger
        # Every question asked so far is in the view, in place or in the ledger.
        sent = "\n".join(texts(view))
        assert all(f"question {n}." in sent for n in range((end - 1) // 2))
    assert ledger is not None


def test_plan_keeps_the_sheet_it_names_and_changes_nothing_else() -> None:
    steps = [("Bash", {"command": f"make test{n}"}, 1500) for n in range(14)]
    messages = conversation(steps)
    state = native()
    planned = plan(state, messages, None, MODEL, auto("openai"), ts=TS)
    assert planned["tokens_after"] < planned["tokens_before"]  # it would rebuild
    assert not state.dropped
    assert not state.overlay
    assert state.ledger.requests == 0
    assert state.pricing == proto.PRICE_SHEETS["openai"]
