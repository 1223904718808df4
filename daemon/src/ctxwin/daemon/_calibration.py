"""A task's calibration: how many tokens its model reports per token the daemon estimates.

Each ``prepare_request`` that asks for estimates answers with the estimate of
its view; the next request's ``previous_request`` reports what the provider
counted for that view, and the ratio of the two moves the task's
:class:`ctxwin.engine.Calibration`. The calibration is the task's, not its
kept history's: it lives as long as the task's actor (its
:class:`~._session.TaskSession`), survives the history's eviction from the
cache, and is stored with the task (``TaskExtras.calibration``).
"""

from __future__ import annotations

from typing import Any

from ctxwin import engine, proto

__all__ = ["TaskCalibration"]


class TaskCalibration:
    """One task's calibration, and the estimate the next report is measured against."""

    def __init__(self) -> None:
        self.value = engine.Calibration()
        self._estimate: tuple[int, float] | None = None  # (estimate, ratio) of the last view
        self._calibrated_by: tuple[Any, ...] | None = None  # the report folded in last

    @property
    def ratio(self) -> float:
        """Reported over estimated tokens (1.0 before the first sample)."""
        return self.value.ratio

    @property
    def samples(self) -> int:
        """How many reports were folded in."""
        return self.value.samples

    def restore(self, stored: tuple[float, int] | None) -> None:
        """Take the calibration the task was stored with (:meth:`stored`), if any.

        The ratio is kept within the bounds its updates keep it to: a stored
        1e308 made every estimate overflow (``prepare_request`` answered
        ``internal``).
        """
        if stored is None:
            return
        value = self.value
        ratio, value.samples = stored
        value.ratio = min(max(ratio, value.low), value.high)

    def stored(self) -> tuple[float, int] | None:
        """``(ratio, samples)`` as the task is stored with it; None before the first sample."""
        value = self.value
        return (value.ratio, value.samples) if value.samples else None

    def wire(self) -> dict[str, Any]:
        """The calibration as ``inspect`` answers it."""
        return {"ratio": self.value.ratio, "samples": self.value.samples}

    def forget_estimate(self) -> None:
        """A ``prepare_request`` is under way: the next report is of its view, and calibrates
        only against that view's estimate (:meth:`note_estimate`)."""
        self._estimate = None

    def note_estimate(self, result: dict[str, Any]) -> None:
        """Keep the estimate of the view a request answered with, if it made one."""
        if "estimated_tokens" in result:
            self._estimate = (result["estimated_tokens"], self.value.ratio)

    def calibrate(self, usage: dict[str, Any] | None) -> None:
        """Fold a reported usage into the ratio, against the estimate of that request's view."""
        if usage is None or self._estimate is None:
            return
        key = tuple(usage.get(field) for field in ("ts", *proto.USAGE_FIELDS))
        if key == self._calibrated_by:
            return  # the same report again (a retried call): counted once
        self._calibrated_by = key
        estimate, ratio = self._estimate
        real = sum(usage.get(field) or 0 for field in ("tokens_in", "cache_writes", "cache_reads"))
        self.value.update(real, round(estimate / ratio))
