"""Pydantic AI: ctxwin's view as each model request's messages, as an agent capability.

Pydantic AI's history processors replace the run's message history with what
they return (``ctx.messages[:] = ...``), so a processor that returned the view
would make the cut permanent and leave ctxwin a history that shrinks under it.
:class:`ContextWindow` is a capability instead: its ``prepare_model_request``
sets only the request's messages (the run keeps its full history, and
``all_messages()`` returns it), its ``after_model_request`` feeds the
response's usage to the next request, and its ``on_model_request_error``
compacts and asks for one more attempt when the provider refuses a request as
too long.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Sequence
from typing import Any, Unpack, cast

from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import RetryModelRequest
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, ModelRequestContext, ModelRequestParameters
from pydantic_ai.settings import ModelSettings

from ctxwin.proto import Usage

from ._cache_hints import prompt_cache_key
from ._conversations import Request
from ._mapping import Converted, convert, origins, text_of
from ._window import WindowOptions, is_window_error
from ._window_args import WindowArgs, takes_window_args

__all__ = ["ContextWindow", "from_openai_chat", "to_openai_chat", "usage_from_pydantic_ai"]

DIALECT = "openai-chat"
PREFIX = "pydantic-ai"
WHOLE = -1  # the part index of a response's one assistant message


def _user_content(content: Any) -> Any:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for item in content:
        if isinstance(item, str):
            parts.append({"type": "text", "text": item})
        else:  # images, audio, documents: counted by a short stand-in, never sent from here
            parts.append({"type": "text", "text": f"[{type(item).__name__}]"})
    return parts


def _tool_content(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, default=str)


def to_openai_chat(message: ModelMessage) -> list[tuple[int, dict[str, Any]]]:
    """One Pydantic AI message as Chat Completions messages, each with its part index.

    A request becomes one message per part (system, user, tool results,
    retry prompts); a response becomes one assistant message (its text, and
    its tool calls with JSON arguments; thinking parts are not counted).

    Args:
        message: a ``ModelRequest`` or ``ModelResponse``.

    Returns:
        ``[(part index, openai-chat message), ...]``.
    """
    if isinstance(message, ModelResponse):
        texts = [part.content for part in message.parts if isinstance(part, TextPart)]
        out: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
        calls = [part for part in message.parts if isinstance(part, ToolCallPart)]
        if calls:
            out["tool_calls"] = [
                {
                    "id": call.tool_call_id,
                    "type": "function",
                    "function": {"name": call.tool_name, "arguments": call.args_as_json_str()},
                }
                for call in calls
            ]
        elif out["content"] is None:
            out["content"] = ""
        return [(WHOLE, out)]
    converted: list[tuple[int, dict[str, Any]]] = []
    for index, part in enumerate(message.parts):
        if isinstance(part, SystemPromptPart):
            converted.append((index, {"role": "system", "content": part.content}))
        elif isinstance(part, UserPromptPart):
            converted.append((index, {"role": "user", "content": _user_content(part.content)}))
        elif isinstance(part, ToolReturnPart):
            tool = {
                "role": "tool",
                "tool_call_id": part.tool_call_id,
                "content": _tool_content(part.content),
            }
            converted.append((index, tool))
        elif isinstance(part, RetryPromptPart):
            if part.tool_name is not None:
                retry = {
                    "role": "tool",
                    "tool_call_id": part.tool_call_id,
                    "content": part.model_response(),
                }
                converted.append((index, retry))
            else:
                converted.append((index, {"role": "user", "content": part.model_response()}))
    return converted


def _changed_part(part: ModelRequestPart, message: dict[str, Any]) -> ModelRequestPart:
    text = text_of(message.get("content"))
    if text is None:
        return part
    if isinstance(part, SystemPromptPart):
        return dataclasses.replace(part, content=text)
    if isinstance(part, UserPromptPart):
        return dataclasses.replace(part, content=text)
    if isinstance(part, RetryPromptPart):
        return dataclasses.replace(part, content=text)
    if type(part) is ToolReturnPart:  # its subclasses hold typed content: left as they are
        plain: ToolReturnPart[Any] = part
        return dataclasses.replace(plain, content=text)
    return part


def _changed_response(response: ModelResponse, message: dict[str, Any]) -> ModelResponse:
    text = text_of(message.get("content"))
    if text is None:
        return response
    parts = list(response.parts)
    for index, part in enumerate(parts):
        if isinstance(part, TextPart):
            parts[index] = dataclasses.replace(part, content=text)
            parts = [p for i, p in enumerate(parts) if i == index or not isinstance(p, TextPart)]
            break
    else:
        parts.insert(0, TextPart(content=text))
    return dataclasses.replace(response, parts=parts)


def _tool_names(sources: Sequence[ModelMessage]) -> dict[str, str]:
    return {
        part.tool_call_id: part.tool_name
        for message in sources
        if isinstance(message, ModelResponse)
        for part in message.parts
        if isinstance(part, ToolCallPart)
    }


def from_openai_chat(view: Sequence[Any], converted: Converted[ModelMessage]) -> list[ModelMessage]:
    """The view as Pydantic AI messages: untouched ones are the original objects.

    A request that lost some parts (a cut inside it) or had a part changed
    (a notice written into a tool result) is a copy with the parts kept; a
    response whose text changed is a copy with the new text; a tool result
    filled in for a call left without one is a new request part.

    Args:
        view: the ``openai-chat`` view.
        converted: the history as it was sent (:func:`to_openai_chat` of each).

    Returns:
        The messages to send.
    """
    groups: list[tuple[int | None, list[tuple[int | None, Any]]]] = []
    for message, index in zip(view, origins(view, converted), strict=True):
        source = converted.origin[index].message if index is not None else None
        if groups and groups[-1][0] == source and source is not None:
            groups[-1][1].append((index, message))
        else:
            groups.append((source, [(index, message)]))
    names = _tool_names(converted.sources)
    counts = collections.Counter(origin.message for origin in converted.origin)
    out: list[ModelMessage] = []
    for source, members in groups:
        if source is None:
            parts: list[ModelRequestPart] = []
            for _, message in members:
                call = str(message.get("tool_call_id") or "")
                content = text_of(message.get("content")) or ""
                if message.get("role") == "tool":
                    parts.append(
                        ToolReturnPart(
                            tool_name=names.get(call, "unknown"), content=content, tool_call_id=call
                        )
                    )
                else:
                    parts.append(UserPromptPart(content=content))
            out.append(ModelRequest(parts=parts))
            continue
        original = converted.sources[source]
        unchanged = len(members) == counts[source] and all(
            message is converted.messages[index] for index, message in members if index is not None
        )
        if unchanged:
            out.append(original)
        elif isinstance(original, ModelResponse):
            out.append(_changed_response(original, members[0][1]))
        else:
            kept: list[ModelRequestPart] = []
            for index, message in members:
                assert index is not None
                part = original.parts[converted.origin[index].part]
                kept.append(
                    part if message is converted.messages[index] else _changed_part(part, message)
                )
            out.append(dataclasses.replace(original, parts=kept))
    return out


def usage_from_pydantic_ai(usage: Any) -> Usage | None:
    """The usage a Pydantic AI response reports, or None when it reported nothing.

    Its ``input_tokens`` includes the cached parts; they are split out into
    ``cache_reads`` and ``cache_writes``.

    Args:
        usage: a ``RequestUsage``.

    Returns:
        The wire ``usage`` map, or None.
    """
    total = int(getattr(usage, "input_tokens", 0) or 0)
    out = int(getattr(usage, "output_tokens", 0) or 0)
    if not total and not out:
        return None
    reads = int(getattr(usage, "cache_read_tokens", 0) or 0)
    writes = int(getattr(usage, "cache_write_tokens", 0) or 0)
    return Usage(
        tokens_in=max(0, total - reads - writes),
        tokens_out=out,
        cache_writes=writes,
        cache_reads=reads,
    )


def _cache_settings(
    model: Model, settings: ModelSettings | None, task: str
) -> ModelSettings | None:
    """``settings`` with the task's ``openai_prompt_cache_key`` for an OpenAI model that has
    none (docs/PRICING.md, "What the adapters send"); Azure's and other models' as they are."""
    try:
        from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    except ImportError:  # the openai extra is not installed: no such model
        return settings
    if not isinstance(model, OpenAIChatModel | OpenAIResponsesModel) or model.system != "openai":
        return settings
    if settings and "openai_prompt_cache_key" in settings:
        return settings
    return cast(
        ModelSettings, {**(settings or {}), "openai_prompt_cache_key": prompt_cache_key(task)}
    )


@takes_window_args
@dataclasses.dataclass(init=False)
class ContextWindow(AbstractCapability[Any]):
    """``Agent(..., capabilities=[ContextWindow()])``: each model request gets ctxwin's view.

    Args:
        task: the ctxwin task id; None derives one per conversation: from the
            run's ``conversation_id`` when it has one, else from the system
            prompt and the first user message (``pydantic-ai-<digest>``).
        summaries: ``"model"``: when a summary is due, the request's own model
            is asked for one (the messages it last saw, with the system
            prompt, and an instruction; no tools), and ctxwin cuts the turns it
            stands for; ``"basic"``: ctxwin writes the summary itself; None:
            cut without one (docs/SUMMARIES.md).
    """

    def __init__(
        self,
        **options: Unpack[WindowArgs],
    ) -> None:
        window_options = WindowOptions(PREFIX, DIALECT, **options)
        self._ctxwin_window = window_options.async_window(self)
        self._memo: dict[int, tuple[Any, list[tuple[int, dict[str, Any]]]]] = {}
        self._pending: dict[str, tuple[Request, Converted[ModelMessage]]] = {}

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a client and callbacks: not for specs

    def _convert(
        self, ctx: RunContext[Any], messages: list[ModelMessage]
    ) -> tuple[Converted[ModelMessage], list[Any]]:
        converted = convert(messages, to_openai_chat, self._memo)
        if ctx.conversation_id is not None:
            head: list[Any] = [ctx.conversation_id]
        else:
            head = []
            for message in converted.messages:
                head.append(message)
                if message.get("role") == "user":
                    break
        return converted, head

    def _key(self, ctx: RunContext[Any]) -> str:
        return ctx.run_id or ""

    async def view(
        self,
        ctx: RunContext[Any],
        messages: list[ModelMessage],
        model: Model | None = None,
        settings: ModelSettings | None = None,
    ) -> list[ModelMessage]:
        """ctxwin's view of ``messages`` for the next request (it is recorded as pending).

        A summary, when one is due and ``summaries="model"``, is asked of
        ``model`` (default: the run's) with ``settings``.
        """
        window = self._ctxwin_window
        converted, head = self._convert(ctx, messages)
        earlier = self._pending.pop(self._key(ctx), None)
        if earlier is not None:
            window.finish(earlier[0], None)
        asked = model if model is not None else ctx.model

        async def summarize(view: list[Any], name: str) -> tuple[str | None, Usage | None]:
            if not isinstance(asked, Model):
                raise TypeError(f"{type(asked).__name__} cannot be sent a request")
            response = await asked.request(
                from_openai_chat(view, converted), settings, ModelRequestParameters()
            )
            texts = [part.content for part in response.parts if isinstance(part, TextPart)]
            return "\n".join(texts), usage_from_pydantic_ai(response.usage)

        request = await window.begin(converted.messages, asked.model_name, head, summarize)
        self._pending[self._key(ctx)] = (request, converted)
        return from_openai_chat(request.view, converted)

    async def prepare_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        """Send the view: a first attempt asks ctxwin; a retry takes the compacted view."""
        pending = self._pending.get(self._key(ctx))
        if request_context.attempt > 1 and pending is not None and pending[0].retried:
            messages = from_openai_chat(pending[0].view, pending[1])
        else:
            messages = await self.view(
                ctx,
                list(request_context.messages),
                request_context.model,
                request_context.model_settings,
            )
        pending = self._pending.get(self._key(ctx))
        settings = request_context.model_settings
        if pending is not None:
            settings = _cache_settings(request_context.model, settings, pending[0].task)
        return dataclasses.replace(request_context, messages=messages, model_settings=settings)

    async def after_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        response: ModelResponse,
    ) -> ModelResponse:
        """Keep the response's usage for the next request."""
        pending = self._pending.pop(self._key(ctx), None)
        if pending is not None:
            self._ctxwin_window.finish(pending[0], usage_from_pydantic_ai(response.usage))
        return response

    async def on_model_request_error(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        error: Exception,
    ) -> ModelResponse:
        """On the provider's context-window error: compact, and attempt the request once more."""
        pending = self._pending.get(self._key(ctx))
        if pending is None or pending[0].retried or not is_window_error(error):
            raise error
        await self._ctxwin_window.compact(pending[0])
        raise RetryModelRequest()
