"""ctxwin for the OpenAI SDK: ``wrap(client)`` (extra ``openai``)."""

from __future__ import annotations

from ._openai import usage_from_responses, wrap

__all__ = ["usage_from_responses", "wrap"]
