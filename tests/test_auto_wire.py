"""``strategy: "auto"``, pricing and the cache ledger through the real daemon, in every dialect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ctxwin import proto
from ctxwin.client import BadRequestError, Client
from tests._daemon import DaemonProcess
from tests._dialect_data import RENDER, Call, Turn, render_cline
from tests._rules import CHECKS

MODEL: proto.Model = {"id": "small-model", "context_window": 12_000}
DIALECTS = ("cline", *RENDER)


def words(count: int, seed: int) -> str:
    """About ``count`` tokens of ordinary text."""
    return " ".join(f"w{(seed * 7919 + index) % 997}" for index in range(count // 2))


def turns(steps: int) -> list[Turn]:
    """A task, then calls whose results are large enough that ``auto`` must act."""
    out = [Turn("system", "Be brief."), Turn("user", "Fix the build.")]
    for step in range(steps):
        name, args = (
            ("read_file", {"path": "src/app.py"})
            if step % 3 == 0
            else ("bash", {"cmd": f"make {step}"})
        )
        call_id = f"call_{step}"
        out.append(Turn("assistant", f"step {step}", calls=[Call(call_id, name, args)]))
        out.append(Turn("results", results=[(call_id, words(900, step))]))
    return out


def render(dialect: str, steps: int) -> list[dict[str, Any]]:
    conversation = turns(steps)
    if dialect == "cline":
        return render_cline([turn for turn in conversation if turn.kind != "system"])
    return RENDER[dialect](conversation)


def prepare(
    client: Client, task: str, dialect: str, messages: list[dict[str, Any]], **extra: Any
) -> Any:
    args: dict[str, Any] = {"strategy": "auto", **extra}
    if dialect != "cline":
        args["dialect"] = dialect
    return client.task(task).prepare_request(messages, MODEL, **args)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_auto_keeps_every_view_within_the_window_and_valid(client: Client, dialect: str) -> None:
    """Turn by turn, every view fits, keeps the provider's rules, and edits are rolled back."""
    task = f"auto-{dialect}"
    edited_at: int | None = None
    messages = render(dialect, 40)
    step = 4 if dialect != "cline" else 2
    for end in range(step, len(messages) + 1, step):
        sent = messages[:end]
        before = proto.now_ms()
        result = prepare(client, task, dialect, sent, pricing="anthropic")
        assert result["fits"], (end, result["estimated_tokens"])
        assert result["estimated_tokens"] <= 12_000 - 2048
        if dialect in CHECKS:
            CHECKS[dialect](result["messages"])
        assert "cache" in result
        if result.get("receipts") and edited_at is None:
            edited_at = before - 1
    assert edited_at is not None, "a 12k window must make auto act"
    inspected = client.task(task).inspect(dialect=None if dialect == "cline" else dialect)
    assert inspected["dropped"]  # the turns rebuilds left out, shown by inspect
    assert inspected["summary"] is not None  # the ledger the views carry
    assert inspected["pricing"]["name"] == "anthropic"
    assert inspected["cache"]["requests"] > 1
    assert client.task(task).rollback(edited_at)["removed"] > 0
    after = client.task(task).inspect()
    assert after["updates"] == []
    assert "dropped" not in after
    # The view after the rollback is the whole history again.
    again = prepare(client, task, dialect, messages[:4], pricing="anthropic")
    assert again["messages"] == messages[:4]


def test_stubs_name_the_tool_and_its_arguments(client: Client) -> None:
    """The result of the turn that just left the window, in a view over the budget, is a
    stub naming its call."""
    messages = render("anthropic", 14)
    stubs: set[int] = set()
    for end in range(4, len(messages) + 1, 2):
        sent = str(prepare(client, "stubs", "anthropic", messages[:end])["messages"])
        stubs.update(n for n in range(14) if f'bash({{"cmd":"make {n}"}}) was removed' in sent)
    assert stubs


def test_ledger_figures_are_exact_and_summed(client: Client) -> None:
    """On plain text turns nothing is edited: cached is the last view, written the rest."""
    messages = [
        {
            "role": "user" if n % 2 == 0 else "assistant",
            "content": [{"type": "text", "text": words(200, n)}],
        }
        for n in range(5)
    ]
    task = client.task("ledger")
    one = task.prepare_request(messages[:3], MODEL, strategy="auto", pricing="anthropic")
    two = task.prepare_request(messages, MODEL, strategy="auto")
    head = client.count_tokens(messages[:3])["tokens"]
    tail = client.count_tokens(messages[3:])["tokens"]
    assert one["cache"] == {
        "cached_tokens": 0,
        "written_tokens": head,
        "cost": round(1.25 * head, 3),
        "keep_all_cost": round(1.25 * head, 3),
    }
    assert two["cache"]["cached_tokens"] == head
    assert two["cache"]["written_tokens"] == tail
    assert two["cache"]["cost"] == pytest.approx(0.1 * head + 1.25 * tail, abs=0.001)
    cache = task.inspect()["cache"]
    assert cache["requests"] == 2
    assert cache["cached_tokens"] == head
    assert cache["written_tokens"] == head + tail
    stats = client.stats()["cache"]
    assert stats is not None
    assert stats["requests"] >= 2
    assert stats["cost"] >= cache["cost"]


def test_the_sheet_is_kept_across_a_restart(tmp_path: Path) -> None:
    messages = render("cline", 2)
    with DaemonProcess(tmp_path) as process, Client(process.endpoint, timeout=60) as connected:
        connected.task("kept").prepare_request(
            messages,
            MODEL,
            strategy="auto",
            pricing={"input": 1, "cache_write": 1.5, "cache_read": 0.2},
        )
        connected.task("kept").close()
    with DaemonProcess(tmp_path) as process, Client(process.endpoint, timeout=60) as connected:
        pricing = connected.task("kept").inspect()["pricing"]
        assert pricing == {"name": "custom", "input": 1.0, "cache_write": 1.5, "cache_read": 0.2}
        result = connected.task("kept").prepare_request(messages, MODEL, strategy="auto")
        assert result["cache"]["cost"] == pytest.approx(
            1.5 * result["cache"]["written_tokens"], abs=0.01
        )


@pytest.mark.parametrize(
    "pricing", ["cheap", {"input": 1}, {"input": 1, "cache_write": -1, "cache_read": 0.1}, 7]
)
def test_a_bad_pricing_is_refused_and_changes_nothing(
    client: Client, pricing: Any, request: pytest.FixtureRequest
) -> None:
    task = client.task(f"bad-pricing-{request.node.callspec.id}")
    with pytest.raises(BadRequestError, match="pricing"):
        task.prepare_request(render("cline", 2), MODEL, pricing=pricing)
    assert "pricing" not in task.inspect()
