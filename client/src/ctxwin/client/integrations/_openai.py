"""What the asyncio OpenAI adapter and its generated blocking twin share: conversation
heads, usage (Chat Completions and Responses), chat stream options, summary arguments, cache keys.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import openai

from ctxwin.proto import Usage

from .._usage import usage_from_openai
from ._cache_hints import prompt_cache_key
from ._conversations import Request
from ._plain import Plain
from ._window import AsyncWindow, Window, answered

__all__ = [
    "CHAT_DIALECT",
    "Calls",
    "cache_keyed",
    "chat_summary",
    "managed_responses",
    "responses_summary",
    "summary_kwargs",
    "usage_from_responses",
]

CHAT_DIALECT = "openai-chat"
RESPONSES_SUFFIX = "-responses"
"""Added to a given task id for the task of ``responses.create`` calls (``task-responses``)."""
RESPONSES_DIALECT = "openai-responses"


def usage_from_responses(usage: Any, *, ts: int | None = None) -> Usage:
    """Usage from a Responses API report (``input_tokens`` includes the cached part).

    Args:
        usage: the response's ``usage`` (object or map) or None.
        ts: when the request was made (ms since the epoch), if known.

    Returns:
        The wire ``usage`` map.
    """

    def get(source: Any, name: str) -> Any:
        if isinstance(source, Mapping):
            return source.get(name)
        return getattr(source, name, None)

    def count(value: Any) -> int:
        return max(0, value) if isinstance(value, int) and not isinstance(value, bool) else 0

    prompt = count(get(usage, "input_tokens"))
    cached = min(prompt, count(get(get(usage, "input_tokens_details"), "cached_tokens")))
    result = Usage(
        tokens_in=prompt - cached,
        tokens_out=count(get(usage, "output_tokens")),
        cache_writes=0,
        cache_reads=cached,
    )
    if ts is not None:
        result["ts"] = ts
    return result


def _chat_head(messages: Sequence[Any]) -> list[Any]:
    """System/developer messages and the first user message: what names a conversation."""
    head: list[Any] = []
    for message in messages:
        head.append(message)
        if isinstance(message, Mapping) and message.get("role") == "user":
            break
    return head


def _responses_head(instructions: Any, items: Sequence[Any]) -> list[Any]:
    head: list[Any] = [instructions if isinstance(instructions, str) else None]
    for item in items:
        head.append(item)
        if isinstance(item, Mapping) and item.get("role") == "user":
            break
    return head


def _chat_watch(hide_usage: bool) -> Callable[[dict[str, Any]], Callable[[Any], bool]]:
    def watch(seen: dict[str, Any]) -> Callable[[Any], bool]:
        def see(chunk: Any) -> bool:
            usage = getattr(chunk, "usage", None)
            if usage is not None:
                seen["usage"] = usage
                if hide_usage and not getattr(chunk, "choices", None):
                    return False  # the usage chunk ctxwin asked for; the caller did not
            return True

        return see

    return watch


def _responses_watch(seen: dict[str, Any]) -> Callable[[Any], bool]:
    def see(event: Any) -> bool:
        usage = getattr(getattr(event, "response", None), "usage", None)
        if usage is not None:
            seen["usage"] = usage
        return True

    return see


def _stream_options(kwargs: dict[str, Any]) -> bool:
    """Ask a chat stream for its usage; True when the caller had not (its chunk is hidden)."""
    options = kwargs.get("stream_options")
    if isinstance(options, Mapping) and options.get("include_usage"):
        return False
    kwargs["stream_options"] = {**(options or {}), "include_usage": True}
    return True


def managed_responses(kwargs: Mapping[str, Any]) -> bool:
    """Whether ctxwin can manage this Responses call (a list input, no server-held history)."""
    return (
        isinstance(kwargs.get("input"), list)
        and kwargs.get("previous_response_id") is None
        and kwargs.get("conversation") is None
    )


_NOT_FOR_SUMMARY = ("messages", "input", "model", "stream", "stream_options", "n", "tool_choice")


def summary_kwargs(kwargs: Mapping[str, Any], responses: bool) -> dict[str, Any]:
    """The caller's arguments for a summary request: its tools kept (they are part of the
    cached prefix) but not to be called, no stream."""
    extra = {key: value for key, value in kwargs.items() if key not in _NOT_FOR_SUMMARY}
    extra.pop("response_format" if not responses else "text", None)
    extra.pop("parallel_tool_calls", None)
    if extra.get("tools"):
        extra["tool_choice"] = "none"
    return extra


def chat_summary(response: Any) -> tuple[str | None, Usage | None]:
    choices = getattr(response, "choices", None) or []
    text = getattr(getattr(choices[0], "message", None), "content", None) if choices else None
    return text, _chat_usage(getattr(response, "usage", None))


def responses_summary(response: Any) -> tuple[str | None, Usage | None]:
    return getattr(response, "output_text", None), _responses_usage(
        getattr(response, "usage", None)
    )


def _chat_usage(usage: Any) -> Usage | None:
    return usage_from_openai(usage) if usage is not None else None


def _responses_usage(usage: Any) -> Usage | None:
    return usage_from_responses(usage) if usage is not None else None


class Calls:
    """What both twins do around a call: the view's history, the head, the answer."""

    def __init__(self, window: Window | AsyncWindow) -> None:
        self.chat_window = window
        task = window.state.task
        self.responses_window = type(window)(
            # A task has one dialect: Responses calls get a task of their own.
            task=None if task is None else f"{task}{RESPONSES_SUFFIX}",
            prefix=RESPONSES_DIALECT,
            dialect=RESPONSES_DIALECT,
            context_window=window.state.context_window,
            client=window.client,  # type: ignore[arg-type]  # the twin's own client type
            on_turn=window.state.on_turn,
            ephemeral=window.state.ephemeral,
            summaries=window.summaries,
            summary_model=window.summary_model,
        )
        self._chat_plain, self._responses_plain = Plain(), Plain()

    def chat(self, kwargs: dict[str, Any]) -> tuple[list[Any], str, list[Any], bool, bool]:
        """The history, model and head of a chat call; whether it streams, and hides usage."""
        messages = self._chat_plain(list(kwargs.get("messages", [])))
        streaming = bool(kwargs.get("stream"))
        hide = _stream_options(kwargs) if streaming else False
        return messages, str(kwargs.get("model", "")), _chat_head(messages), streaming, hide

    def responses(self, kwargs: Mapping[str, Any]) -> tuple[list[Any], str, list[Any]]:
        """The input items, model and head of a managed Responses call."""
        items = self._responses_plain(list(kwargs["input"]))
        head = _responses_head(kwargs.get("instructions"), items)
        return items, str(kwargs.get("model", "")), head

    def chat_answer(self, request: Request, result: Any, streaming: bool, hide: bool) -> Any:
        return answered(
            self.chat_window,
            request,
            result,
            streaming=streaming,
            watch=_chat_watch(hide),
            usage=_chat_usage,
        )

    def responses_answer(self, request: Request, result: Any, streaming: bool) -> Any:
        return answered(
            self.responses_window,
            request,
            result,
            streaming=streaming,
            watch=_responses_watch,
            usage=_responses_usage,
        )


def cache_keyed(client: openai.OpenAI | openai.AsyncOpenAI) -> Callable[..., dict[str, Any]]:
    """The call's arguments with ``prompt_cache_key`` for its task (docs/PRICING.md, "What the
    adapters send"): unless the caller gave one, or the client is Azure's."""
    azure = isinstance(client, openai.AzureOpenAI | openai.AsyncAzureOpenAI)

    def keyed(kwargs: Mapping[str, Any], request: Request, **view: Any) -> dict[str, Any]:
        if azure or "prompt_cache_key" in kwargs:
            return {**kwargs, **view}
        return {**kwargs, **view, "prompt_cache_key": prompt_cache_key(request.task)}

    return keyed
