"""Each package's __all__ names exactly what it exports."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

PACKAGES = [
    "ctxwin.proto",
    "ctxwin.engine",
    "ctxwin.client",
    "ctxwin.client.integrations",
    "ctxwin.client.integrations.openai",
    "ctxwin.client.integrations.anthropic",
    "ctxwin.client.integrations.agents",
    "ctxwin.client.integrations.langchain",
    "ctxwin.client.integrations.pydantic_ai",
    "ctxwin.daemon",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_lists_every_public_name_and_nothing_else(name: str) -> None:
    """Every name in __all__ exists and every public attribute is in __all__."""
    module = importlib.import_module(name)
    exported = set(module.__all__) - {"__version__"}
    public = {
        attribute
        for attribute, value in vars(module).items()
        if not attribute.startswith("_")
        and not isinstance(value, ModuleType)
        and attribute != "annotations"
    }
    assert sorted(public) == sorted(exported)
