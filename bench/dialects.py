"""Per-turn cost of a kept history in each dialect against the Cline dialect, in-process.

One conversation (a task, then turns of an assistant reply with one or two
tool calls, their results and now and then a user message; file reads of the
same paths again and again) is rendered in every dialect
(``tests._dialect_data``) and replayed turn by turn the way the daemon serves
a delta-synced task: the turn's messages are appended to the kept history
(``History.apply``), a native dialect's mapped history takes them
(``MappedHistory.sync``, only the new messages are mapped), ``prepare_request``
runs on the internal form and the view is made into the patch the daemon
sends (``view_patch`` for Cline, ``PatchMaker.of_mapped`` for the others).
Twice during the replay the previous request's usage is over the limit, so
file reads are optimised and the range is cut.

Each sample is one turn; reported are the median over all turns and over the
turns whose history holds at least 90% of the final messages, and each
dialect's ratio to the Cline dialect's figure in the same run.

With ``--wire`` the same replay goes through one real ``ctxwind`` over ipc
instead, each dialect a task of a ``ctxwin.client`` handle as it comes (delta
sync, views as patches rebuilt on the caller's list); a sample is then one
``prepare_request`` call from the client's side. The dialects replay in
lockstep, a turn of each in turn, so that each turn's figures share the
machine's state.

With ``--parts`` (in-process) the median of each step of a turn is shown
too: ``apply`` (the delta applied to the kept history), ``sync`` (the
mapped history takes the new messages; none for Cline), ``prepare``
(``prepare_request`` on the internal form) and ``patch``.

Usage: ``.venv/bin/python -m bench.dialects [--turns 700] [--repeat 3] [--wire] [--parts]
[--json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ctxwin.client import Client
from ctxwin.engine import History, PatchMaker, TaskState, view_patch
from ctxwin.engine._dialects import DIALECTS, get_dialect
from ctxwin.engine._mapped import MappedHistory
from tests._daemon import DaemonProcess
from tests._dialect_data import RENDER, Call, Turn, render_cline

MODEL = {"id": "claude-sonnet-4-5", "context_window": 200_000}
OVER = {"tokens_in": 400_000}
PATHS = [f"src/module_{index}.py" for index in range(40)]


def conversation(turns: int, seed: int = 7) -> list[Turn]:
    """A deterministic conversation of ``turns`` assistant turns."""
    rng = random.Random(seed)
    out = [Turn("system", "You are a coding agent."), Turn("user", "Fix the failing tests. " * 20)]
    serial = 0
    for _ in range(turns):
        calls = []
        for _ in range(rng.choice((1, 1, 2))):
            serial += 1
            if rng.random() < 0.6:
                calls.append(Call(f"call_{serial}", "Read", {"file_path": rng.choice(PATHS)}))
            else:
                calls.append(Call(f"call_{serial}", "Bash", {"command": f"pytest -k t{serial}"}))
        out.append(Turn("assistant", "Looking at the code now. " * rng.randint(1, 6), calls=calls))
        body = "def f(x):\n    return x * 2\n" * rng.randint(5, 40)
        out.append(Turn("results", results=[(call.id, body) for call in calls]))
        if rng.random() < 0.2:
            out.append(Turn("user", "Please also check the docs. " * rng.randint(1, 4)))
    return out


def render_cline_reads(turns: list[Turn]) -> list[dict[str, Any]]:
    """The conversation in the Cline dialect, its reads in Cline's own form.

    Cline recognises a read by the ``[read_file for '<path>'] Result:`` header
    of the first block of a user message (SPEC.md §6): the first result of a
    message that answers a ``Read`` gets it, so that the Cline replay has
    duplicate reads to optimise too.
    """
    paths = {
        call.id: call.args["file_path"]
        for turn in turns
        for call in turn.calls
        if call.name == "Read"
    }
    messages = render_cline(turns)
    for message in messages:
        first = message["content"][0]
        path = paths.get(first.get("tool_use_id", "")) if message["role"] == "user" else None
        if path is not None:
            text = f"[read_file for '{path}'] Result:\n{first['content'][0]['text']}"
            message["content"][0] = {**first, "content": [{"type": "text", "text": text}]}
    return messages


def _turn_ends(messages: list[dict[str, Any]], dialect: str) -> list[int]:
    """Where a request is made: after each message of the user's side followed by the model."""

    def user_side(message: dict[str, Any]) -> bool:
        kind = message.get("type")
        if isinstance(kind, str) and kind.endswith("_output"):
            return True
        return message.get("role") in ("user", "tool")

    return [
        end
        for end in range(1, len(messages) + 1)
        if user_side(messages[end - 1]) and (end == len(messages) or not user_side(messages[end]))
    ]


PARTS = ("apply", "sync", "prepare", "patch")
"""The steps of an in-process turn, as ``--parts`` reports them."""


def replay(
    dialect: str, turns: list[Turn], parts: dict[str, list[float]] | None = None
) -> Iterator[tuple[int, float]]:
    """``(history length, seconds)`` of each turn of one replay, a turn at a time.

    ``parts``: gets the seconds of each step of each turn added, by step name.
    """
    messages = render_cline_reads(turns) if dialect == "cline" else RENDER[dialect](turns)
    ends = _turn_ends(messages, dialect)
    cuts = {ends[len(ends) // 2], ends[(len(ends) * 4) // 5]}
    spec = get_dialect(dialect)
    history = History(dialect=spec)
    state = TaskState(dialect=spec)
    mapped = MappedHistory(spec) if spec.native else None
    state.cache = history.cache if mapped is None else mapped.cache
    patches = PatchMaker()
    sent = 0
    for end in ends:
        previous = {**OVER, "ts": end} if end in cuts else None
        started = time.perf_counter()
        history.apply(sent, history.digest, messages[sent:end])
        applied = synced = time.perf_counter()
        if mapped is None:
            view: list[Any] = state.prepare_request(history.messages, previous, MODEL)["messages"]
            prepared = time.perf_counter()
            view_patch(view, history.messages, state.deleted_range)
        else:
            mapped.sync(history.messages, sent)
            synced = time.perf_counter()
            internal: list[Any] = state.prepare_request(mapped.internal, previous, MODEL)[
                "messages"
            ]
            prepared = time.perf_counter()
            patches.of_mapped(mapped, internal, state.deleted_range)
        done = time.perf_counter()
        if parts is not None:
            steps = (applied - started, synced - applied, prepared - synced, done - prepared)
            for name, seconds in zip(PARTS, steps, strict=True):
                parts.setdefault(name, []).append(seconds)
        sent = end
        yield end, done - started


def replay_wire(
    client: Any, dialect: str, turns: list[Turn], serial: int
) -> Iterator[tuple[int, float]]:
    """``(history length, seconds)`` of each turn through the daemon, a turn at a time."""
    messages = render_cline_reads(turns) if dialect == "cline" else RENDER[dialect](turns)
    ends = _turn_ends(messages, dialect)
    cuts = {ends[len(ends) // 2], ends[(len(ends) * 4) // 5]}
    native = dialect != "cline"
    task = client.task(
        f"bench-{serial}-{dialect}", ephemeral=True, dialect=dialect if native else None
    )
    for end in ends:
        previous = {**OVER, "ts": end} if end in cuts else None
        history = messages[:end]
        started = time.perf_counter()
        task.prepare_request(history, MODEL, previous_request=previous)
        yield end, time.perf_counter() - started
    task.close()


def measure(repeat: int, turns: list[Turn], client: Any) -> dict[str, dict[str, float]]:
    """Every dialect's figures over ``repeat`` rounds.

    In a round every dialect replays the conversation once, in lockstep: turn
    ``t`` of every dialect runs before turn ``t + 1`` of any (in an order that
    rotates from turn to turn), so that what the machine does meanwhile falls
    on all of them alike. In-process, each step's median over all turns too
    (``<step>_ms``).
    """
    names = ("cline", *sorted(DIALECTS))
    runs: dict[str, list[list[tuple[int, float]]]] = {name: [] for name in names}
    steps: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    for round_ in range(repeat):
        replays = {
            name: replay(name, turns, steps[name])
            if client is None
            else replay_wire(client, name, turns, round_)
            for name in names
        }
        samples: dict[str, list[tuple[int, float]]] = {name: [] for name in names}
        gc.collect()
        for turn in itertools.count():
            shift = turn % len(names)
            done = 0
            for name in names[shift:] + names[:shift]:
                sample = next(replays[name], None)
                if sample is None:
                    done += 1
                else:
                    samples[name].append(sample)
            if done == len(names):
                break
        for name in names:
            runs[name].append(samples[name])
    results: dict[str, dict[str, float]] = {}
    for dialect, rounds in runs.items():
        length = rounds[0][-1][0]
        every = [seconds for samples in rounds for _, seconds in samples]
        tail = [s for samples in rounds for size, s in samples if size >= 0.9 * length]
        results[dialect] = {
            "messages": length,
            "median_ms": statistics.median(every) * 1000,
            "tail_median_ms": statistics.median(tail) * 1000,
        }
        for name, seconds in steps.get(dialect, {}).items():
            results[dialect][f"{name}_ms"] = statistics.median(seconds) * 1000
    base = results["cline"]
    for figures in results.values():
        figures["ratio"] = figures["median_ms"] / base["median_ms"]
        figures["tail_ratio"] = figures["tail_median_ms"] / base["tail_median_ms"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=700)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--wire", action="store_true", help="through a real ctxwind over ipc")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--parts", action="store_true", help="in-process: each step's median too (apply, ...)"
    )
    args = parser.parse_args()
    turns = conversation(args.turns)
    with contextlib.ExitStack() as stack:
        client = None
        if args.wire:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            daemon = stack.enter_context(DaemonProcess(root))
            client = stack.enter_context(Client(daemon.endpoint, timeout=60))
        results = measure(args.repeat, turns, client)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    parts = args.parts and not args.wire
    heads = "".join(f" {name:>8}" for name in PARTS) if parts else ""
    print(
        f"{'dialect':18} {'messages':>8} {'median':>10} {'@90%':>10} {'ratio':>6} {'@90%':>6}"
        + heads
    )
    for dialect, figures in results.items():
        row = "".join(f" {figures[f'{name}_ms'] * 1000:6.1f}us" for name in PARTS) if parts else ""
        print(
            f"{dialect:18} {figures['messages']:8.0f} {figures['median_ms']:8.3f}ms "
            f"{figures['tail_median_ms']:8.3f}ms {figures['ratio']:6.2f} "
            f"{figures['tail_ratio']:6.2f}" + row
        )


if __name__ == "__main__":
    main()
