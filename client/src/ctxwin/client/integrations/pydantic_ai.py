"""ctxwin for Pydantic AI agents: the ``ContextWindow`` capability (extra ``pydantic-ai``)."""

from __future__ import annotations

from ._pydantic_ai import ContextWindow, from_openai_chat, to_openai_chat, usage_from_pydantic_ai

__all__ = ["ContextWindow", "from_openai_chat", "to_openai_chat", "usage_from_pydantic_ai"]
