"""``ctxwin replay --plot``: tokens per turn as a picture (the optional ``plot`` extra)."""

from __future__ import annotations

from pathlib import Path

from .replay import ReplayReport

PLOT_EXTRA = "pip install './client[plot]' (from a checkout of ctxwin), or pip install matplotlib"


def plot_problem(path: Path) -> str | None:
    """Why ``path`` cannot take a plot (checked before a long replay), or None when it can."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        return f"--plot needs matplotlib: {PLOT_EXTRA}"
    if not path.parent.is_dir():
        return f"--plot: no directory {path.parent}"
    formats = FigureCanvasAgg.get_supported_filetypes()
    if path.suffix.lstrip(".").lower() not in formats:
        return f"--plot: {path.name} must end in one of " + ", ".join(
            f".{name}" for name in sorted(formats)
        )
    return None


def plot(report: ReplayReport, path: Path) -> None:
    """Draw reported and estimated tokens per turn, the budget line and every truncation.

    Raises:
        ImportError: matplotlib is missing (:data:`PLOT_EXTRA`).
        OSError: the file cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    turns = [row.turn for row in report.per_turn]
    figure, axes = plt.subplots(figsize=(10, 5))
    axes.plot(turns, [row.estimated for row in report.per_turn], label="estimated (calibrated)")
    reported = [(row.turn, row.reported) for row in report.per_turn if row.reported is not None]
    axes.plot([t for t, _ in reported], [r for _, r in reported], label="reported")
    axes.axhline(report.max_allowed_size, color="red", linestyle="--", label="max allowed")
    cuts = [event.turn for event in report.events if event.kind == "truncation"]
    for index, turn in enumerate(cuts):
        axes.axvline(turn, color="grey", alpha=0.5, label="truncation" if index == 0 else None)
    axes.set_xlabel("turn")
    axes.set_ylabel("input tokens")
    axes.set_title(f"{Path(report.file).name}: {report.model.get('id')}")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
