"""ctxwin for the Anthropic SDK: ``wrap(client)`` (extra ``anthropic``)."""

from ._anthropic_wrap import wrap

__all__ = ["wrap"]
