"""Summaries on the corpus: each conversation replayed as an auto-condensing agent at one window.

Every corpus conversation, in its own dialect's internal form (as the daemon
runs it), is replayed request by request as ``bench.strategies`` does (the
usage fed back is the view's tokens and the response's). Each request asks
``prepare_request`` with ``use_auto_condense``; when a summary is due (the
last request used 0.75 of the window and the duplicate-read step is not
enough, SPEC.md §8) the task is condensed with the basic summary before the
view is sent (docs/SUMMARIES.md).

Per conversation: requests, requests over the window (input plus response),
views a provider would refuse that the history itself would not
(``bench.strategies.problems``), condenses stored and refused, the largest
view after a condense against half the trigger, and each summary's size
(characters and tokens).

Usage: ``.venv/bin/python -m bench.summaries [--corpus FOLDER] [--window 64000] [--json]``;
the corpus folder is ``--corpus`` or else ``CTXWIN_CORPUS``.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from bench._corpus import add_corpus_option, corpus_folder
from bench.strategies import CONVERSATIONS, START_TS, Conversation, Counter, load, problems
from ctxwin.engine import (
    AUTO_CONDENSE_FRACTION,
    Budgeting,
    TaskState,
    condense,
    context_window_info,
    fit_oversized,
    get_dialect,
    summary_due,
)


def replay(conversation: Conversation, window: int, counter: Counter) -> dict[str, Any]:
    """One conversation replayed with basic summaries; its figures."""
    state = TaskState(dialect=get_dialect(conversation.dialect))
    model = {"id": "bench-model", "context_window": window}
    info = context_window_info(model)
    trigger = min(math.floor(window * AUTO_CONDENSE_FRACTION), info.max_allowed_size)
    budgeting = Budgeting(counter, 1.0, "default", fixed=conversation.fixed)
    previous: dict[str, Any] | None = None
    over = refused_views = 0
    summaries: list[dict[str, Any]] = []
    refusals: list[str] = []
    peak = 0
    for step, (length, tokens_out) in enumerate(conversation.requests):
        history = conversation.internal[:length]
        ts = START_TS + step * 17_000
        due = summary_due(state, history, previous, model)
        fit_oversized(state, history, model, budgeting, ts)
        view: list[Any] = state.prepare_request(history, previous, model, True, budgeting, ts)[
            "messages"
        ]
        if due:
            done = condense(state, history, model, ts, budgeting)
            if done["condensed"] and done["summary"] is not None:
                text = done["summary"]["text"]
                summaries.append(
                    {
                        "request": step + 1,
                        "range": done["summary"]["range"],
                        "chars": len(text),
                        "tokens": counter.tokens.count_text(text),
                        "view_before": done["tokens_before"],
                        "view_after": done["tokens_after"],
                    }
                )
                view = done["messages"]
            else:
                refusals.append(str(done["reason"]))
        tokens_in = conversation.fixed + sum(counter(message) for message in view)
        peak = max(peak, tokens_in)
        if tokens_in + tokens_out > window:
            over += 1
        if problems(view) - problems(history):
            refused_views += 1
        previous = {"ts": ts, "tokens_in": tokens_in, "tokens_out": tokens_out}
    return {
        "conversation": conversation.name,
        "dialect": conversation.dialect,
        "requests": len(conversation.requests),
        "over_window": over,
        "refused_views": refused_views,
        "peak_input": peak,
        "trigger": trigger,
        "condenses": len(summaries),
        "condenses_refused": len(refusals),
        "refusal_reasons": sorted(set(refusals)),
        "max_view_after": max((item["view_after"] for item in summaries), default=0),
        "summaries": summaries,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=64_000)
    parser.add_argument("--json", action="store_true")
    add_corpus_option(parser)
    args = parser.parse_args()
    folder = corpus_folder(args.corpus)
    counter = Counter()
    results = [replay(load(folder, name, counter), args.window, counter) for name in CONVERSATIONS]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"{'conversation':58} {'dialect':16} {'reqs':>5} {'over':>4} {'bad':>3} "
        f"{'cond':>4} {'refd':>4} {'max after':>9} {'half trig':>9} {'summary tokens':>15}"
    )
    for row in results:
        sizes = [item["tokens"] for item in row["summaries"]]
        span = f"{min(sizes)}-{max(sizes)}" if sizes else "-"
        print(
            f"{row['conversation'][:58]:58} {row['dialect']:16} {row['requests']:5} "
            f"{row['over_window']:4} {row['refused_views']:3} {row['condenses']:4} "
            f"{row['condenses_refused']:4} {row['max_view_after']:9,} "
            f"{row['trigger'] // 2:9,} {span:>15}"
        )


if __name__ == "__main__":
    main()
