"""ctxwin for the Anthropic SDK: ``wrap(client)`` (extra ``anthropic``)."""

from __future__ import annotations

from ._anthropic import wrap

__all__ = ["wrap"]
