"""The "Done when" goals of a strategy, checked over the cells of a replay (docs/COST.md).

A cell is a conversation and a window; the goals that depend on the price
sheet are checked under each sheet, so a cell counts once per sheet there
(as the goals are stated: 4 conversations x 3 windows x 2 sheets).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench._cost_columns import READS_SLACK, dominating

Row = Mapping[str, Any]

GEOMEAN_GOAL = 0.65
CACHED_GOAL = 0.90
CALLS_GOAL = 0.95
READS_CELLS_BELOW = 4
READS_FLOOR = 0.10


@dataclass(slots=True)
class Goal:
    """One goal: whether it is met, and the cells that fail it."""

    name: str
    failing: list[str] = field(default_factory=list)
    passed: bool = True
    note: str = ""

    def line(self) -> str:
        """The goal as one line of the summary."""
        verdict = "pass" if self.passed else "FAIL"
        where = f": {', '.join(self.failing)}" if self.failing else ""
        note = f" ({self.note})" if self.note else ""
        return f"  [{verdict}] {self.name}{note}{where}"


def cells_of(rows: Sequence[Row]) -> dict[tuple[str, int], dict[str, Row]]:
    """Rows by (conversation, window), then by strategy."""
    cells: dict[tuple[str, int], dict[str, Row]] = {}
    for row in rows:
        cells.setdefault((row["conversation"], row["window"]), {})[row["strategy"]] = row
    return cells


def cell_name(conversation: str, window: int) -> str:
    """A cell as the summary names it."""
    return f"{conversation} {window // 1000}k"


def geometric_mean(values: Sequence[float]) -> float:
    """The geometric mean of positive ``values`` (NaN for none)."""
    if not values:
        return math.nan
    return math.exp(sum(math.log(v) for v in values) / len(values))


def ratios_where_cline_cuts(
    cells: Mapping[tuple[str, int], Mapping[str, Row]], subject: str, unit: str
) -> list[float]:
    """``subject``/cline cost under ``unit`` over the cells where cline edits the view."""
    return [
        runs[subject][f"cost_{unit}"] / runs["cline"][f"cost_{unit}"]
        for runs in cells.values()
        if subject in runs and "cline" in runs and runs["cline"]["edits"] > 0
    ]


def check(rows: Sequence[Row], units: Sequence[str], subject: str = "auto") -> list[Goal]:
    """Every goal of docs/COST.md's "Done when" for ``subject``, over the cells in ``rows``."""
    cells = {key: runs for key, runs in cells_of(rows).items() if subject in runs}
    goals = {
        "over": Goal("0 requests over the window"),
        "refused": Goal("0 views refused that the history did not cause"),
        "dominated": Goal("never dominated by a feasible alternative"),
        "reads": Goal(
            "latest reads kept >= cline's - 1 pt",
            note=f"at most {READS_CELLS_BELOW} cells below, none by more than 10 pts",
        ),
        "cached": Goal(f"cache-read share >= {CACHED_GOAL:.0%}"),
        "typed": Goal("every instruction typed so far in every view"),
        "calls": Goal(f"own calls visible >= {CALLS_GOAL:.0%}"),
    }
    below: list[tuple[str, float]] = []
    for (conversation, window), runs in sorted(cells.items()):
        row, name = runs[subject], cell_name(conversation, window)
        if row["over"]:
            goals["over"].failing.append(f"{name} ({row['over']})")
        if row["refused"]:
            goals["refused"].failing.append(f"{name} ({row['refused']})")
        for unit in units:
            by = dominating(row, runs.values(), unit)
            if by:
                goals["dominated"].failing.append(f"{name} {unit} by {'/'.join(by)}")
        cline = runs.get("cline")
        if cline is not None:
            gap = cline["latest_read_kept"] - row["latest_read_kept"]
            if gap > READS_SLACK:
                below.extend((f"{name} {unit} (-{gap * 100:.1f} pts)", gap) for unit in units)
        if row["cached_share"] < CACHED_GOAL:
            goals["cached"].failing.append(f"{name} ({row['cached_share']:.3f})")
        if row["typed_worst"] < 1.0:
            goals["typed"].failing.append(f"{name} (worst {row['typed_worst']:.2f})")
        if row["calls_visible"] < CALLS_GOAL:
            goals["calls"].failing.append(f"{name} ({row['calls_visible']:.2f})")
    goals["reads"].failing = [text for text, _ in below]
    goals["reads"].passed = len(below) <= READS_CELLS_BELOW and all(
        gap <= READS_FLOOR for _, gap in below
    )
    for key, goal in goals.items():
        if key != "reads":
            goal.passed = not goal.failing
    result = list(goals.values())
    for unit in units:
        ratios = ratios_where_cline_cuts(cells, subject, unit)
        mean = geometric_mean(ratios)
        goal = Goal(
            f"geometric mean {subject}/cline cost ({unit}) where cline cuts <= {GEOMEAN_GOAL}",
            note=f"{mean:.3f} over {len(ratios)} cells",
        )
        goal.passed = bool(ratios) and mean <= GEOMEAN_GOAL
        if not goal.passed:
            goal.failing = ["no cell where cline cuts"] if not ratios else []
        result.append(goal)
    return result


def summary(rows: Sequence[Row], units: Sequence[str], subject: str = "auto") -> str:
    """The goals as lines: pass or FAIL each, with the failing cells named."""
    goals = check(rows, units, subject)
    met = sum(goal.passed for goal in goals)
    lines = ["", f"goals ({subject}): {met} of {len(goals)} met"]
    lines.extend(goal.line() for goal in goals)
    return "\n".join(lines)
