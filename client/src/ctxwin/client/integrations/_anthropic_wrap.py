"""``wrap`` for the Anthropic SDK: picks the blocking or the asyncio twin by the client."""

from __future__ import annotations

from typing import TypeVar, Unpack

import anthropic

from ._anthropic import DIALECT
from ._async_anthropic import wrap_async
from ._sync_anthropic import wrap_sync
from ._window import WindowOptions
from ._window_args import WindowArgs, takes_window_args

__all__ = ["wrap"]

C = TypeVar("C", anthropic.Anthropic, anthropic.AsyncAnthropic)


@takes_window_args
def wrap(
    client: C,
    *,
    summary_model: str | None = None,
    **options: Unpack[WindowArgs],
) -> C:
    """An Anthropic client whose requests send ctxwin's view instead of the full history.

    ``messages.create`` (streaming included) and ``messages.stream`` of the
    returned client send the ``messages`` they are given to ctxwin (dialect
    ``anthropic``) with the previous request's usage and send the view it
    gets back; ``system`` and every other argument pass through. The
    response's usage (``input_tokens``, ``cache_creation_input_tokens``,
    ``cache_read_input_tokens``, ``output_tokens``; from the stream's events
    when streaming) is kept for the next turn. When the API answers that the
    prompt is too long, ctxwin compacts the task and the request is sent once
    more. Keep appending to your own full history as before
    (``{"role": "assistant", "content": response.content}`` may hold the SDK's
    block objects). ``with_options`` keeps the wrapping. Each request carries
    ``cache_control`` breakpoints (at most 4 with the caller's own) where
    ctxwin's cost model counts the prompt cache: the last block, the end of
    the longest prefix an earlier request wrote, the first pair
    (docs/PRICING.md, "What the adapters send").

    Args:
        client: an ``anthropic.Anthropic`` or ``anthropic.AsyncAnthropic`` client.
            It is copied (``with_options()``); the original stays as it was.
        task: the ctxwin task id for every conversation of this client; None
            derives one per conversation from its ``system`` and first message
            (``anthropic-<digest>``), stable across restarts.
        summaries: ``"model"``: when a summary is due (the last request used
            0.75 of the window), the model is asked for one with this client
            (the view it saw and an instruction; tools not called) and
            ctxwin cuts the turns it stands for; ``"basic"``: ctxwin writes
            the summary itself; None: cut without one (docs/SUMMARIES.md).
        summary_model: the model asked for summaries (default: the call's).

    Returns:
        The wrapped copy, of the same type as ``client``.
    """
    copy = client.with_options()
    window_options = WindowOptions(DIALECT, DIALECT, summary_model=summary_model, **options)
    if isinstance(copy, anthropic.AsyncAnthropic):
        return wrap_async(copy, window_options.async_window(copy))
    return wrap_sync(copy, window_options.window(copy))
