"""``wrap`` for the OpenAI SDK: picks the blocking or the asyncio twin by the client."""

from __future__ import annotations

from typing import TypeVar, Unpack

import openai

from ._async_openai import wrap_async
from ._openai import CHAT_DIALECT
from ._sync_openai import wrap_sync
from ._window import WindowOptions
from ._window_args import WindowArgs, takes_window_args

__all__ = ["wrap"]

C = TypeVar("C", openai.OpenAI, openai.AsyncOpenAI)


@takes_window_args
def wrap(
    client: C,
    *,
    summary_model: str | None = None,
    **options: Unpack[WindowArgs],
) -> C:
    """An OpenAI client whose requests send ctxwin's view instead of the full history.

    ``chat.completions.create`` (dialect ``openai-chat``) and
    ``responses.create`` (dialect ``openai-responses``, for a list ``input``
    without ``previous_response_id`` or ``conversation``: a server-held
    history is the server's to manage) of the returned client, streaming
    included: each call sends the history it is given to ctxwin with the
    previous request's usage and sends the view it gets back; the response's
    usage is kept for the next turn (a chat stream is asked for its usage,
    and the extra chunk is kept from the caller unless it asked too); when
    the provider answers that the prompt is too long, ctxwin compacts the
    task and the request is sent once more. Keep appending to your own full
    history as before; response message objects may be appended as they are.
    Other methods are the client's own; ``with_options`` keeps the wrapping.
    Each request carries its task's ``prompt_cache_key`` (unless the caller
    gives one, or the client is Azure's), so the provider routes a task's
    requests to its cached prefix (docs/PRICING.md, "What the adapters send").

    Args:
        client: an ``openai.OpenAI`` or ``openai.AsyncOpenAI`` client (Azure too).
            It is copied (``with_options()``); the original stays as it was.
        task: the ctxwin task id for every conversation of this client
            (``responses.create`` calls use ``<task>-responses``: a task has one
            dialect); None derives one per conversation from its system
            messages and first user message (``openai-chat-<digest>``,
            ``openai-responses-<digest>``), stable across restarts.
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
    dialect = CHAT_DIALECT
    window_options = WindowOptions(dialect, dialect, summary_model=summary_model, **options)
    if isinstance(copy, openai.AsyncOpenAI):
        return wrap_async(copy, window_options.async_window(copy))
    return wrap_sync(copy, window_options.window(copy))
