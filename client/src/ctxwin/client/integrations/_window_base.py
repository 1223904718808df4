"""What every adapter does around one model request, for the blocking and the asyncio twins.

Before the request: pick the conversation's task, send the caller's full history
with the previous request's usage to ``prepare_request`` and get the view to
send instead (when a summary is due, ``_summary.py`` stores one first). If the
provider answers that the request did not fit: ``compact`` (keep a quarter,
SPEC.md §8) and send again, once. After the answer: keep its usage for the
next turn, and report what was done as a :class:`Turn`.

The pure parts (task ids, the model map, the report) live in
:class:`~ctxwin.client.integrations._conversations.Conversations`; this module
holds what both windows share, :class:`WindowBase`. ``AsyncWindow`` is written
once (``_async_window.py``) and ``Window`` generated from it (``_sync_window.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ctxwin.proto import Usage, is_context_window_error, sheet_for_model

from ._conversations import Conversations, Request, Turn
from ._summary import SUMMARY_MODES, summary_request

__all__ = ["DEFAULT_STRATEGY", "WindowBase", "is_window_error", "pricing_for"]

DEFAULT_STRATEGY = "auto"
"""The strategy adapters ask for (docs/STRATEGIES.md)."""

DIALECT_SHEETS = {"anthropic": "anthropic", "gemini": "gemini", "openai-chat": "openai"}
"""The price sheet of the provider a dialect's adapter wraps, when the model id names none."""


def pricing_for(dialect: str | None, model: str, pricing: Any) -> Any:
    """The ``pricing`` a request sends: the window's own, its model's sheet, its provider's."""
    if pricing is not None:
        return pricing
    sheet = sheet_for_model({"id": model})
    if sheet is not None:
        return sheet.name
    if dialect == "openai-responses":
        return "openai"
    return DIALECT_SHEETS.get(dialect or "")


def _plain(value: Any) -> Any:
    """``value`` with only its message-relevant keys: ``type``s dropped, nesting kept."""
    if isinstance(value, Mapping):
        return {
            key: _plain(item)
            for key, item in value.items()
            if key in {"code", "message", "error", "status", "status_code"}
        }
    return value


def is_window_error(error: BaseException) -> bool:
    """Whether a provider's exception says that the request did not fit the model's window.

    Reads the exception's HTTP status (``status_code`` or ``status``), its
    parsed error body (``body``: OpenAI's ``{"code": "context_length_exceeded",
    ...}``, Anthropic's ``{"type": "error", "error": {"type":
    "invalid_request_error", "message": "prompt is too long: ..."}}``) and its
    message, and asks :func:`ctxwin.proto.is_context_window_error`. Error
    *types* are left out: OpenAI marks every bad request
    ``invalid_request_error``, and compacting a conversation for a misspelt
    parameter would lose context for nothing; the code or the wording decides.

    Args:
        error: the exception the SDK or framework raised.

    Returns:
        True when compacting and sending again may help.
    """
    status = getattr(error, "status_code", None)
    if status is None:
        status = getattr(error, "status", None)
    body = getattr(error, "body", None)
    as_map: dict[str, Any] = {"message": str(error)}
    if isinstance(status, int):
        as_map["status"] = status
    if isinstance(body, Mapping):
        as_map["error"] = _plain(body)
    elif isinstance(body, str):
        as_map["detail"] = {"message": body}
    return is_context_window_error(as_map)


def _task_options(dialect: str | None, ephemeral: bool) -> dict[str, Any]:
    options: dict[str, Any] = {"ephemeral": ephemeral}
    if dialect is not None:
        options["dialect"] = dialect
    return options


class WindowBase:
    """What both twins share: the conversations, the finish of a request, the latest turn."""

    state: Conversations
    _options: dict[str, Any]
    strategy: str
    pricing: Any
    summaries: str | None
    summary_model: str | None
    _dialect: str | None

    def _settings(
        self, strategy: str, pricing: Any, summaries: str | None, summary_model: str | None
    ) -> None:
        """Check and keep the request settings (before any client is made)."""
        if summaries is not None and summaries not in SUMMARY_MODES:
            raise ValueError(f"summaries must be one of {', '.join(SUMMARY_MODES)} or None")
        self.strategy = strategy
        self.pricing = pricing
        self.summaries = summaries
        self.summary_model = summary_model

    def _start(
        self,
        task: str | None,
        prefix: str,
        dialect: str | None,
        context_window: int | None,
        on_turn: Callable[[Turn], None] | None,
        ephemeral: bool,
        open_task: Callable[[str], Any],
    ) -> None:
        self._options = _task_options(dialect, ephemeral)
        self._dialect = dialect
        self.state = Conversations(
            task, prefix, dialect, context_window, on_turn, ephemeral, open_task
        )
        if task is not None:
            self.state.entry(())  # a wrong task id fails here, not on the first request

    def _budgeting(self, model: str) -> dict[str, Any]:
        """The strategy arguments of a request to ``model``."""
        args: dict[str, Any] = {"proactive": True, "strategy": self.strategy}
        pricing = pricing_for(self._dialect, model, self.pricing)
        if pricing is not None:
            args["pricing"] = pricing
        if self.summaries is not None:
            # Cut by summary: prepare_request says when one is due (docs/SUMMARIES.md).
            args["use_auto_condense"] = True
            args["summaries"] = True
        return args

    def _summary_call(
        self, request: Request, prompt: str, summarize: object
    ) -> tuple[list[Any], str] | None:
        """The summary request to send and its model, or None: the basic summary it is."""
        if self.summaries != "model" or not summarize:
            return None
        return (
            summary_request(self._dialect, request.view, prompt),
            self.summary_model or request.model,
        )

    def finish(self, request: Request, usage: Usage | None) -> Turn:
        """Record the request's usage for the next turn and report it."""
        return self.state.finish(request, usage)

    def last(self, task: str | None = None) -> Turn | None:
        """The latest turn of ``task`` (default: of the conversation used last)."""
        return self.state.last(task)
