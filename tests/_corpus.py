"""The real conversations the tests may replay: a folder outside the repository, or a skip.

The corpus (other people's agent logs) is never copied into the repository: a
test reads it from the folder that the environment variable ``CTXWIN_CORPUS``
names. Without it every such test skips with :data:`REASON`; the shapes those
files hold are covered by the synthetic conversations of ``tests/_shapes.py``,
which always run. In CI (``CTXWIN_CI`` set) a folder that is given but lacks a
file fails instead: the variable was set for these tests to run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

__all__ = ["REASON", "VARIABLE", "corpus_file", "corpus_folder", "corpus_param"]

VARIABLE = "CTXWIN_CORPUS"
REASON = (
    "the real conversations are not in the repository: "
    "set CTXWIN_CORPUS to their folder (README, Tests)"
)
"""Why a test over a real conversation skipped: the same text everywhere."""


def corpus_folder() -> Path | None:
    """The folder ``CTXWIN_CORPUS`` names, or None when it is unset or empty."""
    named = os.environ.get(VARIABLE, "").strip()
    return Path(named).expanduser().resolve() if named else None


def _found(name: str) -> Path | None:
    folder = corpus_folder()
    if folder is None:
        return None
    path = folder / name
    if path.is_file():
        return path
    if os.environ.get("CTXWIN_CI"):
        pytest.fail(f"{VARIABLE}={folder} holds no {name}")
    return None


def corpus_file(name: str) -> Path:
    """The real conversation ``name`` of the corpus folder; skips the test without it."""
    path = _found(name)
    if path is None:
        pytest.skip(REASON)
    return path


def corpus_param(name: str, *values: Any) -> Any:
    """A ``pytest.param`` of the real conversation ``name`` (and ``values``), skipped with
    :data:`REASON` when no corpus folder is given; the test finds the file with
    :func:`corpus_file`."""
    return pytest.param(
        name,
        *values,
        marks=pytest.mark.skipif(corpus_folder() is None, reason=REASON),
        id=f"corpus-{name}",
    )
