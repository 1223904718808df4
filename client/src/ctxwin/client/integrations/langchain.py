"""ctxwin for LangChain v1 agents: ``ContextWindowMiddleware`` (extra ``langchain``)."""

from __future__ import annotations

from ._langchain import (
    ContextWindowMiddleware,
    from_openai_chat,
    to_openai_chat,
    usage_from_langchain,
)

__all__ = ["ContextWindowMiddleware", "from_openai_chat", "to_openai_chat", "usage_from_langchain"]
