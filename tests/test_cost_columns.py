"""The columns bench/strategies.py reports beyond cost (docs/COST.md), on tiny conversations."""

from __future__ import annotations

from typing import Any

from bench import _cost_columns as columns
from bench._cost_goals import check, geometric_mean
from ctxwin.engine import user_instructions
from tests._messages import call, result, user

Message = dict[str, Any]


def kept(history: list[Message], view: list[Message], dialect: str) -> tuple[float, float]:
    """(instructions kept, own calls visible) of ``view`` after ``history``."""
    typed = columns.instructions(history, dialect)
    calls = columns.calls(history)
    finder = columns.Finder([t for _, t in typed] + [k for _, k in calls])
    found = finder.in_view(view)
    typed_share = columns.share_present([i for i, _ in typed], len(history), found)
    calls_share = columns.share_present(
        [i for i, _ in calls], len(history), {i - len(typed) for i in found}
    )
    assert typed_share is not None
    assert calls_share is not None
    return typed_share, calls_share


def test_typed_text_is_user_text_but_not_system_text_nor_results() -> None:
    """In the native dialects a person typed user text blocks, not `<...>` text nor results."""
    history = [
        user("fix   the\nlogin bug"),
        call("a", "Read", {"file_path": "src/login.py"}),
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "a", "content": "def login(): ..."},
                {"type": "text", "text": "<system-reminder>be brief</system-reminder>"},
            ],
        },
        user("and add a test"),
    ]
    assert columns.instructions(history, "anthropic") == [
        (0, "fix the login bug"),
        (3, "and add a test"),
    ]


def test_the_bench_measures_what_the_ledger_lists_as_typed() -> None:
    """The bench's typed texts are the engine's ``user_instructions``, message for message: a
    bracketed note and an attachment count in a native log, Cline's tags only in a Cline task."""
    notes = [
        user("[Request interrupted by user for tool use]"),
        user("[attached document: a.pdf] follow it"),
        user("<command-name>/clear</command-name>"),
        user("[read_file for 'a.py'] Result:\n<feedback>\nshorter\n</feedback>"),
    ]
    for message in notes:
        assert columns.typed_texts(message, "anthropic") == user_instructions(message, False)
        assert columns.typed_texts(message, "cline") == user_instructions(message, True)
    assert [text for _, text in columns.instructions(notes[:3], "openai-chat")] == [
        "[Request interrupted by user for tool use]",
        "[attached document: a.pdf] follow it",
    ]
    assert columns.instructions(notes, "cline") == [(3, "shorter")]


def test_cline_typed_text_is_inside_its_tags() -> None:
    """In the Cline dialect only the text inside task, feedback, user_message, answer counts."""
    history = [
        user("<task>\nBuild the thing\n</task>\n<environment_details>noise</environment_details>"),
        user("[ask_followup_question for 'ok?'] Result:\n<answer>\nyes, go\n</answer>"),
        user("[read_file for 'a.py'] Result:\nprint(1)"),
    ]
    assert columns.instructions(history, "cline") == [(0, "Build the thing"), (1, "yes, go")]


def test_snippet_is_160_normalised_characters() -> None:
    """A long instruction is looked for by its first 160 characters, spaces normalised."""
    text = "word  " * 100
    assert columns.snippet(text) == ("word " * 32)[:160]
    assert len(columns.snippet(text)) == 160


def test_instruction_counts_wherever_its_snippet_appears() -> None:
    """An instruction is kept in place, or quoted in a summary with other white space."""
    long = "please " + "refactor the storage layer carefully " * 10
    history = [user(long), call("a", "Bash", {"command": "ls"}), result("a", "x"), user("thanks")]
    quoted = user("Summary: the user said " + " ".join(long.split()) + " and more")
    assert kept(history, [quoted, history[3]], "chat")[0] == 1.0
    assert kept(history, [history[3]], "chat")[0] == 0.5
    assert kept(history, history, "chat")[0] == 1.0


def test_own_call_is_visible_through_its_call_a_stub_or_a_ledger_line() -> None:
    """A call counts visible when its key argument is among the view's strings anywhere."""
    history = [
        user("go"),
        call("a", "Read", {"file_path": "src/app.py"}),
        result("a", "code"),
        call("b", "exec_command", {"cmd": ["bash", "-lc", "pytest -q tests"]}),
        result("b", "2 passed"),
        call("c", "TodoWrite", {"todos": [{"content": "x"}]}),
        result("c", "ok"),
    ]
    assert columns.calls(history) == [(1, "src/app.py"), (3, "pytest -q tests")]
    ledger = user("[ledger] Read src/app.py ok 1 line")
    assert kept(history, [history[0], ledger], "chat")[1] == 0.5
    assert kept(history, [history[0]], "chat")[1] == 0.0
    assert kept(history, history, "chat")[1] == 1.0


def test_ids_and_signatures_are_no_strings_of_the_view() -> None:
    """A key that only equals an id or a signature is not visible."""
    finder = columns.Finder(["toolu_1", "sig"])
    message = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "hm", "signature": "sig"},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}},
        ],
    }
    assert finder.found(message) == frozenset()


def test_kept_reports_mean_and_worst_request() -> None:
    """A share is averaged over the requests that had something due, and its worst kept."""
    kept_share = columns.Kept()
    for share in (None, 1.0, 0.5, 1.0):
        kept_share.add(share)
    assert (kept_share.mean, kept_share.worst, kept_share.count) == (2.5 / 3, 0.5, 3)


def test_feasibility_counts_strict_refusals_only_in_cline() -> None:
    """A Cline view a strict provider refuses is infeasible; elsewhere only added faults count."""
    assert columns.feasible(0, 0, 3, "cline") is False
    assert columns.feasible(0, 0, 3, "anthropic") is True
    assert columns.feasible(1, 0, 0, "anthropic") is False
    assert columns.feasible(0, 1, 0, "chat") is False


def row(strategy: str, cost: float, reads: float, feasible: bool = True) -> dict[str, Any]:
    return {
        "conversation": "c",
        "window": 64_000,
        "strategy": strategy,
        "feasible": feasible,
        "cost_anthropic": cost,
        "cost_openai": cost,
        "latest_read_kept": reads,
        "over": 0,
        "refused": 0,
        "cached_share": 0.95,
        "typed_worst": 1.0,
        "calls_visible": 1.0,
        "edits": 1,
    }


def test_dominated_by_a_cheaper_feasible_alternative_with_as_many_reads() -> None:
    """Cheaper and reads within one point dominates; infeasible, dearer or fewer reads do not."""
    auto = row("auto", 100, 0.90)
    others = [
        auto,
        row("cline", 90, 0.895),  # cheaper, reads 0.5 pt fewer: within the slack
        row("fit", 80, 0.88),  # cheaper, 2 pts fewer reads
        row("trim", 50, 1.0, feasible=False),
        row("keep-all", 100, 1.0),  # not cheaper
    ]
    assert columns.dominating(auto, others, "anthropic") == ["cline"]


def test_goals_name_the_failing_cells() -> None:
    """Each goal passes or fails, and a failing one names its cells."""
    auto = {**row("auto", 60, 0.5), "typed_worst": 0.5, "calls_visible": 0.9}
    rows = [auto, row("cline", 100, 0.9)]
    goals = {goal.name.split(" (")[0]: goal for goal in check(rows, ["anthropic"])}
    assert goals["every instruction typed so far in every view"].failing == ["c 64k (worst 0.50)"]
    assert goals["own calls visible >= 95%"].passed is False
    reads = goals["latest reads kept >= cline's - 1 pt"]
    assert reads.passed is False
    assert reads.failing == ["c 64k anthropic (-40.0 pts)"]
    assert goals["never dominated by a feasible alternative"].passed is True
    mean = goals["geometric mean auto/cline cost"]
    assert mean.passed is True
    assert mean.note == "0.600 over 1 cells"


def test_geometric_mean() -> None:
    """The geometric mean of 0.5 and 2 is 1."""
    assert geometric_mean([0.5, 2.0]) == 1.0
