"""One-line adoption of ctxwin in the SDKs and agent frameworks Python agents use.

Each submodule is an optional extra of ``ctxwin-client`` and imports its SDK
only when it is imported itself; importing ``ctxwin.client`` (or this package)
imports none of them.

- :mod:`ctxwin.client.integrations.openai` (``pip install 'ctxwin-client[openai]'``):
  ``wrap(OpenAI())`` for Chat Completions and Responses.
- :mod:`ctxwin.client.integrations.anthropic` (``[anthropic]``): ``wrap(Anthropic())``.
- :mod:`ctxwin.client.integrations.agents` (``[agents]``): a
  ``call_model_input_filter`` for the OpenAI Agents SDK's ``RunConfig``.
- :mod:`ctxwin.client.integrations.langchain` (``[langchain]``): an agent middleware.
- :mod:`ctxwin.client.integrations.pydantic_ai` (``[pydantic-ai]``): a history processor.
"""

from __future__ import annotations

from ._conversations import Turn, derive_task_id
from ._models import KNOWN_CONTEXT_WINDOWS, known_context_window
from ._window import AsyncWindow, Window, is_window_error, window_of

__all__ = [
    "KNOWN_CONTEXT_WINDOWS",
    "AsyncWindow",
    "Turn",
    "Window",
    "derive_task_id",
    "is_window_error",
    "known_context_window",
    "window_of",
]
