"""Every property test runs the same on a loaded machine as on an idle one."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck

TESTS = Path(__file__).resolve().parent


def _property_tests() -> Iterator[tuple[str, Any]]:
    """(name, test) for each @given test in the suite's modules, methods included."""
    for path in sorted(TESTS.glob("test_*.py")):
        try:
            module = importlib.import_module(f"tests.{path.stem}")
        except pytest.skip.Exception:
            continue
        for name, value in vars(module).items():
            members = [(name, value)]
            if inspect.isclass(value):
                members = [(f"{name}.{n}", v) for n, v in vars(value).items()]
            for qualified, member in members:
                if callable(member) and hasattr(member, "hypothesis"):
                    yield f"{path.stem}::{qualified}", member


def test_no_property_test_depends_on_the_machine_being_idle() -> None:
    """Each @given test has no deadline and ignores how slowly its inputs are generated."""
    found = dict(_property_tests())
    assert len(found) >= 20  # the walk sees the suite's property tests, not none of them
    load_dependent = {
        name: (used.deadline, sorted(check.name for check in used.suppress_health_check))
        for name, test in found.items()
        if (used := test._hypothesis_internal_use_settings).deadline is not None
        or HealthCheck.too_slow not in used.suppress_health_check
    }
    assert {} == load_dependent
