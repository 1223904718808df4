"""Summaries end to end in every dialect: the real daemon, its files, a restart, a Redis fleet."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ctxwin import engine
from ctxwin.client import BadRequestError, Client
from tests._daemon import DaemonProcess
from tests._dialect_data import RENDER, Call, Turn, render_cline, sdk_validator
from tests._ledger_data import cline_task, files_listed, snippet, typed
from tests._redis import RedisServer
from tests._rules import CHECKS

DIALECTS = ["cline", "openai-chat", "anthropic", "openai-responses", "gemini"]
MODEL: Any = {"id": "small-model", "context_window": 16000}
TRIGGER = 12000  # floor(16000 * 0.75), under max_allowed_size 12800 (SPEC.md §2, §8)
MARK = engine.SUMMARY_MARK


def instruction(round_: int) -> str:
    return f"Instruction {round_}: keep the retry limit at KAPPA-{round_ * 7} exactly."


def written(round_: int) -> str:
    return f"out/report-{round_}.txt"


ERROR = "Error: ValueError: bad token at column 3 in src/mod3.py"


def conversation(rounds: int) -> list[Turn]:
    """A task, then tool-using rounds planting facts: an instruction with a distinctive value,
    a file read (large), a file written, an error in round 3, a plan at the end of each."""
    turns = [
        Turn("user", "Build the parser. Use the seed value ZETA-0 everywhere."),
        Turn("assistant", "Starting."),
    ]
    for round_ in range(1, rounds + 1):
        turns.append(Turn("user", instruction(round_)))
        read = Call(f"r{round_}", "read_file", {"path": f"src/mod{round_}.py"})
        turns.append(Turn("assistant", f"Reading module {round_}.", calls=[read]))
        body = f"line {round_}: total = compute(values, limit)  # checked\n" * 100
        turns.append(Turn("results", results=[(read.id, body)]))
        write = Call(f"w{round_}", "write_file", {"path": written(round_), "content": "x"})
        turns.append(Turn("assistant", f"Writing report {round_}.", calls=[write]))
        turns.append(Turn("results", results=[(write.id, ERROR if round_ == 3 else "written")]))
        turns.append(Turn("assistant", f"Plan after round {round_}: test module {round_}."))
    return turns


def render(dialect: str, turns: list[Turn]) -> list[dict[str, Any]]:
    return render_cline(turns) if dialect == "cline" else RENDER[dialect](turns)


def with_prompt(dialect: str, history: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """The history with a new user prompt at its end (the next request)."""
    return history + render(dialect, [Turn("user", text)])


def dumped(view: Sequence[Any]) -> str:
    return json.dumps(view, sort_keys=True, ensure_ascii=False)


def check_view(dialect: str, view: Any) -> None:
    """The provider's rules and, for a native dialect, its SDK's request type."""
    if dialect != "cline":
        CHECKS[dialect](view)
        sdk_validator(dialect)(view)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_condense_shortens_the_view_carries_one_summary_and_rolls_back_byte_for_byte(
    client: Client, dialect: str
) -> None:
    """The view after a condense is shorter, under half the trigger, valid, with the summary
    once right after the first pair; a rollback to before it gives back the earlier view."""
    task = client.task(f"once-{dialect}", dialect=dialect)
    history = with_prompt(dialect, render(dialect, conversation(8)), "Go on.")
    before = task.truncated_messages(history)["messages"]
    assert MARK not in dumped(before)
    result: Any = task.condense(history, MODEL, ts=5000)
    assert (True, None, None) == (result["condensed"], result["reason"], result["fallback"])
    view = result["messages"]
    assert len(view) < len(before)
    assert 1 == dumped(view).count(MARK)
    assert result["tokens_after"] <= TRIGGER / 2 < result["tokens_before"]
    check_view(dialect, view)
    # Right after the first pair: in the first message the view keeps of the history.
    first_pair = render(dialect, conversation(0))
    assert dumped(first_pair) == dumped(view[: len(first_pair)]).replace(
        engine.DEFAULT_NOTICES.truncation, "Starting."
    )
    assert MARK in dumped(view[len(first_pair) : len(first_pair) + 1])
    assert view == task.truncated_messages(history)["messages"]
    shown: Any = task.inspect()
    assert result["summary"] == shown["summary"]
    assert [result["summary"]] == shown["summaries"]
    assert result["deleted_range"] == shown["deleted_range"] == result["summary"]["range"]
    assert "basic" == result["summary"]["kind"]

    assert 0 < task.rollback(4999)["removed"]
    assert dumped(before) == dumped(task.truncated_messages(history)["messages"])
    shown = task.inspect()
    assert (None, [], None) == (shown["deleted_range"], shown["updates"], shown.get("summary"))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_condensed_views_estimate_is_its_count_and_its_usage_keeps_the_calibration(
    client: Client, dialect: str
) -> None:
    """A condense's tokens_after is count_tokens of its view; that view's counted usage,
    reported with the next request, leaves the calibration at 1 (no drift without usage)."""
    task = client.task(f"calibrated-{dialect}", dialect=dialect, ephemeral=True)
    named = None if dialect == "cline" else dialect

    def count(view: list[Any]) -> int:
        return client.count_tokens(view, dialect=named)["tokens"]

    history = with_prompt(dialect, render(dialect, conversation(8)), "Go on.")
    sent: Any = task.prepare_request(history, MODEL, estimate=True)
    assert sent["estimated_tokens"] == count(sent["messages"])
    result: Any = task.condense(history, MODEL, ts=5000)
    assert result["condensed"]
    view = result["messages"]
    counted = count(view)
    assert counted == result["tokens_after"] < sent["estimated_tokens"]
    usage: Any = {"ts": 5001, "tokens_in": counted, "tokens_out": 0}
    later = with_prompt(dialect, history, "Carry on.")
    again: Any = task.prepare_request(later, MODEL, previous_request=usage, estimate=True)
    assert 1.0 == again["calibration"]
    assert again["estimated_tokens"] == count(again["messages"])
    client.close_task(f"calibrated-{dialect}")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_second_condense_replaces_the_first_and_a_rollback_brings_it_back(
    client: Client, dialect: str
) -> None:
    """Two condenses leave one summary in the view, the second; a condense right after
    another is refused with a reason; rolling the second back restores the first's view."""
    task = client.task(f"twice-{dialect}", dialect=dialect)
    history = with_prompt(dialect, render(dialect, conversation(8)), "Go on.")
    first: Any = task.condense(history, MODEL, ts=1000, summary="FIRST summary: parser half done.")
    assert (True, "model") == (first["condensed"], first["summary"]["kind"])
    too_soon: Any = task.condense(history, MODEL, ts=1500)
    assert not too_soon["condensed"]
    assert "at least 6 must come between two" in too_soon["reason"]
    assert first["messages"] == too_soon["messages"]

    longer = with_prompt(dialect, render(dialect, conversation(14)), "Go on.")
    between = task.truncated_messages(longer)["messages"]
    second: Any = task.condense(longer, MODEL, ts=2000, summary="SECOND summary: parser done.")
    assert second["condensed"], second["reason"]
    view = second["messages"]
    text = dumped(view)
    assert (1, 0, 1) == (
        text.count(MARK),
        text.count("FIRST summary"),
        text.count("SECOND summary"),
    )
    check_view(dialect, view)
    assert second["deleted_range"][1] > first["deleted_range"][1]
    assert 2 == len(task.inspect()["summaries"])

    task.rollback(1999)
    assert dumped(between) == dumped(task.truncated_messages(longer)["messages"])
    assert first["summary"] == task.inspect()["summary"]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_two_basic_condenses_keep_every_planted_instruction_and_path(
    client: Client, dialect: str
) -> None:
    """After two successive basic condenses the view still holds every user instruction and
    every file path written, the error and the last plan, and is under half the trigger."""
    task = client.task(f"retain-{dialect}", dialect=dialect)
    history = with_prompt(dialect, render(dialect, conversation(8)), "Go on.")
    assert task.condense(history, MODEL, ts=1000)["condensed"]
    rounds = 16
    longer = with_prompt(dialect, render(dialect, conversation(rounds)), "Go on.")
    second: Any = task.condense(longer, MODEL, ts=2000)
    assert second["condensed"], second["reason"]
    assert second["tokens_after"] < TRIGGER / 2
    text = json.dumps(second["messages"], ensure_ascii=False)
    missing = [instruction(r) for r in range(1, rounds + 1) if instruction(r) not in text]
    missing += [written(r) for r in range(1, rounds + 1) if written(r) not in text]
    assert [] == missing
    assert "Use the seed value ZETA-0" in text
    assert ERROR in text
    assert f"Plan after round {rounds}" in text or f"Plan after round {rounds - 1}" in text
    check_view(dialect, second["messages"])


@pytest.mark.parametrize("dialect", ["cline", "anthropic"])
def test_a_blank_model_summary_falls_back_and_a_useless_one_is_not_stored(
    client: Client, dialect: str
) -> None:
    """A blank summary is replaced by the basic one; one that would make the view larger
    is replaced too, and each result says why."""
    task = client.task(f"fallback-{dialect}", dialect=dialect)
    history = with_prompt(dialect, render(dialect, conversation(8)), "Go on.")
    blank: Any = task.condense(history, MODEL, ts=1000, summary="  \n")
    assert ("basic", "the model's summary was empty") == (
        blank["summary"]["kind"],
        blank["fallback"],
    )
    task.rollback(999)
    huge: Any = task.condense(history, MODEL, ts=1000, summary="word " * 40000)
    assert "basic" == huge["summary"]["kind"]
    assert "would not make the view smaller" in huge["fallback"]


def test_nothing_to_remove_is_refused_with_a_reason(client: Client) -> None:
    """A history of the task and one turn has no turn a condense could remove."""
    task = client.task("short")
    history = render("cline", [Turn("user", "Hi"), Turn("assistant", "Hello"), Turn("user", "Go")])
    result: Any = task.condense(history, MODEL, ts=1000)
    assert (False, None) == (result["condensed"], result["summary"])
    assert "no turn is left to remove" in result["reason"]
    assert history == result["messages"]


def test_a_basic_summary_of_a_cline_task_keeps_what_a_person_typed(client: Client) -> None:
    """Condensing a Cline XML-tool task keeps every message a person typed in the view, lists
    no Cline boilerplate or environment dump as one, and lists only paths as files read."""
    history = cline_task(40)
    result: Any = client.task("cline-typed").condense(history, MODEL, ts=1000)
    assert result["condensed"], result["reason"]
    text = result["summary"]["text"]
    view = json.loads(dumped(result["messages"]))
    strings = " ".join(" ".join(block["text"].split()) for m in view for block in m["content"])
    assert [] == [said for said in typed(history) if snippet(said) not in strings]
    for boilerplate in ("You did not use a tool", "environment_details", "was not executed"):
        assert boilerplate not in text
    # Each file is on its call line or in the files list, and only files are listed there.
    removed = result["summary"]["range"][1]
    pages = [f"src/page{n}.tsx" for n in range(0, 40, 6) if 2 + 2 * n <= removed]
    listed = files_listed(text, "Files read")
    assert listed is not None
    assert [] == [path for path in listed if path not in [*pages, "src/config.json"]]
    assert [] == [path for path in pages if path not in text]
    assert "execute_command: npm run dev" in text


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_summary_survives_a_restart(tmp_path: Path, dialect: str) -> None:
    """A condensed task's view is the same after the daemon restarts (ctxwin.json holds it)."""
    history = with_prompt(dialect, render(dialect, conversation(8)), "Go on.")
    with DaemonProcess(tmp_path) as daemon, Client(daemon.endpoint) as first:
        task = first.task("kept", dialect=dialect)
        view = task.condense(history, MODEL, ts=1000)["messages"]
        first.flush("kept")
    stored = json.loads((daemon.task_dir("kept") / "ctxwin.json").read_text())
    assert 1 == len(stored["summaries"])
    with DaemonProcess(tmp_path) as daemon, Client(daemon.endpoint) as second:
        again = second.task("kept", dialect=dialect)
        assert dumped(view) == dumped(again.truncated_messages(history)["messages"])
        again.rollback(999)
        assert MARK not in dumped(again.truncated_messages(history)["messages"])


@pytest.mark.parametrize("dialect", ["openai-chat", "gemini"])
def test_a_summary_moves_with_its_task_to_another_daemon(
    tmp_path: Path, redis_server: RedisServer, dialect: str
) -> None:
    """In a fleet, the daemon that takes a task over shows the summary the first one stored."""
    history = with_prompt(dialect, render(dialect, conversation(8)), "Go on.")
    store = ("--state-store", redis_server.url)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    with DaemonProcess(tmp_path / "a", *store) as first, Client(first.endpoint) as a:
        view = a.task("moving", dialect=dialect).condense(history, MODEL, ts=1000)["messages"]
        a.close_task("moving")
    with DaemonProcess(tmp_path / "b", *store) as second, Client(second.endpoint) as b:
        moved = b.task("moving", dialect=dialect)
        assert dumped(view) == dumped(moved.truncated_messages(history)["messages"])
        assert 1 == len(moved.inspect()["summaries"])


def test_the_kept_turns_keep_their_reasoning_whole(client: Client) -> None:
    """Thinking blocks of the turns a condense keeps are sent as they are (signatures too)."""
    turns = conversation(8)
    for turn in turns:
        if turn.kind == "assistant" and turn.calls:
            turn.reasoning = True
    history = with_prompt("anthropic", render("anthropic", turns), "Go on.")
    result: Any = client.task("reasoning", dialect="anthropic").condense(history, MODEL, ts=1000)
    assert result["condensed"], result["reason"]
    view = result["messages"]
    sent = [
        block
        for message in view[2:]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block["type"] == "thinking"
    ]
    assert sent
    held = [
        block
        for message in history
        if isinstance(message["content"], list)
        for block in message["content"]
        if block["type"] == "thinking"
    ]
    assert sent == held[len(held) - len(sent) :]
    check_view("anthropic", view)


SHORTENED = "shortened to fit the model's context window"


def oversized(rounds: int) -> list[Turn]:
    """A conversation whose newest message, a tool result, is larger than the whole window."""
    read = Call("big", "read_file", {"path": "logs/build.log"})
    body = "".join(f"entry {line}: step finished with status ok\n" for line in range(4000))
    return [
        *conversation(rounds),
        Turn("user", "Read the build log."),
        Turn("assistant", "Reading the log.", calls=[read]),
        Turn("results", results=[(read.id, body)]),
    ]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_message_larger_than_the_window_is_shortened_on_the_summaries_path(
    client: Client, dialect: str
) -> None:
    """No cut or summary can fit a newest message larger than the window: prepare_request with
    summaries and condense both shorten it, keeping its head and tail, with a notice saying so,
    and the view fits the window less the response's room and keeps the provider's rules."""
    history = render(dialect, oversized(2))
    budget = MODEL["context_window"] - engine.DEFAULT_POLICY.reserve
    assert client.count_tokens(history, dialect=dialect)["tokens"] > MODEL["context_window"]

    task = client.task(f"oversized-{dialect}", dialect=dialect)
    sent: Any = task.prepare_request(history, MODEL, use_auto_condense=True, summaries=True)
    view = sent["messages"]
    assert client.count_tokens(view, dialect=dialect)["tokens"] <= budget
    assert 1 == dumped(view).count(SHORTENED)
    assert "entry 0:" in dumped(view)
    assert "entry 3999:" in dumped(view)
    assert len(view) == len(history)
    check_view(dialect, view)

    condensed = client.task(f"oversized-condense-{dialect}", dialect=dialect)
    history = render(dialect, oversized(8))
    result: Any = condensed.condense(history, MODEL, ts=5000)
    assert result["condensed"]
    view = result["messages"]
    assert client.count_tokens(view, dialect=dialect)["tokens"] <= budget
    assert 1 == dumped(view).count(SHORTENED)
    assert 1 == dumped(view).count(MARK)
    check_view(dialect, view)
    assert view == condensed.truncated_messages(history)["messages"]


def test_a_summary_requests_usage_is_priced_into_the_tasks_ledger(client: Client) -> None:
    """condense(usage=...) adds the summary request's reported input to the task's cache
    ledger under its sheet (uncached at the input price, cache reads and writes at theirs);
    sending everything needs no summary, so keep_all_cost stays."""
    task = client.task("ledger-summary")
    history = with_prompt("cline", render("cline", conversation(8)), "Go on.")
    task.prepare_request(history, MODEL, pricing="anthropic", estimate=True)
    before: Any = task.inspect()["cache"]
    assert (0, 0.0) == (before["summary_requests"], before["summary_cost"])
    usage: Any = {"tokens_in": 300, "cache_writes": 40, "cache_reads": 9000, "tokens_out": 500}
    result: Any = task.condense(history, MODEL, ts=5000, summary="Goal: fix it.", usage=usage)
    assert result["condensed"]
    after: Any = task.inspect()["cache"]
    expected = 300 * 1 + 40 * 1.25 + 9000 * 0.1  # the anthropic sheet (docs/PRICING.md)
    assert (1, expected) == (after["summary_requests"], after["summary_cost"])
    assert after["cost"] == pytest.approx(before["cost"] + expected)
    assert after["keep_all_cost"] == before["keep_all_cost"]
    assert after["requests"] == before["requests"]
    with pytest.raises(BadRequestError, match="usage"):
        task.condense(history, MODEL, ts=6000, usage={"tokens_in": -1})
