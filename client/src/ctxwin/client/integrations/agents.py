"""ctxwin for the OpenAI Agents SDK: ``ContextWindowFilter`` (extra ``agents``)."""

from __future__ import annotations

from ._agents import ContextWindowFilter

__all__ = ["ContextWindowFilter"]
