"""An agent middleware for LangChain v1: ctxwin's view as each model call's messages."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Unpack

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from ctxwin.proto import Usage

from ._cache_hints import prompt_cache_key
from ._conversations import Request
from ._mapping import Converted, convert, origins, text_of
from ._window import AsyncWindow, Window, WindowOptions
from ._window_args import WindowArgs, takes_window_args

__all__ = ["ContextWindowMiddleware", "from_openai_chat", "to_openai_chat", "usage_from_langchain"]

DIALECT = "openai-chat"
PREFIX = "langchain"


def _content(content: Any) -> Any:
    """LangChain content as Chat Completions content: a string, or a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return [
            {"type": "text", "text": part} if isinstance(part, str) else part for part in content
        ]
    return str(content)


def to_openai_chat(message: BaseMessage) -> dict[str, Any]:
    """One LangChain message as a Chat Completions message.

    Args:
        message: a human, AI, tool or system message.

    Returns:
        The ``openai-chat`` dialect message (``tool_calls`` with JSON arguments,
        ``role: "tool"`` results).
    """
    if isinstance(message, AIMessage):
        out: dict[str, Any] = {"role": "assistant", "content": _content(message.content) or None}
        if message.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.get("id") or "",
                    "type": "function",
                    "function": {
                        "name": call["name"],
                        "arguments": json.dumps(call.get("args") or {}, separators=(",", ":")),
                    },
                }
                for call in message.tool_calls
            ]
        return out
    if isinstance(message, ToolMessage):
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id,
            "content": _content(message.content),
        }
    if isinstance(message, SystemMessage):
        return {"role": "system", "content": _content(message.content)}
    return {"role": "user", "content": _content(message.content)}


def _with_content(original: BaseMessage, content: Any) -> BaseMessage:
    if content is None:
        content = ""
    return original.model_copy(update={"content": content})


def from_openai_chat(view: Sequence[Any], converted: Converted[BaseMessage]) -> list[AnyMessage]:
    """The view as LangChain messages: untouched ones are the original objects.

    A message ctxwin changed (a notice written into it) is a copy of its
    original with the new content; a tool result it filled in for a call
    left without one is a new :class:`ToolMessage`.

    Args:
        view: the ``openai-chat`` view.
        converted: the history as it was sent (:func:`to_openai_chat` of each).

    Returns:
        The messages to send.
    """
    out: list[AnyMessage] = []
    for message, index in zip(view, origins(view, converted), strict=True):
        if index is None:
            if message.get("role") == "tool":
                out.append(
                    ToolMessage(
                        content=text_of(message.get("content")) or "",
                        tool_call_id=str(message.get("tool_call_id")),
                    )
                )
            else:
                out.append(HumanMessage(content=text_of(message.get("content")) or ""))
            continue
        original = converted.sources[converted.origin[index].message]
        if message is converted.messages[index]:
            out.append(original)  # type: ignore[arg-type]  # every source is an AnyMessage
        else:
            out.append(_with_content(original, message.get("content")))  # type: ignore[arg-type]
    return out


def usage_from_langchain(message: Any) -> Usage | None:
    """The usage an AI message reports (``usage_metadata``), or None.

    LangChain counts ``input_tokens`` with the cached part included; it is
    split into ``tokens_in``, ``cache_reads`` and ``cache_writes``.

    Args:
        message: an ``AIMessage`` (anything else gives None).

    Returns:
        The wire ``usage`` map, or None.
    """
    metadata = getattr(message, "usage_metadata", None)
    if not isinstance(metadata, Mapping):
        return None
    details = metadata.get("input_token_details") or {}
    total = int(metadata.get("input_tokens") or 0)
    reads = int(details.get("cache_read") or 0)
    writes = int(details.get("cache_creation") or 0)
    return Usage(
        tokens_in=max(0, total - reads - writes),
        tokens_out=int(metadata.get("output_tokens") or 0),
        cache_writes=writes,
        cache_reads=reads,
    )


def _model_id(request: ModelRequest[Any]) -> str:
    model = request.model
    for name in ("model_name", "model", "model_id"):
        value = getattr(model, name, None)
        if isinstance(value, str):
            return value
    return type(model).__name__


def _openai_chat_model(model: object) -> bool:
    """Whether ``model`` is ``langchain_openai``'s ChatOpenAI (Azure's aside)."""
    try:
        from langchain_openai import AzureChatOpenAI, ChatOpenAI
    except ImportError:  # the optional package is not installed: no such model
        return False
    return isinstance(model, ChatOpenAI) and not isinstance(model, AzureChatOpenAI)


def _cache_settings(request: ModelRequest[Any], task: str) -> dict[str, Any]:
    """The request's model settings, with the task's ``prompt_cache_key`` for an OpenAI
    model that has none (docs/PRICING.md, "What the adapters send")."""
    settings = dict(request.model_settings)
    model_kwargs = getattr(request.model, "model_kwargs", None) or {}
    if (
        _openai_chat_model(request.model)
        and "prompt_cache_key" not in settings
        and "prompt_cache_key" not in model_kwargs
    ):
        settings["prompt_cache_key"] = prompt_cache_key(task)
    return settings


def _thread(request: ModelRequest[Any]) -> str | None:
    """The run's ``thread_id``, when it has one (a checkpointed conversation)."""
    try:
        from langgraph.config import get_config

        configurable = get_config().get("configurable") or {}
    except RuntimeError:  # not inside a runnable context
        return None
    thread = configurable.get("thread_id")
    return str(thread) if thread is not None else None


def _summary_messages(
    request: ModelRequest[Any], view: list[Any], converted: Converted[BaseMessage]
) -> list[BaseMessage]:
    """A summary request's messages: the system prompt, then the view with the instruction."""
    messages: list[BaseMessage] = list(from_openai_chat(view, converted))
    system = request.system_message
    return [system, *messages] if system is not None else messages


def _viewed(
    request: ModelRequest[Any], converted: Converted[BaseMessage], view: list[Any], pending: Request
) -> ModelRequest[Any]:
    """The model request with the view for its messages, and the task's cache settings."""
    return request.override(
        messages=from_openai_chat(view, converted),
        model_settings=_cache_settings(request, pending.task),
    )


def _summary(answer: Any) -> tuple[str | None, Usage | None]:
    """The text and usage of the model's answer to a summary request."""
    content = getattr(answer, "content", None)
    if isinstance(content, list):
        content = "".join(
            part.get("text", "") if isinstance(part, Mapping) else str(part) for part in content
        )
    return (content if isinstance(content, str) else None), usage_from_langchain(answer)


@takes_window_args
class ContextWindowMiddleware(AgentMiddleware):
    """Sends ctxwin's view of the agent's messages to the model, and retries once when too long.

    ``wrap_model_call`` (and ``awrap_model_call``) override the request's
    messages with the view (dialect ``openai-chat``: LangChain messages map to
    Chat Completions messages and back); the agent's state keeps the full
    history, so a checkpoint can be restored. The usage of each answer is fed
    to the next call, and when the provider refuses a request as too long
    ctxwin compacts the task and the model is called once more. A
    ``ChatOpenAI`` model's calls carry the task's ``prompt_cache_key``
    (docs/PRICING.md, "What the adapters send").

    Args:
        task: the ctxwin task id; None derives one per conversation: from the
            run's ``thread_id`` when it has one, else from the system prompt and
            the first message (``langchain-<digest>``).
        summaries: ``"model"``: when a summary is due, the request's own model
            is asked for one (the system prompt, the messages it last saw and
            an instruction) and ctxwin cuts the turns it stands for;
            ``"basic"``: ctxwin writes the summary itself; None: cut without
            one (docs/SUMMARIES.md).
    """

    def __init__(
        self,
        **options: Unpack[WindowArgs],
    ) -> None:
        super().__init__()
        self._options = WindowOptions(PREFIX, DIALECT, **options)
        self._sync: Window | None = None
        self._async: AsyncWindow | None = None
        self._memo: dict[int, tuple[Any, list[tuple[int, dict[str, Any]]]]] = {}

    @property
    def _ctxwin_window(self) -> Window | AsyncWindow | None:
        return self._async or self._sync

    def _window(self) -> Window:
        if self._sync is None:
            self._sync = self._options.window(self)
        return self._sync

    def _async_window(self) -> AsyncWindow:
        if self._async is None:
            self._async = self._options.async_window(self)
        return self._async

    def _convert(self, request: ModelRequest[Any]) -> tuple[Converted[BaseMessage], list[Any]]:
        converted: Converted[BaseMessage] = convert(
            list[BaseMessage](request.messages),
            lambda message: [(0, to_openai_chat(message))],
            self._memo,
        )
        thread = _thread(request)
        if thread is not None:
            head: list[Any] = [thread]
        else:
            system = request.system_message
            head = [to_openai_chat(system) if system is not None else None]
            head += converted.messages[:1]
        return converted, head

    @staticmethod
    def _answer_usage(response: Any) -> Usage | None:
        result = getattr(response, "result", None)
        messages = result if isinstance(result, list) else [response]
        for message in messages:
            usage = usage_from_langchain(message)
            if usage is not None:
                return usage
        return None

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> Any:
        """Call the model with the view; on a context-window error compact and call once more."""
        window = self._window()
        converted, head = self._convert(request)

        def summarize(view: list[Any], model: str) -> tuple[str | None, Usage | None]:
            return _summary(request.model.invoke(_summary_messages(request, view, converted)))

        pending = window.begin(converted.messages, _model_id(request), head, summarize)

        def call(view: list[Any]) -> ModelResponse[Any]:
            return handler(_viewed(request, converted, view, pending))

        response = window.send(pending, call)
        window.finish(pending, self._answer_usage(response))
        return response

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> Any:
        """The asyncio twin of :meth:`wrap_model_call`."""
        window = self._async_window()
        converted, head = self._convert(request)

        async def summarize(view: list[Any], model: str) -> tuple[str | None, Usage | None]:
            messages = _summary_messages(request, view, converted)
            return _summary(await request.model.ainvoke(messages))

        pending = await window.begin(converted.messages, _model_id(request), head, summarize)

        async def call(view: list[Any]) -> ModelResponse[Any]:
            return await handler(_viewed(request, converted, view, pending))

        response = await window.send(pending, call)
        window.finish(pending, self._answer_usage(response))
        return response
