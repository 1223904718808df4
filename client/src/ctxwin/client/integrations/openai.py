"""ctxwin for the OpenAI SDK: ``wrap(client)`` (extra ``openai``)."""

from ._openai import usage_from_responses
from ._openai_wrap import wrap

__all__ = ["usage_from_responses", "wrap"]
