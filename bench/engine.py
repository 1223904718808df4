"""Time the engine in-process on a synthetic and a real conversation.

Usage (from the repository root)::

    .venv/bin/python -m bench.engine [--repeat 30] [--json] [--corpus PATH | --no-corpus]

The real conversation is the corpus's Cline task: ``--corpus`` names the
corpus folder (or the file itself), else ``CTXWIN_CORPUS`` does;
``--no-corpus`` times the synthetic one only.

Cases, each run ``--repeat`` times after one untimed warm-up:

- ``prepare over threshold``: ``prepare_request`` when the previous request
  used at least ``max_allowed_size`` tokens, so it optimises file reads, adds
  the notice and cuts (SPEC.md §7); a fresh ``TaskState`` every time.
- ``prepare below threshold``: ``prepare_request`` under the limit: only the
  view (SPEC.md §4), on a fresh state (no range: the whole history).
- ``prepare below, after a cut``: the same on the state the first case leaves.
- ``truncated_messages + overlay``: the view of that state (range + overlay).
- ``optimize_file_reads fresh``: a new state each time (SPEC.md §6).
- ``optimize_file_reads again``: a second run on an already optimised state.

Only the engine call is inside the timed region: building the conversation
and the states happens before it, and a full garbage collection runs before
each repetition (the collector stays on while timing, as in the daemon).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench._conversation import build_conversation, size_of
from bench._corpus import CLINE_TASK, add_corpus_option, corpus_file
from ctxwin.engine import History, TaskState, context_window_info, total_tokens

MODEL: dict[str, Any] = {"id": "claude-sonnet-4-5", "context_window": 200_000}
# Targets for the synthetic 2000-message, ~1 MB conversation (issue 2).
TARGETS_MS = {"prepare over threshold": 20.0, "prepare below threshold": 5.0}

Message = dict[str, Any]
# A case's setup runs outside the timed region and returns the call to time.
Setup = Callable[[], Callable[[], object]]


@dataclass(frozen=True, slots=True)
class Timing:
    """One case's figures over all repetitions, in milliseconds."""

    case: str
    median_ms: float
    p90_ms: float
    min_ms: float
    target_ms: float | None

    @property
    def verdict(self) -> str:
        if self.target_ms is None:
            return ""
        return "ok" if self.median_ms <= self.target_ms else "OVER"


@dataclass(frozen=True, slots=True)
class Report:
    """The figures for one conversation."""

    name: str
    messages: int
    bytes: int
    notes: list[str]
    timings: list[Timing]


def previous_request(messages: Sequence[Message], tokens: int) -> dict[str, Any]:
    """A previous request's usage adding up to ``tokens``, stamped after the last message."""
    last = messages[-1].get("ts") if messages else None
    ts = (last if isinstance(last, int) else 1_767_225_600_000) + 1
    cache_reads = tokens // 10
    return {
        "ts": ts,
        "tokens_in": tokens - cache_reads - 2_000,
        "tokens_out": 2_000,
        "cache_reads": cache_reads,
    }


def time_case(setup: Setup, repeat: int) -> list[int]:
    """Nanoseconds per call: ``setup`` builds each call untimed, then the call is timed."""
    setup()()  # warm-up: caches, first-call costs
    samples: list[int] = []
    for _ in range(repeat):
        call = setup()
        gc.collect()
        start = time.perf_counter_ns()
        call()
        samples.append(time.perf_counter_ns() - start)
    return samples


def summarise(case: str, samples: list[int], target: float | None) -> Timing:
    ordered = sorted(samples)
    p90 = ordered[max(0, math.ceil(len(ordered) * 0.9) - 1)]
    return Timing(
        case,
        statistics.median(ordered) / 1e6,
        p90 / 1e6,
        ordered[0] / 1e6,
        target,
    )


def run(name: str, messages: list[Message], repeat: int, targets: dict[str, float]) -> Report:
    """Time every case on ``messages``."""
    limit = context_window_info(MODEL).max_allowed_size
    over = previous_request(messages, int(limit) + 2_000)
    below = previous_request(messages, int(limit) // 4)
    if not total_tokens(over) >= limit > total_tokens(below):
        raise RuntimeError("the previous requests do not straddle the threshold")
    ts = over["ts"]

    # States that the shared-state cases start from, and what they show.
    cut = TaskState()
    prepared = cut.prepare_request(messages, over, MODEL)
    optimised = TaskState()
    first = optimised.optimize_file_reads(messages, ts)
    revision = optimised.revision
    again = optimised.optimize_file_reads(messages, ts)
    if again["changed"] or optimised.revision != revision:
        raise RuntimeError("a second optimisation changed an already optimised state")
    notes = [
        f"optimize_file_reads saves {first['percent_saved']:.1%} "
        f"(need_to_truncate={first['need_to_truncate']})",
        f"over threshold: range {prepared['deleted_range']}, range_updated="
        f"{prepared['range_updated']}, view {len(prepared['messages'])} of {len(messages)} "
        "messages",
    ]

    def fresh(call: Callable[[TaskState], object]) -> Setup:
        def setup() -> Callable[[], object]:
            state = TaskState()
            return lambda: call(state)

        return setup

    def shared(call: Callable[[], object]) -> Setup:
        return lambda: call

    # A daemon keeps each task's history (delta sync): parse results stay warm. A task's
    # session lends the state the history's view cache for each op; so do these cases.
    kept = History(messages)
    warm = TaskState()
    warm.cache = kept.cache
    warm.prepare_request(kept.messages, over, MODEL)  # parse every message once
    cut.cache = kept.cache  # used only for kept.messages, the list it belongs to

    def fresh_kept(call: Callable[[TaskState], object]) -> Setup:
        def setup() -> Callable[[], object]:
            state = TaskState()
            state.cache = kept.cache
            return lambda: call(state)

        return setup

    cases: list[tuple[str, Setup]] = [
        ("prepare over threshold", fresh(lambda s: s.prepare_request(messages, over, MODEL))),
        ("prepare below threshold", fresh(lambda s: s.prepare_request(messages, below, MODEL))),
        ("prepare below, after a cut", shared(lambda: cut.prepare_request(messages, below, MODEL))),
        ("truncated_messages + overlay", shared(lambda: cut.truncated_messages(messages))),
        ("optimize_file_reads fresh", fresh(lambda s: s.optimize_file_reads(messages, ts))),
        ("optimize_file_reads again", shared(lambda: optimised.optimize_file_reads(messages, ts))),
        (
            "kept history: over threshold",
            fresh_kept(lambda s: s.prepare_request(kept.messages, over, MODEL)),
        ),
        (
            "kept history: below, after cut",
            shared(lambda: cut.prepare_request(kept.messages, below, MODEL)),
        ),
    ]
    timings = [
        summarise(case, time_case(setup, repeat), targets.get(case)) for case, setup in cases
    ]
    return Report(name, len(messages), size_of(messages), notes, timings)


def print_report(report: Report) -> None:
    print(f"\n{report.name}: {report.messages} messages, {report.bytes / 1e6:.2f} MB")
    for note in report.notes:
        print(f"  {note}")
    header = f"  {'case':<30} {'median ms':>10} {'p90 ms':>8} {'min ms':>8} {'target':>8}"
    print(header)
    print("  " + "-" * (len(header) - 2))
    for timing in report.timings:
        target = "" if timing.target_ms is None else f"<= {timing.target_ms:g}"
        row = (
            f"  {timing.case:<30} {timing.median_ms:>10.2f} {timing.p90_ms:>8.2f} "
            f"{timing.min_ms:>8.2f} {target:>8} {timing.verdict}"
        )
        print(row.rstrip())


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=30, help="timed runs per case (30)")
    parser.add_argument("--messages", type=int, default=2000, help="synthetic messages (2000)")
    parser.add_argument("--bytes", type=int, default=1_000_000, help="synthetic size (1 MB)")
    parser.add_argument("--seed", type=int, default=0, help="synthetic conversation seed (0)")
    add_corpus_option(parser, CLINE_TASK)
    parser.add_argument("--no-corpus", action="store_true", help="skip the real conversation")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    source = None
    if not args.no_corpus:
        source = corpus_file(args.corpus, CLINE_TASK, "--no-corpus for the synthetic one only")

    synthetic = build_conversation(args.messages, args.bytes, args.seed)
    reports = [
        run(
            f"synthetic (seed {args.seed})",
            synthetic,
            args.repeat,
            TARGETS_MS if (args.messages, args.bytes) == (2000, 1_000_000) else {},
        )
    ]
    if source is not None:
        corpus: list[Message] = json.loads(source.read_text(encoding="utf-8"))
        reports.append(run(f"corpus {source.name}", corpus, args.repeat, {}))

    if args.json:
        print(
            json.dumps(
                {
                    "machine": machine(),
                    "repeat": args.repeat,
                    "conversations": [asdict(report) for report in reports],
                },
                indent=2,
            )
        )
        return 0
    info = machine()
    print(
        f"ctxwin engine, {args.repeat} runs per case; Python {info['python']} "
        f"({info['implementation']}), {info['cpus']} CPUs, {info['platform']}"
    )
    for report in reports:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
