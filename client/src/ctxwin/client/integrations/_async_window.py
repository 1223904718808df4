"""The asyncio window; ``_sync_window.py`` is generated from this file.

Edit this file, then run ``python3 client/scripts/generate.py`` (a test fails
while the generated twin is stale). What both windows share is
:class:`~._window_base.WindowBase`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from ctxwin.proto import Model, Usage

from .._async import AsyncClient
from .._async_task import AsyncTask
from ._conversations import Request, Turn
from ._summary import AsyncSummarize, note_condensed, summary_failed
from ._window_base import DEFAULT_STRATEGY, WindowBase, is_window_error

__all__ = ["AsyncWindow"]

R = TypeVar("R")


class AsyncWindow(WindowBase):
    """The asyncio twin: one client of the daemon, one task per conversation.

    Args:
        task: the task id for every conversation, or None to derive one per
            conversation from its head (:func:`derive_task_id`).
        prefix: the prefix of derived task ids.
        dialect: the message dialect of the tasks (None: the daemon's default).
        context_window: the model's window in tokens, or None for the model's
            known one (else the daemon's default).
        client: the ctxwin client to use, or None to make one for ``endpoint``.
        endpoint: where the daemon listens (default: as :class:`AsyncClient` finds it).
        on_turn: called with each :class:`Turn` once its answer is in.
        ephemeral: keep the tasks in the daemon's memory only.
        strategy: the strategy of every request (``auto``; ``default`` is SPEC.md's).
        pricing: the price sheet (a name or multipliers), or None for the
            model's, else the wrapped provider's (docs/PRICING.md).
        summaries: ``model`` to have the model summarise the turns a cut
            removes when a summary is due, ``basic`` for ctxwin's own summary,
            None to cut without one (docs/SUMMARIES.md).
        summary_model: the model asked for summaries (default: the request's).
    """

    def __init__(
        self,
        *,
        task: str | None,
        prefix: str,
        dialect: str | None,
        context_window: int | None = None,
        client: AsyncClient | None = None,
        endpoint: str | None = None,
        on_turn: Callable[[Turn], None] | None = None,
        ephemeral: bool = False,
        strategy: str = DEFAULT_STRATEGY,
        pricing: Any = None,
        summaries: str | None = None,
        summary_model: str | None = None,
    ) -> None:
        self._settings(strategy, pricing, summaries, summary_model)
        self.client = client if client is not None else AsyncClient(endpoint)
        self._own_client = client is None
        self._start(task, prefix, dialect, context_window, on_turn, ephemeral, self._open)

    def _open(self, task: str) -> AsyncTask:
        return self.client.task(task, **self._options)

    async def begin(
        self,
        messages: Sequence[Any],
        model: str,
        head: Sequence[Any] = (),
        summarize: AsyncSummarize | None = None,
    ) -> Request:
        """Ask the daemon which messages to send for this request.

        When a summary is due, ``summarize`` sends the summary request (the
        view as the model saw it, and the instruction) and the answer is
        stored with ``condense``; a failing or useless one falls back to the
        basic summary. The request then sends the view after it.

        Args:
            messages: the caller's full history, in the window's dialect.
            model: the request's model id.
            head: what identifies the conversation when the task id is derived.
            summarize: sends a summary request with the caller's client.

        Returns:
            The request, whose ``view`` is what to send.
        """
        task, entry = self.state.entry(head)
        ts = int(time.time() * 1000)
        prepared = await entry.handle.prepare_request(
            messages,
            self.state.model(model),
            previous_request=entry.previous,
            **self._budgeting(model),
        )
        request = self.state.request(task, entry, messages, model, prepared, ts)
        if prepared.get("summary_due") and self.summaries is not None:
            call = self._summary_call(request, prepared.get("summary_prompt", ""), summarize)
            await self._condense(request, self.state.model(model), call, summarize)
        return request

    async def _condense(
        self,
        request: Request,
        model: Model,
        call: tuple[list[Any], str] | None,
        summarize: AsyncSummarize | None,
    ) -> None:
        """Store a summary for the turns the cut removes and take the view after it.

        Args:
            request: the request a summary is due before.
            model: the request's model map.
            call: the summary request and its model, or None for the basic summary.
            summarize: sends ``call`` with the caller's client; any failure
                falls back to the basic summary.
        """
        text: str | None = None
        usage: Usage | None = None
        failure: str | None = None
        if call is not None and summarize is not None:
            try:
                text, usage = await summarize(*call)
            except Exception as exc:  # any failure of the summary call: the basic summary
                failure = summary_failed(exc)
        handle = request.conversation.handle
        result = await handle.condense(request.messages, model, summary=text, usage=usage)
        note_condensed(request, result, usage, failure)

    async def send(self, request: Request, call: Callable[[list[Any]], Awaitable[R]]) -> R:
        """``await call(view)``; when the provider refuses it as too long, compact and call once
        more."""
        try:
            return await call(request.view)
        except Exception as exc:
            if request.retried or not is_window_error(exc):
                raise
            await self.compact(request)
            return await call(request.view)

    async def compact(self, request: Request) -> None:
        """After a context-window error: keep a quarter (SPEC.md §8), take the new view."""
        handle = request.conversation.handle
        compacted = await handle.compact(request.messages, "quarter")
        truncated = await handle.truncated_messages(request.messages)
        request.compacted(truncated["messages"], compacted["deleted_range"])

    # unasync: async only
    def close(self) -> None:
        """Close the ctxwin client now, if this window made it."""
        if self._own_client:
            self.client.close()

    # unasync: end
    async def aclose(self) -> None:
        """Close the ctxwin client, if this window made it, waiting for its reader to end."""
        if self._own_client:
            await self.client.aclose()
